# billing-outbox: the dashboard and its in-app drainer in one container.
#
# Configuration is by environment only (see README): DATABASE_URL, SECRET_KEY, STRIPE_API_KEY,
# OUTBOX_*, ... Without DATABASE_URL it uses the embedded SQLite database in /data (mount a
# volume there). On start it migrates the database, then serves on port 8000 with gunicorn.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    BILLING_OUTBOX_INSTANCE_DIR=/data

WORKDIR /app

# A fixed, unprivileged user; it owns only /data (the embedded database and its secret key).
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin app \
    && mkdir /data \
    && chown app:app /data

COPY requirements.lock pyproject.toml README.md ./
COPY webapp ./webapp
COPY templates ./templates
COPY static ./static

# Every dependency from the lock, each file checked against its hash (`make lock` writes it);
# then the package itself, which adds nothing more (--no-deps).
# Editable on purpose: the app finds templates/ and static/ beside its package (the project's
# layout), so the package is used from /app rather than copied into site-packages. pip compiles
# what it installs, not an editable package, and at run time nothing may write /app (nor would,
# with PYTHONDONTWRITEBYTECODE): the package's bytecode is compiled here, once, or every command
# and every gunicorn worker would compile webapp/ from source as it starts.
RUN pip install --no-cache-dir --require-hashes -r requirements.lock \
    && pip install --no-cache-dir --no-deps -e . \
    && python -m compileall -q webapp \
    && python -c "import webapp, flask, sqlalchemy, psycopg, gunicorn, apscheduler, alembic"

# Numeric, so a runtime (e.g. Kubernetes runAsNonRoot) can verify it is not root.
USER 10001:10001

EXPOSE 8000
VOLUME ["/data"]

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]

# exec: gunicorn becomes PID 1 and gets SIGTERM, so workers drain and release their claims.
CMD ["sh", "-c", "billing-outbox db upgrade && exec billing-outbox serve --host 0.0.0.0 --port 8000"]
