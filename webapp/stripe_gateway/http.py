"""The SDK's HTTP client interface on one shared urllib3 pool."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

import stripe
import urllib3


class Urllib3Client(stripe.HTTPClient):
    """The SDK's HTTP client interface on one shared urllib3 pool.

    The SDK's default (requests) spends about as much CPU per call on its own machinery as on
    the call; urllib3, which requests uses underneath, does the same work directly. Thread-safe:
    one pool serves every sending thread. No retries here: the outbox decides them.
    """

    name = "urllib3"

    def __init__(self, connect_timeout: float, read_timeout: float, *,
                 proxy: str | None = None, pool_size: int = 64) -> None:
        super().__init__(verify_ssl_certs=True, proxy=proxy)
        options: dict[str, Any] = dict(num_pools=4, maxsize=pool_size, block=False, retries=False,
                       timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
                       cert_reqs="CERT_REQUIRED", ca_certs=stripe.ca_bundle_path)
        self._pool: urllib3.PoolManager = (urllib3.ProxyManager(proxy, **options) if proxy
                                           else urllib3.PoolManager(**options))
        self._proxied = bool(proxy)
        # scheme://host[:port] -> its connection pool. Every call goes to Stripe's one host:
        # looking its pool up by the URL's prefix spares parsing each URL and normalizing a
        # pool key for it (about a tenth of the worker's CPU per call).
        self._origins: dict[str, urllib3.HTTPConnectionPool] = {}
        self._counter = itertools.count(1)
        self._calls = 0
        # Per thread: the calls it made, and the last answer's ``Request-Id`` (an SDK call
        # that returns nothing, the meter event stream's 200 ``{}``, leaves no
        # ``last_response`` to read it from).
        self._last = threading.local()

    @property
    def calls(self) -> int:
        """Requests made so far."""
        return self._calls

    @property
    def thread_calls(self) -> int:
        """Requests made so far by the calling thread."""
        return int(getattr(self._last, "calls", 0))

    def request(self, method: str, url: str, headers: Mapping[str, str] | None,
                post_data: Any = None, *, _usage: Any = None
                ) -> tuple[Any, int, Any]:  # the SDK decodes bytes as well as str
        self._calls = next(self._counter)  # atomic under threads, unlike += 1
        self._last.calls = getattr(self._last, "calls", 0) + 1
        self._last.request_id = None
        try:
            if self._proxied:
                resp = self._pool.request(method.upper(), url, body=post_data,
                                          headers=dict(headers or {}), retries=False)
            else:
                origin, path = _split_origin(url)
                pool = self._origins.get(origin)
                if pool is None:
                    pool = self._origins.setdefault(origin, self._pool.connection_from_url(url))
                resp = pool.urlopen(method.upper(), path, body=post_data,
                                    headers=dict(headers or {}), retries=False, redirect=False,
                                    assert_same_host=False)
        except urllib3.exceptions.HTTPError as exc:
            raise stripe.APIConnectionError(  # type: ignore[no-untyped-call]
                "Unexpected error communicating with Stripe. "
                f"(Network error: {type(exc).__name__}: {exc})", should_retry=True) from exc
        self._last.request_id = resp.headers.get("Request-Id")
        return resp.data, resp.status, resp.headers

    def last_request_id(self) -> str | None:
        """The ``Request-Id`` of the last answer this thread received (None before one)."""
        value = getattr(self._last, "request_id", None)
        return None if value is None else str(value)

    def request_stream(self, method: str, url: str, headers: Mapping[str, str] | None,
                       post_data: Any = None, *, _usage: Any = None) -> Any:
        raise NotImplementedError("streaming is not used by billing-outbox")

    def close(self) -> None:
        self._pool.clear()


def _split_origin(url: str) -> tuple[str, str]:
    """``("https://api.stripe.com", "/v1/billing/meter_events")`` from the full URL."""
    start = url.find("://")
    slash = url.find("/", start + 3 if start >= 0 else 0)
    return (url, "/") if slash < 0 else (url[:slash], url[slash:])
