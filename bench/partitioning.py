"""The partitioned alternative to the batched DELETE (issue 15), measured on the same rows.
Run by the ``scale`` section (``python -m bench.run --only scale``) on the rows it loaded.

**The copy.** A second schema migrated like the product, whose ``stripe_usage_outbox`` is
replaced by the same columns declared ``PARTITION BY RANGE (created_at)``, in 30-day
partitions aligned to the first row (so the oldest partition holds the very rows the prune
removes; a product would use calendar months), plus two ahead for new rows. The key is
``created_at`` because it never changes: ``updated_at`` moves with every status change, and
a row whose key moves is deleted from one partition and inserted into another. With
``created_at`` a month can go once every row in it is settled and past retention — dead and
rejected rows would first have to move out (to a table kept for them), or hold the month.

The product's indexes are created on the partitioned table (one per partition), then the
rows are copied (``INSERT … SELECT`` in id order): the write path of the product table's
load, so the sizes compare. Every product index is kept, with one change forced by
PostgreSQL: **a unique index on a partitioned table must contain the partition key**, so
the primary key becomes ``(id, created_at)``, and ``idempotency_key`` and
``stripe_identifier`` are unique only within a ``created_at`` — i.e. not at all across
months. ``enqueue_usage``'s
``ON CONFLICT (idempotency_key) DO NOTHING`` (exactly-once enqueue across retries of the
caller) then has no index to stand on. Keeping it needs a non-partitioned
``outbox_keys (idempotency_key PRIMARY KEY, created_at)`` written in the same transaction
(a second insert and a second unique index on every enqueue, and its own DELETE to prune —
the problem moved, a third of the size) or a key that carries its month (callers would have
to send the same month on a retry: not something the product can promise).

**The measures.** Sizes after the copy; the drain core (``bench/scale_drain.py``) on the
partitioned table alone; the same while the oldest partition is ``DETACH … CONCURRENTLY``-ed
and dropped; then a month of churn (the newest 30 days copied under new keys, as for the
delete design) and the size after.
"""

from __future__ import annotations

import math
import re
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import text

from . import scale_drain
from .common import BenchDatabase, Row

SECTION = "Scale: partitioned alternative"
PART_DAYS = 30
DROP_DELAY = 0.3


class Experiment:
    """The partitioned copy of ``source``'s outbox: ``prepare()``, then ``measure()``."""

    def __init__(self, db: BenchDatabase, admin: Any, *, source: str, log: Any) -> None:
        self.db, self.admin, self.source, self.log = db, admin, source, log
        self.schema = ""
        self.url = ""
        self.engine: Any = None
        self.partitions: list[str] = []
        self.raw: dict[str, Any] = {}

    def prepare(self) -> None:
        """Make the partitioned copy, load it, index it, VACUUM (ANALYZE) it."""
        from webapp.db import make_engine

        self.schema, self.url = self.db.migrated_schema("part")
        self.engine = make_engine(self.url)
        src = self.source
        with self.engine.begin() as conn:
            defs = [r[0] for r in conn.execute(text(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = :s "
                "AND tablename = 'stripe_usage_outbox'"), {"s": src})]
            start = conn.execute(text(
                f'SELECT date_trunc(\'day\', min(created_at)) FROM "{src}".stripe_usage_outbox'
            )).scalar_one()
            end = conn.execute(text(
                f'SELECT max(created_at) FROM "{src}".stripe_usage_outbox')).scalar_one()
            conn.execute(text(f'INSERT INTO billing_tenants SELECT * FROM "{src}".billing_tenants'))
            conn.execute(text("ALTER TABLE stripe_usage_outbox RENAME TO outbox_plain"))
            conn.execute(text("CREATE TABLE stripe_usage_outbox (LIKE outbox_plain INCLUDING "
                              "DEFAULTS) PARTITION BY RANGE (created_at)"))
            conn.execute(text("ALTER SEQUENCE stripe_usage_outbox_id_seq "
                              "OWNED BY stripe_usage_outbox.id"))
            conn.execute(text("DROP TABLE outbox_plain CASCADE"))
            count = math.ceil((end - start) / timedelta(days=PART_DAYS)) + 2
            for k in range(count):
                name = f"stripe_usage_outbox_p{k:02d}"
                lo = (start + k * timedelta(days=PART_DAYS)).isoformat()
                hi = (start + (k + 1) * timedelta(days=PART_DAYS)).isoformat()
                conn.execute(text(f"CREATE TABLE {name} PARTITION OF stripe_usage_outbox "
                                  f"FOR VALUES FROM ('{lo}') TO ('{hi}')"))
                self.partitions.append(name)
        times: dict[str, float] = {}
        # The product's indexes first, then the rows in id order: the write path the
        # product table's load took, so the sizes compare (indexes built after the rows
        # would be packed tighter, about a fifth smaller, whichever the design).
        t0 = time.perf_counter()
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for d in defs:
                conn.execute(text(self.index_def(d)))
        times["indexes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with self.engine.begin() as conn:
            conn.execute(text("SET LOCAL synchronous_commit = off"))
            conn.execute(text(f'INSERT INTO stripe_usage_outbox SELECT * FROM '
                              f'"{src}".stripe_usage_outbox ORDER BY id'))
            conn.execute(text("SELECT setval('stripe_usage_outbox_id_seq', "
                              "(SELECT max(id) FROM stripe_usage_outbox))"))
        times["copy"] = time.perf_counter() - t0
        self.log(f"partition: {len(self.partitions)} partitions, rows copied in "
                 f"{times['copy']:.0f} s")
        t0 = time.perf_counter()
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(text("VACUUM (ANALYZE) stripe_usage_outbox"))
        times["vacuum"] = time.perf_counter() - t0
        self.raw["prepare_seconds"] = times
        self.raw["index_defs"] = [self.index_def(d) for d in defs]
        self.log(f"partition: prepared: {times}")

    def index_def(self, d: str) -> str:
        """A product index rewritten for the partitioned copy: unique ones get the key."""
        d = d.replace(f"{self.source}.stripe_usage_outbox", "stripe_usage_outbox")
        d = d.replace(f'"{self.source}".stripe_usage_outbox', "stripe_usage_outbox")
        if d.startswith("CREATE UNIQUE INDEX"):
            d = re.sub(r"USING btree \(([^)]*)\)", r"USING btree (\1, created_at)", d, count=1)
        return d

    def sizes(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            row = conn.execute(text(
                "SELECT count(*) FILTER (WHERE isleaf), sum(pg_relation_size(relid)), "
                "sum(pg_indexes_size(relid)), sum(pg_total_relation_size(relid)) "
                "FROM pg_partition_tree('stripe_usage_outbox') WHERE isleaf")).one()
            n = conn.execute(text("SELECT count(*) FROM stripe_usage_outbox")).scalar_one()
        return {"partitions": int(row[0]), "heap": int(row[1]), "indexes": int(row[2]),
                "total": int(row[3]), "rows": int(n)}

    def drop_oldest(self) -> dict[str, Any]:
        """DETACH … CONCURRENTLY the oldest partition, then DROP it (autocommit: neither
        may run inside a transaction block)."""
        name = self.partitions.pop(0)
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            n = conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()
            t0 = time.perf_counter()
            conn.execute(text(f"ALTER TABLE stripe_usage_outbox DETACH PARTITION {name} "
                              "CONCURRENTLY"))
            t1 = time.perf_counter()
            conn.execute(text(f"DROP TABLE {name}"))
            t2 = time.perf_counter()
        return {"rows": int(n), "detach_seconds": t1 - t0, "drop_seconds": t2 - t1}

    def measure(self, scale_raw: dict[str, Any]) -> list[Row]:
        """Sizes, drains alone and during the drop, churn; the schema is dropped after."""
        from webapp.models import utcnow

        from .scale import CHURN_COPY, DRAIN_EVENTS, churn_columns, mb, size_note

        out: list[Row] = []
        try:
            s = self.sizes()
            self.raw["sizes"] = s
            digits = 6
            empty = scale_raw.get("drain_empty_rate") or 0.0
            plain = scale_raw.get("sizes", {}).get("stripe_usage_outbox", {})
            out.append(Row(SECTION, f"partitioned copy: {s['rows']:,} rows in "
                                    f"{s['partitions']} partitions of {PART_DAYS} days "
                                    "(indexed, then copied in id order)",
                           f"{mb(s['total'] / s['rows'] * 1e6)} per million events", "", "",
                           f"heap {mb(s['heap'])}, indexes {mb(s['indexes'])}, total "
                           f"{mb(s['total'])}; the product table: "
                           + (size_note({"stripe_usage_outbox": plain}, plain["rows"])
                              if plain else "?") + "; " + ", ".join(
                               f"{k} {v:.0f} s" for k, v in
                               self.raw["prepare_seconds"].items())))
            mark, keys = scale_drain.insert_batch(self.engine, DRAIN_EVENTS,
                                                  digits, utcnow(), "part")
            alone = scale_drain.drain_batch(self.url, self.admin, mark, keys)
            self.log(f"partition: drain alone {alone}")
            mark, keys = scale_drain.insert_batch(self.engine, DRAIN_EVENTS,
                                                  digits, utcnow(), "partdrop")

            def drop_mid_drain() -> dict[str, Any]:
                # The drop is over in moments: start it a little after the drain's first
                # claim (the drain starts ``lead`` = 0 s after this thread), so it falls
                # inside the drain rather than before it.
                time.sleep(DROP_DELAY)
                return self.drop_oldest()

            during = scale_drain.drain_batch(self.url, self.admin, mark, keys,
                                             during=drop_mid_drain, lead=0.0)
            dropped = during.pop("op_result") or {}
            self.log(f"partition: drain during the drop {during}; dropped {dropped}")
            self.raw.update(drain_alone=alone, drain_during=during, dropped=dropped)

            def rel(rate: float) -> str:
                return f" ({rate / empty:.2f}× the empty product table)" if empty else ""

            out.append(Row(SECTION, f"drain core on the partitioned table ({DRAIN_EVENTS:,} "
                                    "events)",
                           f"{alone['rate']:,.0f} /s{rel(alone['rate'])}", "", "",
                           f"longest pass {alone['max_pass_ms']} ms (median "
                           f"{alone['median_pass_ms']} ms): the claim's UPDATE by id probes "
                           "every partition's primary key (no pruning on id)"))
            took = dropped.get("detach_seconds", 0) + dropped.get("drop_seconds", 0)
            out.append(Row(SECTION, "drop the oldest partition (`DETACH PARTITION … "
                                    "CONCURRENTLY`, then `DROP TABLE`)",
                           f"{took:.2f} s for {dropped.get('rows', 0):,} rows",
                           "", "FAILED" if during.get("op_error") else "",
                           f"detach {dropped.get('detach_seconds', 0):.2f} s, drop "
                           f"{dropped.get('drop_seconds', 0):.2f} s; "
                           + (during.get("op_error") or "")))
            out.append(Row(SECTION, "drain core while the partition is dropped",
                           f"{during['rate']:,.0f} /s{rel(during['rate'])}", "", "",
                           f"the drop started {DROP_DELAY} s into the drain's "
                           f"{during['elapsed']:.2f} s and took {took:.2f} s; longest pass "
                           f"{during['max_pass_ms']} ms; oldest worker transaction seen "
                           f"{during['max_xact_ms']:.0f} ms; lock waits in "
                           f"{during['lock_wait_samples']} of {during['samples']} samples"))
            t0 = time.perf_counter()
            with self.engine.begin() as conn:
                n = conn.execute(text(CHURN_COPY.format(
                    cols=churn_columns(self.engine)))).rowcount
            secs = time.perf_counter() - t0
            after = self.sizes()
            self.raw["churn"] = {"inserted": n, "seconds": secs, "size": after}
            self.log(f"partition: churn {self.raw['churn']}")
            delete = scale_raw.get("churn_delete", {}).get("size")
            out.append(Row(SECTION, f"partitioned design after a month of churn (a partition "
                                    f"dropped, {n:,} new rows)",
                           f"outbox {mb(after['total'])} (heap {mb(after['heap'])}, indexes "
                           f"{mb(after['indexes'])})", "", "",
                           f"{mb(after['total'] / after['rows'] * 1e6)} per million rows "
                           + (f"(delete design: {mb(delete['total'])}, "
                              f"{mb(delete['total'] / delete['rows'] * 1e6)} per million "
                              "rows); " if delete else "; ")
                           + "no dead tuples: the month's space went back to the file "
                             f"system with its partition; inserted in {secs:.0f} s"))
        finally:
            self.close()
        return out

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None
        if self.schema:
            self.db.drop_schema(self.schema)
            self.schema = ""
