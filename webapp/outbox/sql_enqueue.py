"""``billing_outbox_enqueue(…)``: ``enqueue_usage`` as a PostgreSQL function, for producers in
any language, called inside their own transaction (it commits and rolls back with it).

The same rules as :func:`webapp.outbox.enqueue.enqueue_usage`, field by field and in the same
order, with the same words: a text field is a non-empty string of at most ``TEXT_LIMIT``
characters, printable as Python's ``str.isprintable`` says (the characters it refuses are
written into the function from the Unicode tables of the Python that ran the migration), without
surrounding spaces, and the key printable ASCII; a quantity from 1 to 15 digits; a time no more
than 35 days old or 5 minutes ahead. Bad input raises SQLSTATE ``22023`` (its ``COLUMN`` the
field), the same key with other content ``23505`` naming the fields that differ, and the same key
with the same content returns the existing id. The default meter is what the running project
last recorded in ``outbox_settings`` (``default_meter``).

``SECURITY INVOKER``: the caller's own rights; its ``search_path`` is pinned to the outbox's
schema (and ``pg_temp`` last), so a caller's path can never point it at other tables.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import Connection, text

from ..status import PENDING, sql_list
from .enqueue import MAX_QUANTITY
from .ids import TEXT_LIMIT
from .states import MAX_AGE, MAX_AHEAD

#: The function's signature, as ``GRANT`` and ``DROP`` name it.
SIGNATURE = ("billing_outbox_enqueue(text, bigint, text, text, timestamp with time zone)")
TEXT_PROBLEM = "billing_outbox_text_problem(text, boolean)"
#: SQLSTATEs: bad input, the same key with other content, a key taken by a transaction this
#: one cannot see (REPEATABLE READ or SERIALIZABLE: retry it).
INVALID, CONFLICT, RETRY = "22023", "23505", "40001"
DEFAULT_METER_SETTING = "default_meter"


def _unprintable_ranges() -> Iterator[tuple[int, int]]:
    """The code points Python's ``str.isprintable`` refuses, as ranges (NUL and the
    surrogates left out: PostgreSQL text holds neither)."""
    start = None
    for cp in range(1, 0x110000):
        bad = not (0xD800 <= cp <= 0xDFFF) and not chr(cp).isprintable()
        if bad and start is None:
            start = cp
        elif not bad and start is not None:
            yield start, cp - 1
            start = None
    if start is not None:
        yield start, 0x10FFFF


def unprintable_class() -> str:
    """A regular-expression bracket of those code points (PostgreSQL's ``\\U`` escapes)."""
    parts = [f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}"
             for a, b in _unprintable_ranges()]
    return "[" + "".join(parts) + "]"


def _days(seconds: float) -> str:
    return f"{int(seconds)} seconds"


def create_statements(schema: str, *, with_source: bool = True) -> list[str]:
    """The DDL that creates (or replaces) the function and its helper in ``schema``. No
    ``%`` in it: drivers read one as a placeholder. ``with_source``: the event's ``source``
    column is written (``sql``; it exists from migration 0026 on)."""
    source_column = ", source" if with_source else ""
    source_value = ", 'sql'" if with_source else ""
    path = f'"{schema}", pg_temp'
    text_problem = f"""
CREATE OR REPLACE FUNCTION billing_outbox_text_problem(value text, ascii_only boolean)
RETURNS text LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER SET search_path = {path} AS $fn$
BEGIN
    IF value IS NULL OR value = '' THEN
        RETURN 'must be a non-empty string';
    END IF;
    IF char_length(value) > {TEXT_LIMIT} THEN
        RETURN 'must be at most {TEXT_LIMIT} characters (got ' || char_length(value) || ')';
    END IF;
    IF ascii_only AND value ~ '[^ -~]' THEN
        RETURN 'must be printable ASCII';
    END IF;
    IF value ~ '{unprintable_class()}' OR left(value, 1) = ' ' OR right(value, 1) = ' ' THEN
        RETURN 'must be printable, without surrounding spaces';
    END IF;
    RETURN NULL;
END
$fn$"""
    enqueue = f"""
CREATE OR REPLACE FUNCTION billing_outbox_enqueue(
    p_tenant_id text, p_quantity bigint, p_idempotency_key text,
    p_meter text DEFAULT NULL, p_occurred_at timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = {path} AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_meter text := p_meter;
    v_at timestamptz := coalesce(p_occurred_at, clock_timestamp());
    v_problem text;
    v_id bigint;
    v_row record;
    v_diff text[] := ARRAY[]::text[];
BEGIN
    IF v_meter IS NULL THEN
        SELECT value INTO v_meter FROM outbox_settings WHERE name = '{DEFAULT_METER_SETTING}';
        v_meter := coalesce(v_meter, 'api_requests');
    END IF;
    v_problem := billing_outbox_text_problem(p_tenant_id, false);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'tenant_id',
            MESSAGE = 'tenant_id: ' || v_problem;
    END IF;
    v_problem := billing_outbox_text_problem(p_idempotency_key, true);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'idempotency_key',
            MESSAGE = 'idempotency_key: ' || v_problem;
    END IF;
    v_problem := billing_outbox_text_problem(v_meter, false);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'meter',
            MESSAGE = 'meter: ' || v_problem;
    END IF;
    IF p_quantity IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'quantity',
            MESSAGE = 'quantity: must be an integer, not null';
    END IF;
    IF p_quantity <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'quantity',
            MESSAGE = 'quantity: must be positive (got ' || p_quantity || ')';
    END IF;
    IF p_quantity > {MAX_QUANTITY} THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'quantity',
            MESSAGE = 'quantity: must have at most 15 digits (Stripe''s limit)';
    END IF;
    IF v_at < v_now - interval '{_days(MAX_AGE.total_seconds())}' THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'occurred_at',
            MESSAGE = 'occurred_at: is more than 35 days old; Stripe would reject it';
    END IF;
    IF v_at > v_now + interval '{_days(MAX_AHEAD.total_seconds())}' THEN
        RAISE EXCEPTION USING ERRCODE = '{INVALID}', COLUMN = 'occurred_at',
            MESSAGE = 'occurred_at: is more than 5 minutes in the future';
    END IF;

    INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, occurred_at,
                                     next_attempt_at, created_at, updated_at, status,
                                     attempt_count, call_count, key_generation{source_column})
    VALUES (p_tenant_id, v_meter, p_quantity, p_idempotency_key, v_at, v_now, v_now, v_now,
            {sql_list([PENDING])}, 0, 0, 0{source_value})
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;

    SELECT id, tenant_id, meter, quantity, occurred_at INTO v_row
      FROM stripe_usage_outbox WHERE idempotency_key = p_idempotency_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{RETRY}', COLUMN = 'idempotency_key',
            MESSAGE = 'idempotency_key ' || quote_literal(p_idempotency_key)
                      || ' was just used by a transaction this one cannot see; retry the '
                      'transaction';
    END IF;
    IF v_row.tenant_id <> p_tenant_id THEN v_diff := v_diff || 'tenant_id'::text; END IF;
    IF v_row.meter <> v_meter THEN v_diff := v_diff || 'meter'::text; END IF;
    IF v_row.quantity <> p_quantity THEN v_diff := v_diff || 'quantity'::text; END IF;
    -- What Stripe receives is whole seconds: compare that, when the caller gave a time.
    IF p_occurred_at IS NOT NULL AND trunc(extract(epoch FROM v_row.occurred_at))
            <> trunc(extract(epoch FROM p_occurred_at)) THEN
        v_diff := v_diff || 'occurred_at'::text;
    END IF;
    IF cardinality(v_diff) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = '{CONFLICT}', COLUMN = 'idempotency_key',
            MESSAGE = 'idempotency_key ' || quote_literal(p_idempotency_key)
                      || ' already names event ' || v_row.id || ' with a different '
                      || array_to_string(v_diff, ', ');
    END IF;
    RETURN v_row.id;
END
$fn$"""
    return [text_problem, enqueue,
            f"COMMENT ON FUNCTION {SIGNATURE} IS 'Enqueue one usage event in the caller''s "
            "transaction, with enqueue_usage''s rules (billing-outbox docs/producers.md).'"]


#: What ``billing_outbox_enqueue`` writes and reads of the outbox, as column grants.
INSERTED = ("tenant_id", "meter", "quantity", "idempotency_key", "occurred_at",
            "next_attempt_at", "created_at", "updated_at", "status", "attempt_count",
            "call_count", "key_generation", "source")
READ_BACK = ("id", "tenant_id", "meter", "quantity", "idempotency_key", "occurred_at")


def grant_statements(schema: str, role: str) -> list[str]:
    """The grants of a producer role that may enqueue and nothing else: call the function,
    insert the columns it writes, read back the columns it compares (no status, customer or
    error of any event), draw ids, read the default meter. (Functions are callable by
    ``PUBLIC`` unless revoked: the first statement takes that away.)"""
    s, r = f'"{schema}"', f'"{role}"'
    return [
        f"REVOKE EXECUTE ON FUNCTION {s}.{SIGNATURE}, {s}.{TEXT_PROBLEM} FROM PUBLIC",
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT EXECUTE ON FUNCTION {s}.{SIGNATURE}, {s}.{TEXT_PROBLEM} TO {r}",
        f"GRANT INSERT ({', '.join(INSERTED)}) ON {s}.stripe_usage_outbox TO {r}",
        f"GRANT SELECT ({', '.join(READ_BACK)}) ON {s}.stripe_usage_outbox TO {r}",
        f"GRANT USAGE ON SEQUENCE {s}.stripe_usage_outbox_id_seq TO {r}",
        f"GRANT SELECT ON {s}.outbox_settings TO {r}",
    ]


def install(conn: Connection, *, with_source: bool) -> None:
    """Create (or replace) the function in the connection's schema, on PostgreSQL; nothing on
    SQLite, which has no functions of this kind. For the migrations."""
    if conn.dialect.name != "postgresql":
        return
    schema = conn.execute(text("SELECT current_schema()")).scalar_one()
    for statement in create_statements(schema, with_source=with_source):
        conn.exec_driver_sql(statement)


def drop_statements() -> list[str]:
    return [f"DROP FUNCTION IF EXISTS {SIGNATURE}", f"DROP FUNCTION IF EXISTS {TEXT_PROBLEM}"]
