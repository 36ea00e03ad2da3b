"""The dashboard's reads: one module per page, plain data out (dataclasses and dicts), never a
write. Every function takes an engine and plain parameters — ``now`` included, so tests fix
the clock — and reads through :func:`webapp.db.reading`: one snapshot per page, and no lock a
drain pass could wait on (a deferred transaction on SQLite, a read-only one on PostgreSQL).

Speed, at a million rows of which 95% are sent: nothing counts the sent rows on a poll. What
is *not* sent is small and read through partial indexes (``ix_outbox_unsent`` and friends,
migration 0002); events in flight are in none of those but ``ix_outbox_processing_deadline``
(migration 0005), so a read that counts them adds them from there
(:data:`webapp.outbox.sql.IN_FLIGHT_WHERE`); sent events come from the rollups plus the few rows
past their mark (:mod:`webapp.outbox.rollups`), which the folder service keeps fresh.
"""
