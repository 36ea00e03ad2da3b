"""Usage per tenant and meter (rollup plus live rows), its CSV, the tenant page and the
Stripe customer mapping."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta

import pytest

from webapp.models import utcnow
from webapp.outbox import rollups
from webapp.read import counts
from webapp.read import tenants as reads

from .conftest import csrf_of


def period_of(now: datetime) -> tuple[date, date]:
    return reads.month_start(now), now.date()


@pytest.fixture
def usage_data(seed, now):
    """Events in this month (some old enough to be folded into the rollup), and some
    outside it. Returns the expected numbers per (tenant, meter, status)."""
    start = datetime.combine(reads.month_start(now), datetime.min.time(), UTC)
    inside = max(start + timedelta(minutes=1), now - timedelta(hours=2))
    before = start - timedelta(minutes=1)
    seed.tenant("acme", "cus_acme", "Acme Inc")
    seed.tenant("globex", None)
    # folded: sent more than the margin ago
    seed.events(3, tenant_id="acme", status="sent", quantity=10, occurred_at=inside,
                sent_at=now - timedelta(hours=1))
    # live: sent just now
    seed.events(2, tenant_id="acme", status="sent", quantity=1, occurred_at=inside)
    seed.events(1, tenant_id="acme", meter="storage", status="sent", quantity=100,
                occurred_at=inside, sent_at=now - timedelta(hours=1))
    seed.events(2, tenant_id="acme", status="pending", quantity=4, occurred_at=inside)
    seed.events(1, tenant_id="acme", status="processing", quantity=6, occurred_at=inside)
    seed.events(1, tenant_id="globex", status="retrying", quantity=9, occurred_at=inside)
    seed.events(2, tenant_id="globex", status="dead", quantity=3, occurred_at=inside)
    seed.events(1, tenant_id="globex", status="resolved", quantity=8, occurred_at=inside)
    # outside the period (occurred last month), sent long ago and just now
    seed.events(4, tenant_id="acme", status="sent", quantity=1000, occurred_at=before,
                sent_at=now - timedelta(hours=3))
    seed.events(1, tenant_id="acme", status="sent", quantity=1000, occurred_at=before)
    return {
        ("acme", "api_requests"): {"sent": (5, 32), "pending": (3, 14)},
        ("acme", "storage"): {"sent": (1, 100)},
        ("globex", "api_requests"): {"retrying": (1, 9), "dead": (2, 6), "resolved": (1, 8)},
    }


def read_usage_csv(text: str) -> tuple[list[list[str]], list[str], list[dict[str, str]],
                                      dict[str, dict[str, str]]]:
    """The usage CSV's parts: the lines before the empty one, the header, the rows (as
    dicts), and the totals rows at its end, one per meter (by meter)."""
    lines = list(csv.reader(io.StringIO(text, newline="")))
    blank = lines.index([])
    preamble, header, body = lines[:blank], lines[blank + 1], lines[blank + 2:]
    rows = [dict(zip(header, r, strict=True)) for r in body]
    first = next((i for i, r in enumerate(rows) if r["Tenant"] == "Total"), len(rows))
    assert all(r["Tenant"] == "Total" for r in rows[first:]), "the totals rows come last"
    return preamble, header, rows[:first], {r["Meter"]: r for r in rows[first:]}


def total_of(totals: dict[str, dict[str, str]], column: str) -> int:
    """A column of the file's totals rows, added up here over the meters."""
    return sum(int(t[column]) for t in totals.values())


def as_expected(usage: reads.Usage) -> dict:
    out = {}
    for r in usage.rows:
        out[(r.tenant_id, r.meter)] = {s: (r.events[s], r.quantity[s])
                                       for s in reads.USAGE_STATUSES if r.events[s]}
    return out


def test_usage_numbers_folded_and_live(engine, usage_data, now) -> None:
    start, end = period_of(now)
    margin = rollups.fold_margin(30)
    before_fold = reads.tenant_usage(engine, start=start, end=end)
    assert as_expected(before_fold) == usage_data
    assert rollups.fold(engine, now=now, margin=margin) is True
    assert rollups.fold(engine, now=now, margin=margin) is False   # fresh
    after = reads.tenant_usage(engine, start=start, end=end)
    assert as_expected(after) == usage_data
    # a later fold that swallows the live rows too changes no number
    rollups.fold(engine, now=now + timedelta(hours=2), margin=margin)
    assert as_expected(reads.tenant_usage(engine, start=start, end=end)) == usage_data
    with engine.connect() as conn:
        assert counts.status_counts(conn)["sent"] == 11
    # rebuilding from scratch gives the same
    rollups.rebuild(engine, now=now, margin=margin)
    assert as_expected(reads.tenant_usage(engine, start=start, end=end)) == usage_data
    single = reads.tenant_usage(engine, start=start, end=end, tenant_id="globex")
    assert [r.tenant_id for r in single.rows] == ["globex"]


def test_page_and_csv_show_the_same_numbers(client_as, engine, usage_data, now) -> None:
    client = client_as("viewer")
    start, end = period_of(now)
    page = client.get("/tenants")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "cus_acme" in html and "not mapped" in html
    usage = reads.tenant_usage(engine, start=start, end=end)
    for r in usage.rows:
        row = re.search(rf'<tr data-tenant="{r.tenant_id}" data-meter="{r.meter}" '
                        rf'data-customer="{r.stripe_customer_id or ""}">(.*?)</tr>',
                        html, re.S).group(1)
        for s in reads.USAGE_STATUSES:
            cell = re.search(rf'data-col="{s}_quantity">([^<]*)<', row).group(1)
            assert int(cell.replace(",", "")) == r.quantity[s]
    # A totals row per meter: api_requests 32, storage 100 (never added together).
    shown = {m: re.search(r'data-col="total_sent_quantity">([^<]*)<', row).group(1)
             for m, row in re.findall(r'<tr class="period-total" data-meter="([^"]*)">(.*?)</tr>',
                                      html, re.S)}
    assert shown == {"api_requests": "32", "storage": "100"}

    resp = client.get(f"/tenants.csv?from={start.isoformat()}&to={end.isoformat()}")
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    assert "attachment" in resp.headers["Content-Disposition"]
    preamble, header, rows, totals = read_usage_csv(resp.get_data(as_text=True))
    by_key = {(r["Tenant"], r["Meter"]): r for r in rows}
    assert set(by_key) == {(r.tenant_id, r.meter) for r in usage.rows}
    for r in usage.rows:
        got = by_key[(r.tenant_id, r.meter)]
        for s in reads.USAGE_STATUSES:
            assert int(got[f"{s} events"]) == r.events[s]
            assert int(got[f"{s} units"]) == r.quantity[s]
    assert by_key[("acme", "api_requests")]["Tenant name"] == "Acme Inc"
    assert by_key[("acme", "api_requests")]["Stripe customer"] == "cus_acme"

    # The file's columns are the screen's, in its order (the tenant's name, shown under its
    # id on the screen, has a column of its own in the file; when and over how many days
    # Stripe's figure was compared, in its cells' titles on the screen, close the file).
    head = html.split('id="usage-table"', 1)[1].split("</thead>", 1)[0]
    first_row, second_row = head.split("</tr>")[:2]
    subs = iter(re.findall(r'class="num sub">([^<]+)<', second_row))
    screen = []
    for span, text in re.findall(r'(rowspan|colspan)="2"[^>]*>([^<]+)<', first_row):
        screen += [text] if span == "rowspan" else [f"{text} {next(subs)}", f"{text} {next(subs)}"]
    assert screen[:6] == ["Tenant", "Meter", "sent units", "Stripe units", "Stripe difference",
                          "sent events"]
    extras = ["Stripe compared days", "Stripe compared at (UTC)",
              "our units on the compared days", "invoiced_units"]
    assert header[-4:] == extras
    assert [c for c in header if c != "Tenant name" and c not in extras] == screen
    assert header[1] == "Tenant name"

    # A totals row per meter: the sum of that meter's rows, and the screen's totals.
    assert set(totals) == {"api_requests", "storage"}
    for meter, total in totals.items():
        screen_row = re.search(rf'<tr class="period-total" data-meter="{meter}">(.*?)</tr>',
                               html, re.S).group(1)
        for col in [c for c in header if c.split(" ")[0] in reads.USAGE_STATUSES]:
            assert int(total[col]) == sum(int(r[col]) for r in rows if r["Meter"] == meter)
            status, what = col.split(" ")
            shown_cell = re.search(rf'data-col="total_{status}_'
                                   rf'{"quantity" if what == "units" else what}">([^<]*)<',
                                   screen_row).group(1)
            assert int(shown_cell.replace(",", "")) == int(total[col]), (meter, col)
    assert int(totals["api_requests"]["sent units"]) == 32
    assert int(totals["storage"]["sent units"]) == 100

    # The period and when the file was made, before the table.
    assert preamble[0][1:] == [start.isoformat(), end.isoformat()]
    assert preamble[0][0].startswith("Period")
    assert preamble[1][0] == "Generated at (UTC)"
    made = datetime.strptime(preamble[1][1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert abs((made - utcnow()).total_seconds()) < 120


def test_other_periods(client_as, usage_data, now) -> None:
    client = client_as("viewer")
    start = reads.month_start(now) - timedelta(days=5)
    resp = client.get(f"/tenants.csv?from={start.isoformat()}&to={start.isoformat()}")
    _, _, rows, totals = read_usage_csv(resp.get_data(as_text=True))
    assert rows == [] or all(int(r["sent events"]) == 0 for r in rows)
    assert total_of(totals, "sent events") == 0
    last_day = reads.month_start(now) - timedelta(days=1)
    _, _, rows, totals = read_usage_csv(client.get(
        f"/tenants.csv?from={last_day.isoformat()}&to={now.date().isoformat()}")
        .get_data(as_text=True))
    acme = next(r for r in rows if (r["Tenant"], r["Meter"]) == ("acme", "api_requests"))
    assert int(acme["sent events"]) == 10 and int(acme["sent units"]) == 5032
    # one tenant's file (its page's "Download CSV"): only its rows, and its totals
    preamble, _, rows, totals = read_usage_csv(client.get(
        f"/tenants.csv?from={last_day.isoformat()}&to={now.date().isoformat()}&tenant=globex")
        .get_data(as_text=True))
    assert {r["Tenant"] for r in rows} == {"globex"} and ["Tenant", "globex"] in preamble
    assert total_of(totals, "dead units") == 6 and total_of(totals, "sent units") == 0
    assert client.get("/tenants?from=2026-02-10&to=2026-02-01").status_code == 400
    assert client.get("/tenants?from=nope").status_code == 400
    assert client.get("/tenants?from=2020-01-01&to=2026-01-01").status_code == 400


def test_csv_cells_that_look_like_formulas_are_defused(client_as, seed) -> None:
    seed.tenant("=HYPERLINK(1)", "cus_x", "@evil")
    seed.event(tenant_id="=HYPERLINK(1)", status="pending")
    _, _, rows, _ = read_usage_csv(client_as("viewer").get("/tenants.csv")
                                   .get_data(as_text=True))
    assert rows[0]["Tenant"] == "'=HYPERLINK(1)" and rows[0]["Tenant name"] == "'@evil"


def test_tenant_page_events_keyset(client_as, seed, now) -> None:
    at = now - timedelta(minutes=5)
    ids = seed.events(4, tenant_id="acme", created_at=at) + [seed.event(tenant_id="acme")]
    seed.event(tenant_id="globex")
    client = client_as("viewer")
    html = client.get("/tenants/acme?limit=4").get_data(as_text=True)
    shown = [int(i) for i in re.findall(r'<tr data-id="(\d+)"', html)]
    expected = [ids[-1]] + sorted(ids[:-1], reverse=True)
    assert shown == expected[:4]
    nxt = re.search(r'href="([^"]*after=[^"]*)" rel="next"', html).group(1)
    html2 = client.get(nxt.replace("&amp;", "&")).get_data(as_text=True)
    assert [int(i) for i in re.findall(r'<tr data-id="(\d+)"', html2)] == expected[4:]
    assert 'rel="next"' not in html2
    exact = client.get("/tenants/acme?limit=5").get_data(as_text=True)
    assert 'rel="next"' not in exact
    assert "Not mapped" in html   # acme has no mapping here


def test_bad_mapping_changes_nothing(client_as, seed) -> None:
    client = client_as("admin")
    token = csrf_of(client)
    for form in ({"tenant_id": "x", "stripe_customer_id": "acct_1"},
                 {"tenant_id": "", "stripe_customer_id": "cus_1"},
                 {"tenant_id": "x", "stripe_customer_id": ""}):
        before = seed.snapshot()
        resp = client.post("/tenants/mapping", data={**form, "csrf_token": token})
        assert resp.status_code == 303
        assert seed.snapshot() == before
    assert "Nothing changed" in client.get("/tenants").get_data(as_text=True)


def test_usage_of_an_empty_database(engine) -> None:
    now = utcnow()
    assert reads.tenant_usage(engine, start=now.date(), end=now.date()).rows == []
    with pytest.raises(ValueError):
        reads.tenant_usage(engine, start=now.date(), end=now.date() - timedelta(days=1))


def test_tenant_page_merges_events_in_flight_into_the_keyset(client_as, seed, now) -> None:
    """Events being sent are not in the tenant index (a claim writes no entry there); the
    page finds them apart and merges them in: every event once, newest first, both ways."""
    statuses = ["sent", "processing", "pending", "processing", "dead", "sent", "processing",
                "retrying", "resolved", "processing", "sent"]
    ids = []
    for i, status in enumerate(statuses):
        at = now - timedelta(minutes=30 - (i // 2))   # pairs share a created_at: ties by id
        extra = {"processing_deadline_at": now + timedelta(minutes=1),
                 "claim_token": f"t{i}", "claimed_by": "h:1:ab"} if status == "processing" else {}
        ids.append(seed.event(tenant_id="acme", status=status, created_at=at, **extra))
    seed.event(tenant_id="globex", status="processing", processing_deadline_at=now)
    expected = [ids[j] for j in sorted(range(len(ids)), key=lambda j: (j // 2, ids[j]),
                                       reverse=True)]
    client = client_as("viewer")
    pages, url = [], "/tenants/acme?limit=3"
    while url:
        html = client.get(url).get_data(as_text=True)
        pages.append([int(i) for i in re.findall(r'<tr data-id="(\d+)"', html)])
        nxt = re.search(r'href="([^"]*after=[^"]*)" rel="next"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert [i for p in pages for i in p] == expected
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    # And back: "Newer" from the last page shows the page before it.
    back = []
    while True:
        prev = re.search(r'href="([^"]*before=[^"]*)" rel="prev"', html)
        if not prev:
            break
        html = client.get(prev.group(1).replace("&amp;", "&")).get_data(as_text=True)
        back.append([int(i) for i in re.findall(r'<tr data-id="(\d+)"', html)])
    assert back == pages[-2::-1]


def test_usage_table_escapes_what_the_database_holds(client_as, seed, now) -> None:
    """The usage rows are built in Python (webapp.web.common.usage_rows): every string from
    the database is escaped, and each tenant links to its page for the same period."""
    evil = '<img src=x onerror="alert(1)">&'
    seed.tenant(evil, 'cus_<b>"', name="<script>alert(2)</script>")
    seed.event(tenant_id=evil, meter="m<i>", status="pending", quantity=7)
    html = client_as("viewer").get("/tenants").get_data(as_text=True)
    assert "<img src=x" not in html and "<script>alert(2)" not in html and "m<i>" not in html
    assert "cus_<b>" not in html
    row = re.search(r'<tr data-tenant="([^"]*)" data-meter="([^"]*)" data-customer="[^"]*">'
                    r'(.*?)</tr>', html)
    assert row.group(1) == "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;"
    assert row.group(2) == "m&lt;i&gt;"
    cells = row.group(3)
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in cells
    assert "<code>cus_&lt;b&gt;&#34;</code>" in cells
    start = reads.month_start(now).isoformat()
    href = re.search(r'<a href="([^"]*)">', cells).group(1)
    assert href == (f"/tenants/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E%26"
                    f"?from={start}&amp;to={now.date().isoformat()}")
    assert 'data-col="pending_quantity">7</td>' in cells


def test_page_says_how_fresh_the_rollups_are(client_as, seed, engine, now) -> None:
    """Page views never fold; the page says when the folder has not run for a while."""
    seed.event(status="sent", sent_at=now - timedelta(hours=2))
    client = client_as("viewer")
    html = client.get("/tenants").get_data(as_text=True)
    assert 'id="rollup-freshness"' in html and "has never been built" in html
    assert rollups.fold(engine, now=now, margin=rollups.fold_margin(30))
    html = client.get("/tenants").get_data(as_text=True)
    assert 'id="rollup-freshness"' not in html
    assert "sent totals summarised up to" in html


def test_a_new_tenant_mapped_twice_at_once_is_refused_not_a_500(engine) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from webapp.outbox.operations import OperationError, set_tenant

    def attempt(i: int) -> str:
        try:
            set_tenant(engine, "raced", stripe_customer_id=f"cus_R{i}", name=None,
                       now=utcnow(), actor="admin@example.com")
            return "mapped"
        except OperationError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert "mapped" in results
    assert all(r == "mapped" or "mapped by someone else at the same moment" in r
               for r in results), results


def test_tenant_page_honours_and_shows_the_period(client_as, engine, usage_data, now) -> None:
    client = client_as("viewer")
    last_day = reads.month_start(now) - timedelta(days=1)
    start, end = last_day, now.date()
    period = f"from={start.isoformat()}&to={end.isoformat()}"
    # the tenants page links each tenant with its period
    index = client.get(f"/tenants?{period}").get_data(as_text=True)
    assert f'href="/tenants/acme?{period.replace("&", "&amp;")}"' in index
    html = client.get(f"/tenants/acme?{period}").get_data(as_text=True)
    assert f"Period: <strong>{start.isoformat()} – {end.isoformat()}</strong>" in html
    assert f'href="/tenants?{period.replace("&", "&amp;")}"' in html          # and back
    assert re.search(r'href="/tenants\.csv\?[^"]*tenant=acme', html)
    usage = reads.tenant_usage(engine, start=start, end=end, tenant_id="acme")

    def sent_by_meter(page: str) -> dict[str, int]:
        table = page.split('id="tenant-usage"')[1].split("</table>")[0]
        return {m: int(n.replace(",", "")) for m, n in re.findall(
            r'<tr data-meter="([^"]+)">.*?data-col="sent_quantity">([^<]*)<', table)}

    shown = sent_by_meter(html)
    assert sum(shown.values()) == usage.total("quantity", "sent") == 5132
    assert shown == {m: usage.total("quantity", "sent", m) for m in shown}
    # units of different meters are never added into one total
    assert len(shown) == 2 and 'data-col="total_sent_quantity"' not in html
    # the default period (this month) gives other numbers: the period is not ignored
    default = client.get("/tenants/acme").get_data(as_text=True)
    assert sum(sent_by_meter(default).values()) == 132
    # the daily chart covers the period, a bar per day, and adds up to the sent events
    fig = html.split('id="tenant-daily"', 1)[1].split("</figure>", 1)[0]
    days = re.findall(r'<tr><th scope="row">(\d{4}-\d\d-\d\d)</th><td class="num">([\d,]+)<',
                      fig)
    assert [d for d, _ in days][0] == start.isoformat() and days[-1][0] == end.isoformat()
    assert len(days) == (end - start).days + 1
    assert sum(int(n.replace(",", "")) for _, n in days) == usage.total("events", "sent") == 11
