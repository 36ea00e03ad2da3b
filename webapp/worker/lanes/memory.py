"""Lanes held in this process only: for a database no other process can open (SQLite in
memory), where the in-process set is the whole truth."""

from __future__ import annotations

from .base import Lane, LaneLocks


class ProcessLaneLocks(LaneLocks):
    """Every lane this process does not hold is free."""

    def _try(self, lanes: list[Lane]) -> set[Lane]:
        return set(lanes)

    def _unlock(self, lanes: list[Lane]) -> None:
        return None
