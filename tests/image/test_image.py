"""The container image, built and run (``make image-test``, which ``.ci/run`` calls): Debian's
podman (rootful, ``runc``) builds the Dockerfile on a Debian bookworm base made here with
``debootstrap`` (no image registry is reachable from this machine: the pinned default base
cannot be pulled), reaching PyPI the way this machine does (its CA bundle handed to the build
as a secret). Then the image runs: ``/healthz``, uid 10001, the embedded database migrated on
start, the same against the local PostgreSQL, and a clean exit on SIGTERM within the grace
time. Nothing of the build's secrets is left in the image."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, REQUIRE_POSTGRES, ROOT, wait_for
from support.processes import free_port

pytestmark = [pytest.mark.slow]

#: The base made by debootstrap, kept in podman's store between runs (about 40 s to make).
BASE = "localhost/billing-outbox-base:bookworm"
BASE_PACKAGES = "python3.11,python3-venv,python3-pip,ca-certificates,netbase"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
TAG = f"localhost/billing-outbox:image-test-{os.getpid()}"
#: runc, and limits within what this machine's kernel allows a container.
RUNTIME = ["--runtime", "runc", "--ulimit", "nofile=20000:20000",
           "--ulimit", "nproc=32768:32768"]
#: gunicorn's graceful timeout is 30 s; podman's stop waits this long before SIGKILL.
GRACE = 40


def podman(*args: str, timeout: float = 600, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}…: {done.stderr[-3000:]}")
    return done


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


def ensure_base() -> None:
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="image-base-") as tmp:
        root = Path(tmp) / "rootfs"
        made = subprocess.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}",
                               "bookworm", str(root), MIRROR], capture_output=True, text=True,
                              timeout=900)
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (root / leftover).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "--change", 'CMD ["/bin/bash"]', "-",
                                   BASE], stdin=tar.stdout, capture_output=True, text=True,
                                  timeout=600)
        tar.wait(timeout=60)
        assert imported.returncode == 0, imported.stderr[-3000:]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if not shutil.which(tool)]
    if missing:
        reason = f"{', '.join(missing)} not installed (.ci/run installs them)"
        if REQUIRE_POSTGRES:
            pytest.fail(f"REQUIRE_POSTGRES=1 (as in CI) but {reason}")
        pytest.skip(reason)
    ensure_base()
    ca = next(c for c in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                           "/etc/ssl/certs/ca-certificates.crt") if c and Path(c).is_file())
    with tempfile.TemporaryDirectory(prefix="image-build-") as tmp:
        conf = Path(tmp) / "pip.conf"
        index = os.environ.get("PIP_INDEX_URL")
        conf.write_text("[global]\ncert = /run/secrets/pip-ca\n"
                        + (f"index-url = {index}\n" if index else ""))
        started = time.monotonic()
        podman("build", "--format", "docker", "--network", "host", *RUNTIME,
               "--build-arg", f"BASE={BASE}", "--secret", f"id=pip.conf,src={conf}",
               "--secret", f"id=pip-ca,src={ca}", "-t", TAG, str(ROOT), timeout=900)
        print(f"image built in {time.monotonic() - started:.0f} s")
    try:
        yield TAG
    finally:
        podman("rmi", "-f", TAG, check=False)


class Container:
    """One running container of the image; its id, logs, exec and a timed stop."""

    def __init__(self, image: str, *options: str) -> None:
        self.id = podman("run", "-d", *RUNTIME, "--health-interval=disable", *options,
                         image).stdout.strip().splitlines()[-1]

    def exec(self, *command: str) -> str:
        return podman("exec", self.id, *command).stdout.strip()

    def logs(self) -> str:
        done = podman("logs", self.id, check=False)
        return done.stdout + done.stderr

    def inspect(self) -> Any:
        return json.loads(podman("inspect", self.id).stdout)[0]

    def stop(self) -> tuple[int, float]:
        """SIGTERM, waiting up to ``GRACE`` s: (exit code, seconds it took)."""
        started = time.monotonic()
        podman("stop", "-t", str(GRACE), self.id, timeout=GRACE + 30)
        took = time.monotonic() - started
        return int(self.inspect()["State"]["ExitCode"]), took

    def remove(self) -> None:
        podman("rm", "-f", self.id, check=False)


def test_the_image_as_built(image: str) -> None:
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "10001:10001"
    assert "8000/tcp" in config["ExposedPorts"]
    assert "/healthz" in " ".join(inspected["Healthcheck"]["Test"])  # kept: --format docker
    assert "db upgrade" in " ".join(config["Cmd"])
    # The package is installed, not used from a copy of the sources; nothing of the build
    # (its tree, pip's configuration, the CA bundle it was handed) stays in the image.
    out = podman("run", "--rm", *RUNTIME, "--health-interval=disable", image, "sh", "-c",
                 "python -c 'import webapp; print(webapp.__file__)'; "
                 "test ! -e /build && test ! -e /etc/pip.conf && test ! -s /run/secrets/pip-ca"
                 " && ls /opt/billing-outbox/lib/python3.11/site-packages/webapp/templates "
                 "/opt/billing-outbox/lib/python3.11/site-packages/webapp/static && id -u")
    lines = out.stdout.split()
    assert lines[0] == "/opt/billing-outbox/lib/python3.11/site-packages/webapp/__init__.py"
    assert "base.html" in lines and "app.css" in lines
    assert lines[-1] == "10001"


def test_embedded_database_migrated_on_start_and_sigterm(image: str) -> None:
    port = free_port()
    box = Container(image, "-p", f"127.0.0.1:{port}:8000")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(base + "/healthz")[0] == 200, 60,
                 message="the container answers /healthz")
        assert get(base + "/readyz") == (200, '{"status":"ok"}\n'), box.logs()[-3000:]
        assert box.exec("id", "-u") == "10001"
        assert "billing-outbox.sqlite3" in box.exec("ls", "/data").split()
        assert podman("healthcheck", "run", box.id, check=False).returncode == 0
        assert get(base + "/login")[0] == 200
        code, took = box.stop()
        assert code == 0, box.logs()[-3000:]
        assert took < GRACE - 5, f"SIGTERM took {took:.1f} s"
    finally:
        box.remove()


@pytest.fixture
def empty_schema() -> Iterator[str]:
    """A URL whose connections see a new, empty schema of the local PostgreSQL."""
    from urllib.parse import quote

    from sqlalchemy import create_engine, text

    schema = f"image_{os.getpid()}_{secrets.token_hex(3)}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_against_the_local_postgresql(image: str, empty_schema: str) -> None:
    from webapp.db import make_engine
    from webapp.migrate import current_revision, head_revision

    port = free_port()
    pg_url = empty_schema
    engine = make_engine(pg_url)
    assert current_revision(engine) is None
    box = Container(image, "--network", "host", "-e", f"PORT={port}",
                    "-e", f"DATABASE_URL={pg_url}",
                    "-e", f"SECRET_KEY={secrets.token_urlsafe(48)}")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(base + "/healthz")[0] == 200, 60,
                 message="the container answers /healthz")
        assert get(base + "/readyz") == (200, '{"status":"ok"}\n'), box.logs()[-3000:]
        assert current_revision(engine) == head_revision(engine)
        assert box.exec("id", "-u") == "10001"
        code, took = box.stop()
        assert code == 0, box.logs()[-3000:]
        assert took < GRACE - 5, f"SIGTERM took {took:.1f} s"
    finally:
        box.remove()
        engine.dispose()
