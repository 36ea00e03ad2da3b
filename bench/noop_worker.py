"""``python -m bench.noop_worker``: ``billing-outbox worker`` with a no-op gateway.

The same process the CLI's ``worker`` command builds — ``create_app`` from the environment,
the app's ``Drainer`` (its engine, settings, thread pool, lane locks), ``run_drainer`` until
SIGTERM/SIGINT — except that the gateway delivers at once instead of calling Stripe. On exit it
writes every identifier it was handed, one a line, to ``$BENCH_SEEN_PATH``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def main() -> int:
    from webapp import create_app, services_of
    from webapp.worker import freeze_startup_objects, run_drainer

    from .drain import NoopGateway

    app = create_app(start_drainer=False)
    drainer = services_of(app).drainer()
    gateway = NoopGateway()
    drainer.check_meters = False  # the stand-in has no meters
    drainer.gateway = gateway

    def stop(signum: int, _frame: object) -> None:
        drainer.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    freeze_startup_objects()  # as the worker command does
    try:
        run_drainer(drainer)
    finally:
        Path(os.environ["BENCH_SEEN_PATH"]).write_text("\n".join(gateway.seen) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
