"""The dashboard served for real (``billing-outbox serve``, gunicorn) and a headless Chromium,
for the browser tests: each module starts its own stack with these, so the start, the wait
for ``/healthz`` and the clean stop are written once."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import ROOT, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str) -> int:
    """The status ``url`` answers with; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@contextmanager
def served(env: dict[str, str], log_path: Path, *, workers: int = 1) -> Iterator[str]:
    """``billing-outbox serve`` on a free port with ``env``, its output in ``log_path``;
    yields the base address once ``/healthz`` answers; SIGTERM (then a kill) at the end."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                                 "--workers", str(workers)], env=env, cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or http_status(base + "/healthz") == 200, 30,
                 message="gunicorn answers /healthz")
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def chromium() -> Iterator[Any]:
    """One headless Chromium (Debian's binary; never downloaded)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
