"""The geometry of the dashboard's SVG charts, worked out here so the templates only draw:
round ticks on the count axis, UTC time labels on the time axis, bars in a fixed viewBox.
Pure functions of the numbers; nothing here reads a request or a database."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..read.retries import Histogram
from ..read.series import Bucket

#: The viewBox: wide enough for 60 bars, small enough that text stays legible on a phone.
WIDTH, HEIGHT = 480, 200
LEFT, RIGHT, TOP, BOTTOM = 46, 14, 18, 38
#: The count axis gets this many intervals at most (so 4 to 7 ticks with 0).
MAX_INTERVALS = 6
MIN_INTERVALS = 3


def nice_ticks(peak: int) -> list[int]:
    """Round tick values from 0 to at least ``peak``: a step of 1, 2, 2.5 or 5 times a power
    of ten (a whole number), the smallest giving at most :data:`MAX_INTERVALS` intervals,
    and at least :data:`MIN_INTERVALS` of them (so a small or empty chart still has a scale)."""
    peak = max(0, int(peak))
    step = next(s for s in _steps() if math.ceil(peak / s) <= MAX_INTERVALS)
    intervals = max(MIN_INTERVALS, math.ceil(peak / step))
    return [i * step for i in range(intervals + 1)]


def _steps() -> Iterator[int]:
    """1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, …: the round whole-number steps."""
    power = 1
    while True:
        for factor in (1, 2, 2.5, 5):
            step = factor * power
            if step == int(step):
                yield int(step)
        power *= 10


def short_number(value: int) -> str:
    """A tick label: ``950``, ``7,500``, ``12.5k``, ``250k``, ``1M``, ``1.25M``, ``2B``."""
    if value < 10_000:
        return f"{value:,}"
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.4g}{suffix}"
    return str(value)  # unreachable: 10,000 and more have a suffix


@dataclass(frozen=True)
class Tick:
    at: float           # x or y in the viewBox
    label: str


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    tip: str            # what the bar's <title> says
    link: str | None = None     # the events it counts (the events list), if any


@dataclass(frozen=True)
class Row:
    """One line of the chart's table view."""

    label: str
    cells: tuple[int, ...]
    #: The events its last cell counts (the events list), if any.
    link: str | None = None


@dataclass(frozen=True)
class Chart:
    """Everything a template needs to draw one chart and its table."""

    id: str
    title: str
    x_title: str
    y_title: str
    bars: list[list[Bar]]           # one list per series (a stacked chart has several)
    series: list[str]               # series names (the legend; one empty name: no legend)
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    columns: list[str]              # the table's header after the first column
    first_column: str
    rows: list[Row]
    total: int
    peak: int
    width: int = WIDTH
    height: int = HEIGHT
    #: The events the total counts (the events list), if any.
    total_link: str | None = None

    @property
    def stacked(self) -> bool:
        """Bars split by named series (coloured, with a legend)."""
        return any(self.series)

    @property
    def left(self) -> int:
        return LEFT

    @property
    def right(self) -> int:
        return WIDTH - RIGHT

    @property
    def top(self) -> int:
        return TOP

    @property
    def bottom(self) -> int:
        return HEIGHT - BOTTOM


def _y_axis(peak: int) -> tuple[list[Tick], float]:
    """The count axis's ticks and the value at its top."""
    values = nice_ticks(peak)
    top = values[-1]
    span = HEIGHT - BOTTOM - TOP
    return [Tick(round(HEIGHT - BOTTOM - v / top * span, 2), short_number(v))
            for v in values], float(top)


def _height(value: int, top: float) -> float:
    return round(value / top * (HEIGHT - BOTTOM - TOP), 2) if top else 0.0


def time_label(start: datetime, bucket_seconds: int) -> str:
    """A bucket's start as shown under the chart (UTC): ``14:30``, ``14:00``, ``Dec 1``."""
    if bucket_seconds >= 86400:
        return f"{start:%b} {start.day}"
    return f"{start:%H:%M}"


def _time_ticks(buckets: Sequence[Bucket], bucket_seconds: int, slot: float) -> list[Tick]:
    """Labels at round times: every 10 minutes, every 4 hours (the date at midnight), or
    every day (every few days, counted back from the latest, when there are many)."""
    n = len(buckets)
    ticks: list[Tick] = []
    for i, b in enumerate(buckets):
        if bucket_seconds >= 86400:
            every = math.ceil(n / 7)
            if (n - 1 - i) % every == 0:
                ticks.append(Tick(round(LEFT + (i + 0.5) * slot, 2),
                                  time_label(b.start, bucket_seconds)))
            continue
        if bucket_seconds >= 3600:
            if b.start.hour % 4 == 0:
                label = f"{b.start:%b} {b.start.day}" if b.start.hour == 0 else f"{b.start:%H:%M}"
                ticks.append(Tick(round(LEFT + i * slot, 2), label))
        elif b.start.minute % 10 == 0:
            ticks.append(Tick(round(LEFT + i * slot, 2), f"{b.start:%H:%M}"))
    return ticks


def time_chart(chart_id: str, title: str, buckets: Sequence[Bucket], *, bucket_seconds: int,
               unit: str, x_title: str) -> Chart:
    """Bars over time: one per bucket, time labels in UTC, a count axis with round ticks."""
    n = max(1, len(buckets))
    slot = (WIDTH - LEFT - RIGHT) / n
    peak = max((b.count for b in buckets), default=0)
    y_ticks, top = _y_axis(peak)
    fmt = "%Y-%m-%d" if bucket_seconds >= 86400 else "%Y-%m-%d %H:%M"
    bars = []
    for i, b in enumerate(buckets):
        h = _height(b.count, top)
        if b.count and h < 1:
            h = 1.0          # a non-zero bucket stays visible
        bars.append(Bar(round(LEFT + i * slot + (0.5 if slot > 3 else 0), 2),
                        round(HEIGHT - BOTTOM - h, 2), round(max(slot - 1, 1), 2), h,
                        f"{b.start:{fmt}} UTC: {b.count:,} {unit}"))
    rows = [Row(f"{b.start:{fmt}}", (b.count,)) for b in buckets]
    return Chart(chart_id, title, x_title, unit, [bars], [""],
                 _time_ticks(buckets, bucket_seconds, slot), y_ticks,
                 [unit.capitalize()], "From (UTC)", rows, sum(b.count for b in buckets), peak)


def histogram_chart(chart_id: str, h: Histogram, max_attempts: int,
                    events_url: Callable[..., str] | None = None) -> Chart:
    """Events by attempt count, stacked by key, one bar per count from 0 to the largest of
    ``max_attempts`` and the counts present. ``events_url`` (the events list's address for
    some filters): each bar, row and the total then link to the events they count."""

    def link(**filters: Any) -> str | None:
        if events_url is None or h.status is None:
            return None  # a histogram of a sample (the latest sent) counts no filterable set
        return events_url(status=h.status, **filters)

    top_count = max([max_attempts, *h.rows.keys()])
    n = top_count + 1
    slot = (WIDTH - LEFT - RIGHT) / n
    y_ticks, top = _y_axis(h.max_bar)
    series: list[list[Bar]] = []
    base = [float(HEIGHT - BOTTOM)] * n
    for k in h.keys:
        bars = []
        for count in range(n):
            v = h.rows.get(count, {}).get(k, 0)
            if not v:
                continue
            hh = _height(v, top)
            base[count] -= hh
            bars.append(Bar(round(LEFT + count * slot + 1, 2), round(base[count], 2),
                            round(max(slot - 2, 1), 2), hh,
                            f"{count} attempt{'' if count == 1 else 's'}, {k}: {v:,}",
                            link(attempts=count)))
        series.append(bars)
    every = 1 if n <= 16 else math.ceil(n / 12)
    x_ticks = [Tick(round(LEFT + (c + 0.5) * slot, 2), str(c)) for c in range(n)
               if c % every == 0]
    rows = [Row(str(c), tuple(r.get(k, 0) for k in h.keys) + (sum(r.values()),),
                link(attempts=c))
            for c, r in h.rows.items()]
    return Chart(chart_id, h.label, "attempts that counted", "events", series, h.keys,
                 x_ticks, y_ticks, [*h.keys, "Total"], "Attempts", rows, h.total, h.max_bar,
                 total_link=link())
