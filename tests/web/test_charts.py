"""The charts: round ticks at every magnitude, UTC time labels for every range, the range
picker (a query parameter the live panel carries on), the table view, and the long ranges'
numbers (from the daily rollup) equal to counting the rows."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from webapp.db import reading
from webapp.outbox import rollups
from webapp.outbox.sql import T, as_utc
from webapp.read import overview, series
from webapp.read.retries import Histogram
from webapp.read.series import RANGES, Bucket
from webapp.web import charts


@pytest.mark.parametrize("peak", [0, 1, 7, 99, 1234, 10**6, 999_999, 123_456_789])
def test_ticks_are_round_evenly_spaced_and_cover_the_peak(peak: int) -> None:
    ticks = charts.nice_ticks(peak)
    assert 4 <= len(ticks) <= 7, ticks
    assert ticks[0] == 0 and ticks[-1] >= peak
    steps = {b - a for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(steps) == 1
    step = steps.pop()
    # 1, 2, 2.5 or 5 times a power of ten
    mantissa = step / 10 ** (len(str(step)) - 1)
    assert mantissa in (1, 2, 2.5, 5), step
    # the top tick is the first multiple of the step at or above the peak (no wasted room),
    # except that a tiny chart still has three intervals
    assert ticks[-1] - step < peak or len(ticks) == 4


def test_ticks_for_named_magnitudes() -> None:
    assert charts.nice_ticks(0) == [0, 1, 2, 3]
    assert charts.nice_ticks(1) == [0, 1, 2, 3]
    assert charts.nice_ticks(7) == [0, 2, 4, 6, 8]
    assert charts.nice_ticks(1234) == [0, 250, 500, 750, 1000, 1250]
    assert charts.nice_ticks(10**6) == [0, 200_000, 400_000, 600_000, 800_000, 1_000_000]
    labels = [charts.short_number(v) for v in charts.nice_ticks(10**6)]
    assert labels == ["0", "200k", "400k", "600k", "800k", "1M"]
    assert charts.short_number(1250) == "1,250" and charts.short_number(12_500) == "12.5k"


def buckets_for(key: str, now: datetime, counts: list[int] | None = None) -> list[Bucket]:
    rng = RANGES[key]
    step = rng.bucket
    if rng.by_day:
        first = datetime(now.year, now.month, now.day, tzinfo=UTC) - step * (rng.buckets - 1)
    else:
        s = int(step.total_seconds())
        first = datetime.fromtimestamp((int(now.timestamp()) // s) * s, UTC) \
            - step * (rng.buckets - 1)
    counts = counts or [i * 3 for i in range(rng.buckets)]
    return [Bucket(first + step * i, counts[i]) for i in range(rng.buckets)]


@pytest.mark.parametrize(("key", "label"), [
    ("1h", r"\d\d:\d0"), ("24h", r"(\d\d:00|[A-Z][a-z]{2} \d{1,2})"),
    ("7d", r"[A-Z][a-z]{2} \d{1,2}"), ("30d", r"[A-Z][a-z]{2} \d{1,2}")])
def test_time_axis_labels_per_range(key: str, label: str) -> None:
    now = datetime(2026, 11, 30, 13, 37, tzinfo=UTC)
    rng = RANGES[key]
    data = buckets_for(key, now)
    chart = charts.time_chart("c", "t", data, bucket_seconds=int(rng.bucket.total_seconds()),
                              unit="sent", x_title="time sent (UTC)")
    assert 4 <= len(chart.x_ticks) <= 8, [t.label for t in chart.x_ticks]
    assert all(re.fullmatch(label, t.label) for t in chart.x_ticks), chart.x_ticks
    xs = [t.at for t in chart.x_ticks]
    assert xs == sorted(xs) and chart.left <= xs[0] and xs[-1] <= chart.right
    assert len(chart.bars[0]) == rng.buckets and len(chart.rows) == rng.buckets
    assert [r.cells[0] for r in chart.rows] == [b.count for b in data]
    assert chart.total == sum(b.count for b in data)
    # the tallest bar reaches the value of its tick: heights are to scale
    top = charts.nice_ticks(chart.peak)[-1]
    tallest = max(chart.bars[0], key=lambda b: b.h)
    span = chart.bottom - chart.top
    assert abs(tallest.h - chart.peak / top * span) < 0.01
    if key == "7d":
        assert [t.label for t in chart.x_ticks][-1] == "Nov 30"   # the latest day is labelled
    if key == "1h":
        assert "13:30" in [t.label for t in chart.x_ticks]


def test_a_small_bar_stays_visible_and_zero_draws_nothing() -> None:
    now = datetime(2026, 11, 30, 13, 37, tzinfo=UTC)
    data = buckets_for("24h", now, [0] * 23 + [1_000_000])
    data[0] = Bucket(data[0].start, 1)
    chart = charts.time_chart("c", "t", data, bucket_seconds=3600, unit="sent", x_title="x")
    assert chart.bars[0][0].h == 1.0 and chart.bars[0][1].h == 0.0


def test_histogram_chart_stacks_and_labels_attempts() -> None:
    h = Histogram("Retrying now", {1: {"unknown": 3, "not_executed": 1}, 4: {"unknown": 7}},
                  ["unknown", "not_executed"])
    chart = charts.histogram_chart("h", h, 12)
    assert [t.label for t in chart.x_ticks] == [str(n) for n in range(13)]
    assert [t.label for t in chart.y_ticks] == ["0", "2", "4", "6", "8"]
    assert chart.rows[0].label == "1" and chart.rows[0].cells == (3, 1, 4)
    assert chart.columns == ["unknown", "not_executed", "Total"]
    unknown, not_executed = chart.bars
    assert not_executed[0].y + not_executed[0].h == pytest.approx(unknown[0].y)  # stacked


def sent(seed, n: int, *, occurred_at: datetime, sent_at: datetime, tenant_id: str = "acme"):
    return seed.events(n, status="sent", occurred_at=occurred_at, sent_at=sent_at,
                       tenant_id=tenant_id)


@pytest.mark.parametrize("key", ["7d", "30d"])
def test_long_ranges_equal_counting_rows_folded_or_not(engine, seed, now, key) -> None:
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    for days_ago, n in ((1, 3), (6, 1), (20, 4), (40, 5)):
        at = today - timedelta(days=days_ago) + timedelta(hours=1)
        sent(seed, n, occurred_at=at, sent_at=at + timedelta(minutes=1))   # folded first
    sent(seed, 2, occurred_at=now, sent_at=now)                            # folded last
    seed.events(3, status="dead", occurred_at=now)            # not sent: never counted
    seed.events(2, status="pending", occurred_at=now)

    def by_rows() -> dict[str, int]:
        with engine.connect() as conn:
            return Counter(as_utc(at).date().isoformat() for at in conn.execute(
                select(T.c.occurred_at).where(T.c.status == "sent")).scalars())

    def by_chart() -> list[Bucket]:
        return overview.overview(engine, now=now, chart_range=key).chart

    rng = RANGES[key]
    for step in ("live", "folded", "all folded"):
        if step == "folded":
            assert rollups.fold(engine, now=now, margin=rollups.fold_margin(30))
        if step == "all folded":
            rollups.fold(engine, now=now + timedelta(hours=2), margin=rollups.fold_margin(30))
        got = by_chart()
        assert len(got) == rng.buckets and got[-1].start == today
        expected = by_rows()
        assert {b.start.date().isoformat(): b.count for b in got if b.count} == {
            d: n for d, n in expected.items()
            if d >= (today - timedelta(days=rng.buckets - 1)).date().isoformat()}, step


def test_tenant_series_only_counts_that_tenant(engine, seed, now) -> None:
    sent(seed, 2, occurred_at=now, sent_at=now, tenant_id="acme")
    sent(seed, 5, occurred_at=now, sent_at=now, tenant_id="globex")
    with reading(engine) as conn:
        got = series.sent_by_occurrence_day(conn, now.date(), 3, tenant_id="acme")
    assert [b.count for b in got] == [0, 0, 2]


def test_short_ranges_count_by_time_sent(engine, seed, now) -> None:
    sent(seed, 2, occurred_at=now - timedelta(days=3), sent_at=now - timedelta(minutes=3))
    sent(seed, 1, occurred_at=now, sent_at=now - timedelta(hours=3))
    one_hour = overview.overview(engine, now=now, chart_range="1h")
    assert sum(b.count for b in one_hour.chart) == 2 and len(one_hour.chart) == 60
    day = overview.overview(engine, now=now, chart_range="24h")
    assert sum(b.count for b in day.chart) == 3 and len(day.chart) == 24


@pytest.mark.parametrize("key", ["1h", "24h", "7d", "30d"])
def test_overview_range_picker_axes_and_table(client_as, seed, now, key) -> None:
    seed.events(3, status="sent")
    client = client_as("viewer")
    html = client.get(f"/?range={key}").get_data(as_text=True)
    fig = html.split('id="sent-chart"', 1)[1].split("</figure>", 1)[0]
    assert 'role="img"' in fig and "aria-labelledby" in fig
    y_ticks = re.findall(r'class="tick y-tick"[^>]*>([^<]+)<', fig)
    assert y_ticks == ["0", "1", "2", "3"]
    x_ticks = re.findall(r'class="tick x-tick"[^>]*>([^<]+)<', fig)
    assert 4 <= len(x_ticks) <= 8
    assert "(UTC)" in fig and 'class="axis-title"' in fig
    assert "Show as table" in fig
    table_rows = re.findall(r'<tr><th scope="row">', fig)
    assert len(table_rows) == RANGES[key].buckets
    assert re.search(r'<td class="num">3</td>', fig)
    # the picker marks the range and the live panel keeps it
    assert re.search(rf'id="range-{key}" href="/\?range={key}"[^>]*aria-current="true"', html)
    assert f'hx-get="/?range={key}"' in html
    frag = client.get(f"/?range={key}", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert f'hx-get="/?range={key}"' in frag and 'id="sent-chart"' in frag


def test_overview_refuses_an_unknown_range(client_as) -> None:
    resp = client_as("viewer").get("/?range=2y")
    assert resp.status_code == 400 and "range" in resp.get_data(as_text=True)


def test_retries_histograms_have_a_count_axis_and_a_table(client_as, seed) -> None:
    seed.events(7, status="retrying", attempt_count=2)
    html = client_as("viewer").get("/retries").get_data(as_text=True)
    fig = html.split('id="hist-1"', 1)[1].split("</figure>", 1)[0]
    assert re.findall(r'class="tick y-tick"[^>]*>([^<]+)<', fig) == ["0", "2", "4", "6", "8"]
    assert "attempts that counted" in fig and "Show as table" in fig
    # even one key is named in a legend, and coloured as that key
    assert re.search(r'<ul class="legend"><li><span class="swatch s0"></span>not_executed</li>',
                     fig)
    assert '<rect class="seg s0"' in fig and "every bar is 0" not in fig
    empty = html.split('id="hist-2"', 1)[1].split("</figure>", 1)[0]      # nothing dead
    assert "every bar is 0" in empty and "<rect" not in empty
