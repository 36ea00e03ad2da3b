"""``GET /api/openapi.json`` is true of the served app: schemathesis (PyPI) drives
``billing-outbox serve`` (gunicorn, one process, PostgreSQL) from the document — valid and
invalid batches, broken bodies, other content types — with a real ingest token, and every
answer must be one the document describes: no 5xx, each status, content type, header and body
as written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from conftest import worker_env
from hypothesis import HealthCheck, settings
from support.served import served

from webapp.db import make_engine
from webapp.models import utcnow
from webapp.outbox.tokens import create_token

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from conftest import _pg_database

    tmp = tmp_path_factory.mktemp("openapi")
    gen = _pg_database()
    url = next(gen)
    engine = make_engine(url)
    try:
        _, token = create_token(engine, "schemathesis", rate_per_second=10_000,
                                actor="test", now=utcnow())
        env = worker_env(url, "http://127.0.0.1:9", DRAINER_ENABLED="false")
        with served(env, Path(tmp) / "serve.log") as base:
            yield {"base": base, "token": token, "engine": engine}
    finally:
        engine.dispose()
        gen.close()


@pytest.fixture(scope="module")
def api_schema(api: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_url(api["base"] + "/api/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_as_the_document_says(case: Any, api: dict[str, Any]) -> None:
    # Every check but one: "negative data rejection" expects a request the document calls
    # invalid to be answered 400/422-like, and a batch over 1,000 events is answered 413 (as
    # the contract says), which its list does not include. No 5xx, statuses, content types,
    # headers, bodies and undeclared methods are all checked.
    from schemathesis.specs.openapi.checks import negative_data_rejection

    case.call_and_validate(headers={"Authorization": f"Bearer {api['token']}"},
                           excluded_checks=[negative_data_rejection])


def test_the_document_names_what_the_contract_does(api: dict[str, Any]) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(api["base"] + "/api/openapi.json", timeout=10) as r:  # noqa: S310
        doc = json.load(r)
    assert doc["openapi"] == "3.1.0"
    op = doc["paths"]["/api/v1/usage"]["post"]
    assert set(op["responses"]) >= {"200", "400", "401", "403", "413", "415", "429"}
    event = doc["components"]["schemas"]["UsageEvent"]
    assert event["required"] == ["tenant_id", "quantity", "idempotency_key"]
    assert doc["components"]["schemas"]["Batch"]["properties"]["events"]["maxItems"] == 1000
