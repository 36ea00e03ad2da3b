"""Lanes on SQLite: byte-range locks (``fcntl``) in a file next to the database, one byte per
lane at a 62-bit hash of it. Several processes (the worker, gunicorn workers) may share one
database file; the kernel drops a process's locks when it dies."""

from __future__ import annotations

import fcntl
import logging
import os

from .base import Lane, LaneLocks, lane_key

log = logging.getLogger(__name__)


class FileLaneLocks(LaneLocks):
    """Lanes locked as bytes of ``path`` (``<database>.lanes``)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._fd: int | None = None
        self._fd_pid: int | None = None

    @staticmethod
    def _offset(lane: Lane) -> int:
        return lane_key(lane) & ((1 << 62) - 1)

    def _lock_fd(self) -> int:
        if self._fd is None or self._fd_pid != os.getpid():  # (re)open after a fork
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._fd_pid = os.getpid()
        return self._fd

    def _try(self, lanes: list[Lane]) -> set[Lane]:
        try:
            fd = self._lock_fd()
        except OSError:
            log.exception("lane lock file %s unusable; skipping these lanes for now",
                          self.path)
            return set()
        got: set[Lane] = set()
        for lane in lanes:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._offset(lane))
            except OSError:
                continue  # held by another process
            got.add(lane)
        return got

    def _unlock(self, lanes: list[Lane]) -> None:
        if self._fd is None or self._fd_pid != os.getpid():
            return
        for lane in lanes:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset(lane))
            except OSError:
                log.exception("lane unlock failed")

    def _close(self) -> None:
        if self._fd is not None:
            if self._fd_pid == os.getpid():
                os.close(self._fd)  # releases every lock of this process on the file
            self._fd = None
