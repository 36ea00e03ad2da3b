"""The servers the tests start themselves (PgBouncer, nginx): a free port, the wait until one
listens, and a stop that terminates and then kills."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(proc: subprocess.Popen[bytes], port: int, name: str,
                   log: Callable[[], str], timeout: float = 15) -> None:
    """Until ``proc`` accepts connections on ``port``; raises with its log if it exits or
    does not listen within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen within {timeout:.0f} s: {log()[-2000:]}")


def terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
