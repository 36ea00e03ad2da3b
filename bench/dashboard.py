"""Dashboard at scale (issue 5, item 4): not measured yet, because the dashboard is not built.

It is excluded from the default run; ``python -m bench.run --only dashboard`` says so and
measures nothing.
"""

from __future__ import annotations

from typing import Any

from .common import Row

MESSAGE = "dashboard benchmarks: not yet (the dashboard is not built)"


def run(*_args: Any, log: Any = print, **_kwargs: Any) -> None:
    log(MESSAGE)


def rows(_res: Any = None) -> list[Row]:
    return [Row("Dashboard at scale", MESSAGE, "—")]
