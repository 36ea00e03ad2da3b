"""The Tenants & usage and mappings pages at many tenants: paged, sorted and filtered in the
database, the period's totals still over every tenant, the CSV still every row, and no
statement carrying one parameter per tenant."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from datetime import time as clock
from typing import Any

import pytest
from sqlalchemy import event, insert

from webapp.models import (
    OutboxEvent,
    SentUsageMonthly,
    SentUsageRollup,
    SentUsageYearly,
    Tenant,
)
from webapp.outbox.rollups import add_sent
from webapp.read import tenants as reads
from webapp.read.usage_table import PER_PAGE, UsageQuery, usage_table

from .test_tenants import read_usage_csv

T = OutboxEvent.__table__
ROW_RE = re.compile(r'<tr data-tenant="([^"]*)" data-meter="([^"]*)" data-customer="[^"]*">'
                    r'(.*?)</tr>', re.S)
MAP_RE = re.compile(r'<tr data-tenant="([^"]*)"><td>')
GHOSTS = 25


def load(engine: Any, n: int, now: datetime) -> None:
    """``n`` tenants ``t00000``…: every tenth without a customer (and with events waiting
    for one), the others with sent usage today in the rollup (every fourth on a second
    meter), some with dead or retrying events; and tenants with waiting events but no row
    in the tenants table at all."""
    at = datetime.combine(now.date(), clock(0, 0, 1), UTC)
    day = now.date().isoformat()
    tenants, rollup, events = [], [], []

    def ev(tenant: str, status: str, quantity: int, **kw: Any) -> None:
        events.append(dict(tenant_id=tenant, meter="api_requests", quantity=quantity,
                           idempotency_key=f"k-{len(events)}", occurred_at=at, status=status,
                           attempt_count=0, call_count=0, next_attempt_at=at, key_generation=0,
                           created_at=at, updated_at=at, stripe_customer_id=None, sent_at=None,
                           dead_at=None) | kw)

    for i in range(n):
        t = f"t{i:05d}"
        mapped = i % 10 != 0
        tenants.append(dict(tenant_id=t, name=f"Company {i}",
                            stripe_customer_id=f"cus_{i:05d}" if mapped else None,
                            created_at=now, updated_at=now))
        if not mapped:
            ev(t, "pending", 2)
            continue
        rollup.append(dict(day=day, tenant_id=t, customer=f"cus_{i:05d}", meter="api_requests",
                           events=1 + i % 7, quantity=1 + (i * 37) % 1000))
        if i % 4 == 1:
            rollup.append(dict(day=day, tenant_id=t, customer=f"cus_{i:05d}", meter="storage",
                               events=2, quantity=1 + (i * 11) % 500))
        if i % 50 == 3:
            ev(t, "dead", 5, stripe_customer_id=f"cus_{i:05d}", dead_at=at)
        if i % 30 == 7:
            ev(t, "retrying", 3, stripe_customer_id=f"cus_{i:05d}")
        if i % 100 == 11:
            ev(t, "sent", 4, stripe_customer_id=f"cus_{i:05d}", sent_at=now)
    for k in range(GHOSTS):
        ev(f"z-ghost-{k:02d}", "pending", 1)
    with engine.begin() as conn:
        conn.execute(insert(Tenant.__table__), tenants)
        # through the rollups' one writer: the daily rows and their monthly and yearly sums
        add_sent(conn, [(r["day"], r["tenant_id"], r["customer"], r["meter"], r["events"],
                         r["quantity"]) for r in rollup])
        conn.execute(insert(T), events)


def period(now: datetime) -> tuple[Any, Any]:
    return reads.month_start(now), now.date()


def expected(engine: Any, now: datetime) -> list[reads.UsageRow]:
    """The rows as ``usage_in`` (the ``usage`` command, a tenant's page) gives them."""
    start, end = period(now)
    return reads.tenant_usage(engine, start=start, end=end).rows


def walk(client: Any, url: str) -> Iterator[list[tuple[str, str]]]:
    """Every page of the usage table from ``url``, following "Next"."""
    while url:
        html = client.get(url).get_data(as_text=True)
        yield [(t, m) for t, m, _ in ROW_RE.findall(html)]
        nxt = re.search(r'href="([^"]*)" rel="next"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else ""


def waiting(r: reads.UsageRow) -> int:
    return r.events["pending"] + r.events["retrying"]


SORT_KEYS = {
    "sent_units": lambda r: (r.quantity["sent"],),
    "sent_events": lambda r: (r.events["sent"],),
    "waiting_events": lambda r: (waiting(r),),
    "dead_events": lambda r: (r.events["dead"],),
}


def in_order(rows: list[reads.UsageRow], sort: str, descending: bool) -> list[tuple[str, str]]:
    """The order the page promises: by the tenant or the figure, ties by tenant then meter
    (A to Z: a tenant's meters stay A to Z when the tenants go Z to A)."""
    if sort == "tenant":
        out = sorted(sorted(rows, key=lambda r: r.meter), key=lambda r: r.tenant_id,
                     reverse=descending)
    else:
        out = sorted(sorted(rows, key=lambda r: (r.tenant_id, r.meter)),
                     key=SORT_KEYS[sort], reverse=descending)
    return [(r.tenant_id, r.meter) for r in out]


def shown_total(html: str, prefix: str, status: str, what: str) -> int:
    """The page's totals of a figure, added up here over its meters (the page shows a totals
    row per meter and never adds meters together)."""
    cells = re.findall(rf'data-col="{prefix}_{status}_{what}">([^<]*)<', html)
    assert cells, f"{prefix} {status} {what} shown"
    return sum(int(c.replace(",", "")) for c in cells)


def table_total(totals: dict[str, reads.UsageRow], what: str, status: str) -> int:
    """A table's totals of a figure added up over its meters (each meter has its own)."""
    return sum(getattr(t, what)[status] for t in totals.values())


@pytest.fixture
def tenants300(engine, now) -> list[reads.UsageRow]:
    load(engine, 300, now)
    return expected(engine, now)


def test_pages_walk_every_row_once_in_each_order(client_as, tenants300) -> None:
    client = client_as("viewer")
    rows = tenants300
    assert len(rows) > 6 * PER_PAGE
    for sort, order in (("tenant", "asc"), ("tenant", "desc"), ("sent_units", "desc"),
                        ("dead_events", "desc"), ("waiting_events", "asc")):
        pages = list(walk(client, f"/tenants?sort={sort}&order={order}"))
        assert all(len(p) == PER_PAGE for p in pages[:-1]) and 0 < len(pages[-1]) <= PER_PAGE
        seen = [key for p in pages for key in p]
        assert seen == in_order(rows, sort, order == "desc"), (sort, order)
        assert len(set(seen)) == len(rows)


def test_figures_sort_largest_first_by_default(client_as, tenants300) -> None:
    html = client_as("viewer").get("/tenants?sort=sent_units").get_data(as_text=True)
    shown = [(t, m) for t, m, _ in ROW_RE.findall(html)]
    assert shown == in_order(tenants300, "sent_units", True)[:PER_PAGE]
    assert "largest first" in html
    html = client_as("viewer").get("/tenants").get_data(as_text=True)
    assert [(t, m) for t, m, _ in ROW_RE.findall(html)] == in_order(
        tenants300, "tenant", False)[:PER_PAGE]


def test_totals_are_the_whole_period_on_every_page_and_filter(client_as, tenants300) -> None:
    client = client_as("viewer")
    rows = tenants300
    for url in ("/tenants", "/tenants?page=3", "/tenants?page=999", "/tenants?q=t001",
                "/tenants?only=dead&sort=dead_events"):
        resp = client.get(url)
        assert resp.status_code == 200, url
        html = resp.get_data(as_text=True)
        for s in reads.USAGE_STATUSES:
            assert shown_total(html, "total", s, "quantity") == sum(
                r.quantity[s] for r in rows), (url, s)
            assert shown_total(html, "total", s, "events") == sum(r.events[s] for r in rows)
    html = client.get("/tenants?page=999").get_data(as_text=True)
    assert "There is no page 999" in html and f"{len(rows):,} rows" in html


@pytest.mark.parametrize(("params", "keep"), [
    ("q=t001", lambda r: r.tenant_id.startswith("t001")),
    ("q=any%2012", lambda r: r.name is not None and "any 12" in r.name),
    ("q=cus_0020", lambda r: (r.stripe_customer_id or "").startswith("cus_0020")),
    ("only=dead", lambda r: r.events["dead"] > 0),
    ("only=waiting", lambda r: waiting(r) > 0),
    ("only=unmapped", lambda r: r.stripe_customer_id is None),
    ("q=t00&only=unmapped", lambda r: r.tenant_id.startswith("t00")
     and r.stripe_customer_id is None),
])
def test_filters(client_as, tenants300, params, keep) -> None:
    client = client_as("viewer")
    want = [r for r in tenants300 if keep(r)]
    assert want, "the filter keeps some rows"
    seen = [key for p in walk(client, f"/tenants?{params}") for key in p]
    assert seen == in_order(want, "tenant", False)
    html = client.get(f"/tenants?{params}").get_data(as_text=True)
    assert f"{len(want):,} of {len(tenants300):,} rows match" in html
    for s in reads.USAGE_STATUSES:
        assert shown_total(html, "match", s, "quantity") == sum(r.quantity[s] for r in want)
        assert shown_total(html, "match", s, "events") == sum(r.events[s] for r in want)


def test_a_filter_that_matches_nothing(client_as, tenants300) -> None:
    html = client_as("viewer").get("/tenants?q=nobody").get_data(as_text=True)
    assert "No row matches the filter." in html and not ROW_RE.findall(html)
    assert shown_total(html, "total", "sent", "quantity") == sum(
        r.quantity["sent"] for r in tenants300)


@pytest.mark.parametrize(("params", "field"), [
    ("sort=name", "sort"), ("sort=tenant%3B", "sort"), ("order=up", "order"),
    ("page=0", "page"), ("page=-1", "page"), ("page=two", "page"), ("page=10000000", "page"),
    ("only=everything", "only"), ("q=%00", "q"), ("q=" + "x" * 101, "q"),
])
def test_bad_parameters_are_refused_naming_the_field(client_as, params, field) -> None:
    resp = client_as("viewer").get(f"/tenants?{params}")
    assert resp.status_code == 400
    assert f"“{field}”" in resp.get_data(as_text=True)


def test_bad_mappings_parameters(client_as) -> None:
    client = client_as("viewer")
    for params, field in (("show=all", "show"), ("after=%01", "after"),
                          ("before=" + "x" * 101, "before"), ("q=%7F", "q")):
        resp = client.get(f"/mappings?{params}")
        assert resp.status_code == 400, params
        assert f"“{field}”" in resp.get_data(as_text=True)


def test_read_side_refuses_an_unknown_sort(engine, now) -> None:
    start, end = period(now)
    with engine.connect() as conn, pytest.raises(ValueError):
        usage_table(conn, UsageQuery(start, end, sort="name"))


def test_3000_tenants_page_totals_csv_and_one_parameter_not_one_per_tenant(
        client_as, engine, now) -> None:
    load(engine, 3000, now)
    rows = expected(engine, now)
    assert len(rows) > 3000
    client = client_as("admin")
    counts: list[int] = []

    @event.listens_for(engine, "before_cursor_execute")
    def count(conn, cursor, statement, params, context, many) -> None:  # noqa: ANN001
        counts.append(len(params) if params else 0)

    try:
        html = client.get("/tenants?sort=sent_events").get_data(as_text=True)
        mappings = client.get("/mappings").get_data(as_text=True)
        csv_text = client.get("/tenants.csv").get_data(as_text=True)
        client.get("/mappings?show=waiting").get_data(as_text=True)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert counts and max(counts) < 150, max(counts)   # constants only, whatever the count

    assert len(ROW_RE.findall(html)) == PER_PAGE
    assert f"{len(rows):,} rows" in html
    assert re.search(r"Page 1 of ([\d,]+)", html).group(1) == f"{-(-len(rows) // PER_PAGE):,}"
    for s in reads.USAGE_STATUSES:
        assert shown_total(html, "total", s, "quantity") == sum(r.quantity[s] for r in rows)

    assert len(MAP_RE.findall(mappings)) == 50
    more = re.search(r'id="waiting-more"><a href="([^"]*)">([\d,]+) more', mappings)
    assert more and int(more.group(2).replace(",", "")) == 300 + GHOSTS - 20

    _, _, csv_rows, totals = read_usage_csv(csv_text)
    assert [(r["Tenant"], r["Meter"]) for r in csv_rows] == [(r.tenant_id, r.meter)
                                                             for r in rows]
    assert set(totals) == {r.meter for r in rows}
    for meter, total in totals.items():
        mine = [r for r in rows if r.meter == meter]
        for s in reads.USAGE_STATUSES:
            assert int(total[f"{s} units"]) == sum(r.quantity[s] for r in mine)
            assert int(total[f"{s} events"]) == sum(r.events[s] for r in mine)


def test_mappings_keyset_both_ways_and_filters(client_as, engine, now) -> None:
    load(engine, 300, now)
    client = client_as("admin")
    every = [f"t{i:05d}" for i in range(300)]
    pages, url = [], "/mappings"
    while url:
        html = client.get(url).get_data(as_text=True)
        pages.append(MAP_RE.findall(html))
        nxt = re.search(r'href="([^"]*)" rel="next"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert [t for p in pages for t in p] == every
    assert [len(p) for p in pages] == [50] * 6
    back = []
    while True:
        prev = re.search(r'href="([^"]*)" rel="prev"', html)
        if not prev:
            break
        html = client.get(prev.group(1).replace("&amp;", "&")).get_data(as_text=True)
        back.append(MAP_RE.findall(html))
    assert back == pages[-2::-1]
    found = MAP_RE.findall(client.get("/mappings?q=t0012").get_data(as_text=True))
    assert found == [f"t{i:05d}" for i in range(120, 130)]
    found = MAP_RE.findall(client.get("/mappings?q=cus_00201").get_data(as_text=True))
    assert found == ["t00201"]
    found = MAP_RE.findall(client.get("/mappings?q=company%20299").get_data(as_text=True))
    assert found == ["t00299"]
    html = client.get("/mappings?q=nobody").get_data(as_text=True)
    assert "No tenant" in html and not MAP_RE.findall(html)
    # the form still takes the tenant an alert names
    assert 'name="tenant_id" required maxlength="100" value="t00010"' in client.get(
        "/mappings?tenant=t00010").get_data(as_text=True)


def test_every_tenant_waiting_for_a_customer_a_page_at_a_time(client_as, engine, now) -> None:
    load(engine, 600, now)
    client = client_as("admin")
    html = client.get("/mappings").get_data(as_text=True)
    listed = re.findall(r'<li><a href="/tenants/([^"]+)">', html.split('id="mappings"')[1])
    assert len(listed) == 20
    more = re.search(r'id="waiting-more"><a href="([^"]*)">([\d,]+) more', html)
    assert more and int(more.group(2)) == 60 + GHOSTS - 20
    want = [f"t{i:05d}" for i in range(0, 600, 10)] + [f"z-ghost-{k:02d}" for k in range(GHOSTS)]
    seen, url = [], more.group(1).replace("&amp;", "&")
    while url:
        page = client.get(url).get_data(as_text=True)
        seen += MAP_RE.findall(page)
        nxt = re.search(r'href="([^"]*)" rel="next"', page)
        url = nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert seen == want
    assert "map it" in page
    tenants_page = client.get("/tenants").get_data(as_text=True)
    assert re.search(r'id="waiting-more"><a href="/mappings\?show=waiting">', tenants_page)


def _as_dicts(rows: list[reads.UsageRow]) -> list[tuple[Any, ...]]:
    return [(r.tenant_id, r.meter, r.name, r.stripe_customer_id, r.events, r.quantity)
            for r in rows]


@pytest.mark.parametrize("run", range(2))
def test_the_paged_table_and_the_file_equal_usage_in_after_a_random_history(
        engine, seed, run) -> None:
    """Sent, folded by day and by month, cancelled, resolved, pruned: whatever happened, the
    page's rows, its totals and the file's rows are ``usage_in``'s (the ``usage`` command's
    and the tenant page's numbers), for whole months and ragged periods alike."""
    import random
    from datetime import timedelta

    from outbox.test_retention import RETENTION, TENANTS, World

    from webapp.models import utcnow
    from webapp.read.usage_table import usage_rows_streamed

    rng = random.Random(4200 + run)
    start = utcnow().replace(microsecond=0) - timedelta(days=120)
    for t in TENANTS:
        seed.tenant(t, f"cus_{t}")
    world = World(engine, seed, rng, start)
    steps = [world.enqueue, world.drain, world.fold, world.cancel, world.resolve,
             world.later, world.later, world.prune]
    for _ in range(12):
        rng.choice(steps)()
    world.t += timedelta(days=RETENTION + 2)   # and a prune that removes every terminal row
    world.fold()
    world.prune()
    assert world.pruned > 0
    first = (start - timedelta(days=31)).date()
    last = world.t.date()
    mid = first + timedelta(days=(last - first).days // 2)
    periods = [(first, last), (mid.replace(day=1), last), (mid, last),
               (mid.replace(day=1), (mid.replace(day=28) + timedelta(days=4)).replace(day=1)
                - timedelta(days=1))]
    for a, b in periods:
        want = reads.tenant_usage(engine, start=a, end=b).rows
        with engine.connect() as conn:
            table = usage_table(conn, UsageQuery(a, b, per_page=100_000))
        assert _as_dicts(table.rows) == _as_dicts(want), (a, b)
        assert table.period_rows == table.matching == len(want)
        for s in reads.USAGE_STATUSES:
            for meter, total in table.period_totals.items():
                mine = [r for r in want if r.meter == meter]
                assert total.events[s] == sum(r.events[s] for r in mine)
                assert total.quantity[s] == sum(r.quantity[s] for r in mine)
        assert _as_dicts(list(usage_rows_streamed(engine, start=a, end=b))) == _as_dicts(want)


def test_part_of_a_month_or_year_reads_its_row_only_when_the_rest_is_empty(engine) -> None:
    """"This month so far" is the month's row when nothing occurred after the period's end
    (one row per tenant instead of one per day); otherwise the days are read one by one, or
    the month less the few days outside the period. The numbers agree every way."""
    from datetime import date

    from webapp.read.usage_sources import _probe, sent_plan

    rows = [dict(day=d, tenant_id="a", stripe_customer_id="cus_a", meter="m", events=1,
                 quantity=10) for d in ("2026-10-30", "2026-11-01", "2026-11-05", "2026-11-20")]
    with engine.begin() as conn:
        conn.execute(insert(SentUsageRollup.__table__), rows)
        conn.execute(insert(SentUsageMonthly.__table__), [
            dict(month="2026-10", tenant_id="a", stripe_customer_id="cus_a", meter="m",
                 events=1, quantity=10),
            dict(month="2026-11", tenant_id="a", stripe_customer_id="cus_a", meter="m",
                 events=3, quantity=30)])
        conn.execute(insert(SentUsageYearly.__table__), [
            dict(year="2026", tenant_id="a", stripe_customer_id="cus_a", meter="m", events=4,
                 quantity=40)])

    def plan(a: date, b: date) -> set[tuple[str, str, int]]:
        with engine.connect() as conn:
            return {(p.level, p.key, p.sign) for p in sent_plan(a, b, _probe(conn))}

    # nothing after the 25th: the month's row
    assert plan(date(2026, 11, 1), date(2026, 11, 25)) == {("month", "2026-11", 1)}
    # the rest of the month holds more days than the period: the period's days
    assert plan(date(2026, 11, 1), date(2026, 11, 10)) == {
        ("day", f"2026-11-{d:02}", 1) for d in range(1, 11)}
    # most of November: its row less the days after the 19th
    assert plan(date(2026, 10, 31), date(2026, 11, 19)) == {
        ("day", "2026-10-31", 1), ("month", "2026-11", 1), *{
            ("day", f"2026-11-{d:02}", -1) for d in range(20, 31)}}
    # nothing in 2026 outside the period: the year's row
    assert plan(date(2026, 10, 30), date(2026, 12, 31)) == {("year", "2026", 1)}
    for a, b, sent in ((date(2026, 11, 1), date(2026, 11, 25), 30),
                       (date(2026, 11, 1), date(2026, 11, 10), 20),
                       (date(2026, 10, 31), date(2026, 11, 19), 20),
                       (date(2026, 10, 30), date(2026, 10, 30), 10),
                       (date(2026, 11, 2), date(2026, 11, 30), 20),
                       (date(2025, 12, 1), date(2027, 1, 31), 40)):
        with engine.connect() as conn:
            table = usage_table(conn, UsageQuery(a, b))
        assert table.period_totals["m"].quantity["sent"] == sent == reads.tenant_usage(
            engine, start=a, end=b).rows[0].quantity["sent"], (a, b)


def test_sent_plan_uses_few_rows_and_covers_each_day_once() -> None:
    """The plan for any period, whatever days hold rows, counts every day holding rows
    exactly once if it is in the period and not at all if not (an empty day counts for
    nothing either way); long periods take years and months."""
    import random
    from collections import Counter
    from datetime import date, timedelta

    from webapp.read.usage_sources import sent_plan

    def days_of(level: str, key: str) -> list[date]:
        if level == "day":
            return [date.fromisoformat(key)]
        first = date.fromisoformat(key + ("-01-01" if level == "year" else "-01"))
        out = []
        while first.isoformat().startswith(key):
            out.append(first)
            first += timedelta(days=1)
        return out

    rng = random.Random(15)
    origin = date(2024, 1, 1)
    for _ in range(400):
        a = origin + timedelta(days=rng.randint(0, 1000))
        b = a + timedelta(days=rng.choice((0, 1, 17, 40, 200, 364, 400, 800)))
        share = rng.choice((1.0, 0.3, 0.02))
        last = b + timedelta(days=rng.choice((0, 5, 40, 900)))
        held = {d for d in (origin + timedelta(days=i) for i in range(2500))
                if d <= last and rng.random() < share}

        def has_rows(x: date, y: date) -> bool:
            return any(x <= d <= y for d in held)
        count: Counter[date] = Counter()
        pieces = sent_plan(a, b, has_rows)
        for p in pieces:
            for d in days_of(p.level, p.key):
                count[d] += p.sign
        wrong = [d for d in held if count[d] != (1 if a <= d <= b else 0)]
        assert not wrong, (a, b, wrong[:3])
        assert len(pieces) <= 34 * (b.year - a.year + 1), (a, b, pieces)
    year = sent_plan(date(2025, 12, 2), date(2026, 12, 1), lambda x, y: x <= date(2026, 12, 1))
    assert {(p.level, p.key, p.sign) for p in year} == {
        ("year", "2026", 1), ("month", "2025-12", 1), ("day", "2025-12-01", -1)}


