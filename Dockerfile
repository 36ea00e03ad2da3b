# billing-outbox: the dashboard and its in-app drainer in one container.
#
# Configuration is by environment only (see README): DATABASE_URL, SECRET_KEY, STRIPE_API_KEY,
# OUTBOX_*, ... Without DATABASE_URL it uses the embedded SQLite database in /data (mount a
# volume there). On start it migrates the database, then serves on port 8000 with gunicorn.
#
# The base is pinned by digest; any base with python3.11 and its venv module builds it too
# (a plain Debian bookworm with python3.11 and python3-venv, for instance):
#   docker build --build-arg BASE=my-registry/python:3.11-slim@sha256:… .
# Behind a proxy that re-signs TLS, or with a private index, hand pip its configuration and CA
# bundle for the build only (secrets are mounted for one step and never stored in a layer):
#   docker build --secret id=pip.conf,src=pip.conf --secret id=pip-ca,src=ca.crt .
# (that pip.conf says `cert = /run/secrets/pip-ca`). docs/deployment.md, "The image".
ARG BASE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    BILLING_OUTBOX_INSTANCE_DIR=/data \
    VIRTUAL_ENV=/opt/billing-outbox \
    PATH=/opt/billing-outbox/bin:$PATH

# A fixed, unprivileged user; it owns only /data (the embedded database and its secret key).
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin app \
    && mkdir /data \
    && chown app:app /data

COPY requirements.lock pyproject.toml README.md /build/
COPY webapp /build/webapp
COPY templates /build/templates
COPY static /build/static

# Its own venv (so the base's Python packages, if any, play no part), then every dependency
# from the lock, each file checked against its hash (`make lock` writes it), setuptools and
# wheel included; then the package itself, built into a wheel by those and installed,
# templates and static files inside it, adding nothing more (--no-deps). The build tree is removed: what runs is the venv alone, compiled
# here once (nothing may write it at run time).
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf,required=false \
    --mount=type=secret,id=pip-ca,required=false \
    python3.11 -m venv "$VIRTUAL_ENV" \
    && pip install --require-hashes -r /build/requirements.lock \
    && pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheel /build \
    && pip install --no-deps /tmp/wheel/billing_outbox-*.whl \
    && rm -rf /build /tmp/wheel \
    && python -m compileall -q "$VIRTUAL_ENV" \
    && python -c "import webapp, flask, sqlalchemy, psycopg, gunicorn, apscheduler, alembic"

# Numeric, so a runtime (e.g. Kubernetes runAsNonRoot) can verify it is not root.
USER 10001:10001
WORKDIR /data

EXPOSE 8000
VOLUME ["/data"]

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), timeout=4).status == 200 else 1)"]

# exec: gunicorn becomes PID 1 and gets SIGTERM, so workers drain and release their claims.
# PORT (8000 unless set) for hosts that choose the port, or a container on the host network.
CMD ["sh", "-c", "billing-outbox db upgrade && exec billing-outbox serve --host 0.0.0.0 --port \"${PORT:-8000}\""]
