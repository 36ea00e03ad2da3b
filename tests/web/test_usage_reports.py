"""Prepared usage reports: every tenant over more than a month is summed once, on a person's
request (a POST: a page view never writes), kept, and read back exactly as the live table
reads a period — same rows, same order, same filters, same totals — with the moment the
figures are exact as of."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import func, insert, select, text

from webapp import services_of
from webapp.db import reading
from webapp.models import OutboxEvent, UsageReport, UsageReportRow, utcnow
from webapp.outbox.operations import set_tenant
from webapp.read import tenants as reads
from webapp.read import usage_reports as reports
from webapp.read.usage_table import PER_PAGE, UsageQuery, report_table, usage_table
from webapp.worker import report_writer as writer
from webapp.worker.reporter import UsageReporter

from .conftest import csrf_of
from .test_tenants import read_usage_csv
from .test_tenants_paged import ROW_RE, in_order, load, shown_total, walk

T = OutboxEvent.__table__


def long_period(now: Any) -> tuple[Any, Any]:
    return now.date() - timedelta(days=59), now.date()


@pytest.fixture
def now() -> Any:
    """The current time, once per test; an hour earlier in the day's last hour: these tests
    move the clock on by up to a quarter of an hour, and a quick period read past midnight is
    another period (``to=`` today is no longer today)."""
    at = utcnow()
    return at - timedelta(hours=1) if at.hour == 23 else at


@pytest.fixture(autouse=True)
def _app_clock(request: pytest.FixtureRequest) -> None:
    """The dashboard's clock is the tests' ``now`` (a test moves it on where it needs to)."""
    if "app" in request.fixturenames:
        now = request.getfixturevalue("now")
        services_of(request.getfixturevalue("app")).clock = lambda: now


def old_events(engine: Any, now: Any, n: int, *, status: str = "dead", key: str = "old",
               days_ago: int = 45) -> None:
    """``n`` events that occurred 45 days ago (in the long period, outside this month)."""
    at = now - timedelta(days=days_ago)
    rows = [dict(tenant_id=f"t{i * 7:05d}", meter="api_requests", quantity=10 + i,
                 idempotency_key=f"{key}-{i}", occurred_at=at, status=status,
                 attempt_count=1, call_count=1, next_attempt_at=at, key_generation=0,
                 created_at=at, updated_at=at, stripe_customer_id=f"cus_{i * 7:05d}",
                 sent_at=at if status == "sent" else None,
                 dead_at=at if status == "dead" else None) for i in range(n)]
    with engine.begin() as conn:
        conn.execute(insert(T), rows)


@pytest.fixture
def data(engine, now) -> list[reads.UsageRow]:
    """300 tenants' usage today, and older sent, dead and retrying events 45 days ago: the
    rows of the long period as the ``usage`` command counts them."""
    load(engine, 300, now)
    old_events(engine, now, 20, status="sent", key="old-sent")
    old_events(engine, now, 12, status="dead", key="old-dead")
    old_events(engine, now, 5, status="retrying", key="old-retrying")
    start, end = long_period(now)
    return reads.tenant_usage(engine, start=start, end=end).rows


def page_url(now: Any, **view: Any) -> str:
    start, end = long_period(now)
    return "/tenants?" + urlencode({"from": start.isoformat(), "to": end.isoformat(), **view})


def prepare(client: Any, now: Any, **view: Any) -> Any:
    start, end = long_period(now)
    token = csrf_of(client, page_url(now))
    return client.post("/tenants/report", data={"from": start.isoformat(),
                                                "to": end.isoformat(), "csrf_token": token,
                                                **view})


def totals(html: str) -> dict[str, tuple[int, int]]:
    return {s: (shown_total(html, "total", s, "events"), shown_total(html, "total", s,
                                                                     "quantity"))
            for s in reads.USAGE_STATUSES}


def summed(rows: list[reads.UsageRow]) -> dict[str, tuple[int, int]]:
    return {s: (sum(r.events[s] for r in rows), sum(r.quantity[s] for r in rows))
            for s in reads.USAGE_STATUSES}


def test_a_long_period_asks_for_a_report_then_shows_it(client_as, data, now) -> None:
    client = client_as("viewer")
    html = client.get(page_url(now, sort="sent_units")).get_data(as_text=True)
    assert 'id="report-needed"' in html and "Prepare the report" in html
    assert not ROW_RE.findall(html) and "Download CSV" not in html

    resp = prepare(client, now, sort="sent_units", order="desc")
    assert resp.status_code == 303
    assert resp.headers["Location"].endswith(page_url(now, sort="sent_units", order="desc"))
    html = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "The report is ready" in html and 'id="report-as-of"' in html
    assert "exact as of" in html and "viewer@example.com" in html
    assert [(t, m) for t, m, _ in ROW_RE.findall(html)] == in_order(
        data, "sent_units", True)[:PER_PAGE]
    assert totals(html) == summed(data)
    assert summed(data)["dead"][0] >= 12 and summed(data)["sent"][0] > 0
    # every row once, A to Z, page after page, from the report
    seen = [key for p in walk(client, page_url(now)) for key in p]
    assert seen == in_order(data, "tenant", False)


QUERIES = [dict(sort="tenant"), dict(sort="tenant", descending=True),
           dict(sort="sent_units", descending=True), dict(sort="waiting_events"),
           dict(sort="dead_events", descending=True, page=2), dict(text="t001"),
           dict(text="any 12"), dict(text="cus_0020"), dict(only="dead"),
           dict(only="waiting", sort="sent_events"), dict(only="unmapped", page=3),
           dict(text="t00", only="unmapped"), dict(page=99), dict(sort="sent_units"),
           dict(sort="waiting_events", descending=True, page=2),
           dict(only="waiting", sort="dead_events", descending=True)]


@pytest.mark.parametrize("variant", QUERIES, ids=lambda v: urlencode(v))
def test_a_report_reads_back_as_the_live_table(engine, data, now, variant) -> None:
    start, end = long_period(now)
    report = writer.prepare(engine, start, end, now=now, actor="cli")
    assert report.rows == len(data)
    query = UsageQuery(start, end, **variant)
    with reading(engine) as conn:
        live = usage_table(conn, query)
        kept = report_table(conn, query, report)
    assert (kept.period_rows, kept.matching) == (live.period_rows, live.matching)
    assert kept.rows == live.rows and kept.period_totals == live.period_totals
    assert kept.matching_totals == live.matching_totals
    assert live.period_rows == len(data)


def test_the_report_is_a_snapshot_until_prepared_again(app, client_as, engine, data,
                                                      now) -> None:
    client = client_as("viewer")
    assert prepare(client, now).status_code == 303
    before = totals(client.get(page_url(now)).get_data(as_text=True))
    unmapped = client.get(page_url(now, only="unmapped")).get_data(as_text=True)
    assert ('t00000', 'api_requests') in [(t, m) for t, m, _ in ROW_RE.findall(unmapped)]
    old_events(engine, now, 3, status="dead", key="later-dead")
    set_tenant(engine, "t00000", stripe_customer_id="cus_mapped_later", name="Later",
               now=now, actor="test")
    html = client.get(page_url(now)).get_data(as_text=True)
    assert totals(html) == before, "the report's figures stay as they were summed"
    assert ROW_RE.findall(unmapped) == ROW_RE.findall(client.get(page_url(
        now, only="unmapped")).get_data(as_text=True)), "the customers are the report's too"
    # pressed again at once: the report just made, not another
    assert prepare(client, now).status_code == 303
    assert totals(client.get(page_url(now)).get_data(as_text=True)) == before
    services_of(app).clock = lambda: now + reports.REUSE + timedelta(seconds=1)
    assert prepare(client, now).status_code == 303
    after = totals(client.get(page_url(now)).get_data(as_text=True))
    now_unmapped = client.get(page_url(now, only="unmapped")).get_data(as_text=True)
    assert ('t00000', 'api_requests') not in [
        (t, m) for t, m, _ in ROW_RE.findall(now_unmapped)]
    start, end = long_period(now)
    assert after == summed(reads.tenant_usage(engine, start=start, end=end).rows)
    assert after["dead"][0] == before["dead"][0] + 3
    with engine.connect() as conn:
        kept = conn.execute(select(UsageReport.id)).scalars().all()
        assert len(kept) == 1, "the period's older report is dropped"
        assert conn.execute(select(func.count()).select_from(UsageReportRow).where(
            UsageReportRow.report_id != kept[0])).scalar_one() == 0


def test_the_csv_is_the_report_the_page_shows(client_as, engine, data, now) -> None:
    client = client_as("viewer")
    prepare(client, now)
    html = client.get(page_url(now)).get_data(as_text=True)
    link = re.search(r'href="(/tenants\.csv\?[^"]*report=\d+[^"]*)"', html)
    assert link, "the page links the report's CSV"
    old_events(engine, now, 4, status="dead", key="after-report")
    preamble, _, rows, total = read_usage_csv(
        client.get(link.group(1).replace("&amp;", "&")).get_data(as_text=True))
    assert any(p[0] == "Figures exact as of (UTC), a prepared report" for p in preamble)
    assert [(r["Tenant"], r["Meter"]) for r in rows] == in_order(data, "tenant", False)
    for meter in {r.meter for r in data}:
        mine = [r for r in data if r.meter == meter]
        for s in reads.USAGE_STATUSES:
            assert int(total[meter][f"{s} events"]) == summed(mine)[s][0]
            assert int(total[meter][f"{s} units"]) == summed(mine)[s][1]
    names = {r.tenant_id: r.name for r in data}
    assert all(r["Tenant name"] == (names[r["Tenant"]] or "") for r in rows)


@pytest.mark.parametrize(("form", "says"), [
    ({"from": "2026-03-01", "to": "2026-02-01"}, "ends before it starts"),
    ({"from": "2024-01-01", "to": "2026-03-31"}, "at most 400 days"),
    ({"to": "2026-03-31"}, "needs a period"),
    ({"from": "2026-13-01", "to": "2026-03-31"}, "must be a date"),
    ({"from": "2026-01-01", "to": "2026-03-31", "sort": "nonsense"}, "sort"),
])
def test_a_report_request_that_makes_no_sense_is_refused(client_as, engine, now, form,
                                                         says) -> None:
    client = client_as("viewer")
    token = csrf_of(client, "/tenants")
    resp = client.post("/tenants/report", data={**form, "csrf_token": token})
    assert resp.status_code == 400
    assert says in resp.get_data(as_text=True)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(UsageReport)).scalar_one() == 0


def test_reports_past_keeping_are_dropped(engine, data, now) -> None:
    start, end = long_period(now)
    old = writer.prepare(engine, start - timedelta(days=1), end, now=now - reports.KEEP
                          - timedelta(minutes=1), actor="cli")
    kept = writer.prepare(engine, start - timedelta(days=2), end, now=now - timedelta(days=1),
                           actor="cli")
    new = writer.prepare(engine, start, end, now=now, actor="cli")
    with engine.connect() as conn:
        assert set(conn.execute(select(UsageReport.id)).scalars()) == {kept.id, new.id}
        assert conn.execute(select(func.count()).select_from(UsageReportRow).where(
            UsageReportRow.report_id == old.id)).scalar_one() == 0
    assert old.rows == kept.rows == new.rows == len(data)


def test_short_periods_and_one_tenant_stay_live() -> None:
    day = date(2026, 12, 2)
    assert not reports.from_report(day - timedelta(days=30), day)
    assert not reports.from_report(date(2026, 1, 1), date(2026, 1, 31))
    assert reports.from_report(day - timedelta(days=31), day)
    assert not reports.from_report(day - timedelta(days=399), day, "t00001")


def test_a_report_is_summed_in_one_snapshot(engine, now, monkeypatch) -> None:
    """The rollup's mark and the rows past it are read at one moment (on PostgreSQL,
    ``REPEATABLE READ``; SQLite's transactions are snapshots already)."""
    seen: list[str] = []
    real = writer._store_rows

    def spy(conn: Any, *args: Any) -> int:
        if conn.dialect.name == "postgresql":
            seen.append(conn.execute(text("SHOW transaction_isolation")).scalar_one())
        else:
            seen.append("sqlite")
        return real(conn, *args)

    monkeypatch.setattr(writer, "_store_rows", spy)
    start, end = long_period(now)
    writer.prepare(engine, start, end, now=now, actor="cli")
    assert seen in (["repeatable read"], ["sqlite"])


def test_at_many_tenants_the_reporter_keeps_the_quick_periods_prepared(
        app, client_as, engine, data, now, monkeypatch) -> None:
    """The reporter prepares this month, the last 7 and 30 days and last month at many
    tenants (here: from 50 rows), again once they are older than REFRESH; the page reads a
    quick period from its report while it is younger than STANDING_AGE, and sums live
    after that. Below the size it prepares nothing."""
    reporter = UsageReporter(engine, clock=lambda: now)
    assert reporter.run_once() == 0, "300 tenants are not many"
    monkeypatch.setattr(reports, "STANDING_FROM_ROWS", 50)
    assert reporter.run_once() == 4
    assert reporter.run_once() == 0, "not due again within REFRESH"
    with engine.connect() as conn:
        kept = {(r.period_start, r.period_end, r.prepared_by) for r in conn.execute(
            select(UsageReport.period_start, UsageReport.period_end, UsageReport.prepared_by))}
    assert kept == {(a.isoformat(), b.isoformat(), reports.SCHEDULE)
                    for _, a, b in reports.quick_periods(now.date())}

    client = client_as("viewer")
    month = reads.month_start(now)
    url = f"/tenants?from={month.isoformat()}&to={now.date().isoformat()}"
    html = client.get(url).get_data(as_text=True)
    assert 'id="report-as-of"' in html and "automatically" in html
    live = reads.tenant_usage(engine, start=month, end=now.date()).rows
    assert totals(html) == summed(live)
    old_events(engine, now, 2, status="dead", key="today-dead", days_ago=0)
    assert totals(client.get(url).get_data(as_text=True)) == summed(live), "the report's"
    services_of(app).clock = lambda: now + reports.STANDING_AGE + timedelta(seconds=1)
    html = client.get(url).get_data(as_text=True)
    assert 'id="report-as-of"' not in html, "an old standing report gives way to a live sum"
    now_live = summed(reads.tenant_usage(engine, start=month, end=now.date()).rows)
    assert totals(html) == now_live and now_live["dead"][0] == summed(live)["dead"][0] + 2

    later = UsageReporter(engine, clock=lambda: now + reports.REFRESH + timedelta(seconds=1))
    assert later.run_once() == 3, "last month (closed) waits for REFRESH_CLOSED"
    then = now + reports.REFRESH_CLOSED + timedelta(seconds=1)
    much_later = UsageReporter(engine, clock=lambda: then)
    assert much_later.run_once() == 4
    # One report per distinct period: on the 7th "this month" is "the last 7 days", and past
    # midnight the day's periods are new ones (the day before's stay until pruned).
    def spans(day: Any) -> set[tuple[str, str]]:
        return {(a.isoformat(), b.isoformat()) for _, a, b in reports.quick_periods(day)}

    with engine.connect() as conn:
        listed = conn.execute(select(UsageReport.period_start, UsageReport.period_end,
                                     UsageReport.as_of)).all()
    rows = {(r.period_start, r.period_end): r.as_of for r in listed}
    assert len(listed) == len(rows), "one report per period"
    assert set(rows) == spans(now.date()) | spans(then.date())
    assert {rows[span] for span in spans(then.date())} == {then}


def test_reports_write_no_log_on_postgresql(pg) -> None:
    """The reports are a cache rewritten every few minutes at many tenants: unlogged tables
    on PostgreSQL (no write-ahead log; a crash empties them)."""
    with pg.connect() as conn:
        kinds = dict(conn.execute(text(
            "SELECT relname, relpersistence FROM pg_class WHERE relname IN "
            "('usage_reports', 'usage_report_rows') "
            "AND relnamespace = current_schema()::regnamespace")).all())
    assert kinds == {"usage_reports": "u", "usage_report_rows": "u"}


def test_one_report_is_prepared_at_a_time_on_postgresql(pg, now, monkeypatch) -> None:
    """While another preparation holds the lock, a person's is refused and the reporter
    waits for its next turn: nothing is summed twice at once, nothing is stored."""
    start, end = long_period(now)
    with pg.connect() as other:
        assert other.execute(text(
            "SELECT pg_try_advisory_xact_lock(8463, hashtext(current_schema()))")).scalar_one()
        with pytest.raises(writer.ReportBusy):
            writer.prepare(pg, start, end, now=now, actor="cli")
        monkeypatch.setattr(reports, "STANDING_FROM_ROWS", 0)
        assert UsageReporter(pg, clock=lambda: now).run_once() == 0
        other.rollback()
    with pg.connect() as conn:
        assert conn.execute(select(func.count()).select_from(UsageReport)).scalar_one() == 0
    assert writer.prepare(pg, start, end, now=now, actor="cli").rows == 0


def test_a_busy_preparation_is_said_in_plain_words(client_as, engine, now, monkeypatch) -> None:
    def busy(*args: Any, **kwargs: Any) -> Any:
        raise writer.ReportBusy("another report is being prepared")

    monkeypatch.setattr("webapp.web.tenants.prepare_usage_report", busy)
    client = client_as("viewer")
    resp = prepare(client, now, sort="dead_events")
    assert resp.status_code == 303 and "sort=dead_events" in resp.headers["Location"]
    html = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "Another report is being prepared right now" in html
    assert 'id="report-needed"' in html
