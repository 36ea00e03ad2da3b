"""The typed bag of collaborators that :func:`webapp.create_app` builds, one per app: views,
commands and the scheduler take what they need from it, so tests can hand in their own
(an engine, settings, a clock). Nothing here starts anything, and nothing of the worker is
loaded before a drainer, a gateway or the maintenance is first asked for (a command that only
reads does not load it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from flask import Flask
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from .config import Settings
from .models import utcnow

if TYPE_CHECKING:
    from .stripe_gateway import StripeGateway
    from .worker import Drainer, Scheduled

#: The key of ``app.extensions`` that holds the app's :class:`Services`.
EXTENSION = "billing_outbox"


@dataclass
class Services:
    """What the views, commands and scheduler share."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    clock: Callable[[], datetime] = utcnow
    #: Stops the in-app scheduler and its drainer (set when it runs).
    stop_scheduler: Callable[[], None] | None = None
    _drainer: Drainer | None = field(default=None, repr=False)
    _gateway: StripeGateway | None = field(default=None, repr=False)
    _gateway_made: bool = field(default=False, repr=False)
    _lock_engine: Engine | None = field(default=None, repr=False)

    def drainer(self) -> Drainer:
        """The process's drainer, built on first use. Refused (``ConfigError``, one line)
        through a transaction pooler without ``DATABASE_DIRECT_URL``: its lane and shard locks
        are session state (``webapp.pooler``); with it, they are taken over that URL."""
        if self._drainer is None:
            from .worker import Drainer

            self.check_session_state()
            self._drainer = Drainer(self.engine, self.settings, self.gateway(),
                                    clock=self.clock, lock_engine=self.lock_engine())
        return self._drainer

    def check_session_state(self) -> None:
        """Raise ``ConfigError`` when what holds session state cannot run here."""
        from .config import ConfigError
        from .pooler import session_state_problem

        problem = session_state_problem(self.settings)
        if problem is not None:
            raise ConfigError(problem)

    def lock_engine(self) -> Engine | None:
        """The engine of ``DATABASE_DIRECT_URL`` (the lane and shard locks), or None: the
        main engine serves them."""
        if self._lock_engine is None and self.settings.database_direct_url:
            from .db import make_engine

            self._lock_engine = make_engine(self.settings.database_direct_url, pool_size=1,
                                            max_overflow=2)
        return self._lock_engine

    def gateway(self) -> StripeGateway | None:
        """The process's Stripe gateway (None without a key), built on first use: the drainer,
        the maintenance services, the pages and the commands all call Stripe through it."""
        if not self._gateway_made:
            from .worker import gateway_from

            self._gateway, self._gateway_made = gateway_from(self.settings), True
        return self._gateway

    def maintenance(self) -> list[Scheduled]:
        """The maintenance services (rescuer, rollup folder) with their cadence."""
        from .worker import services_for

        return services_for(self.engine, self.settings, self.gateway(), clock=self.clock)


def services_of(app: Flask) -> Services:
    """The app's services (built by ``create_app``)."""
    svc = app.extensions[EXTENSION]
    assert isinstance(svc, Services)
    return svc
