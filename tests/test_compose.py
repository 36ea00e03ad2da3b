"""compose.yaml, the documented small-team deployment: parsed and read the way Compose reads
it (merge keys, ``${VAR:?…}`` and ``${VAR:-default}``), then each service's environment given
to the product's own settings parser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cli
from sqlalchemy.engine import make_url

from webapp.config import ConfigError, Settings

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ("POSTGRES_PASSWORD", "SECRET_KEY", "STRIPE_API_KEY")
SAMPLE = {"POSTGRES_PASSWORD": "pw-from-env",
          "SECRET_KEY": "Gm2v9QkTz4-rWb7pXe1LhN0sYc8uJd3fA6oKi5qHt_E",
          "STRIPE_API_KEY": "rk_test_" + "x" * 24}
_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::([?-])([^}]*))?\}")


class Missing(Exception):
    """A ``${VAR:?message}`` whose variable is unset: Compose refuses to start."""


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation of ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == "?":
            raise Missing(f"{name}: {arg}")
        return arg or ""

    return _VAR.sub(one, value)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    return interpolate(raw, SAMPLE)


def test_three_services_from_one_image(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"app", "worker", "db"}
    for name in ("app", "worker"):
        assert services[name]["build"] == "."
        assert services[name]["image"] == services["app"]["image"]
        assert services[name]["depends_on"] == {"db": {"condition": "service_healthy"}}
        assert services[name]["restart"] == "unless-stopped"
    assert (ROOT / "Dockerfile").is_file()
    assert "pgdata" in compose["volumes"]
    assert services["db"]["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])


def test_each_secret_is_required_and_never_written_in(raw: dict[str, Any]) -> None:
    text = (ROOT / "compose.yaml").read_text()
    for name in SECRETS:
        assert f"${{{name}:?" in text, f"{name} must be required (${{{name}:?…}})"
        with pytest.raises(Missing, match=name):
            interpolate(raw, {k: v for k, v in SAMPLE.items() if k != name})
    assert not re.search(r"(sk|rk)_(live|test)_[A-Za-z0-9]", text)
    example = (ROOT / ".env.example").read_text()
    for name in SECRETS:
        assert re.search(rf"^{name}=$", example, re.M), f".env.example names {name}, empty"
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    assert ".env" in (ROOT / ".dockerignore").read_text().split()


def test_the_product_accepts_each_services_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    db_env = services["db"]["environment"]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`",
                                (ROOT / "docs" / "configuration.md").read_text()))
    parsed = {}
    for name in ("app", "worker"):
        env = {k: str(v) for k, v in services[name]["environment"].items()}
        assert set(env) <= documented, f"{name}: {set(env) - documented} not documented"
        settings = Settings.from_env(env)
        url = make_url(settings.database_url)
        assert (url.host, url.port, url.database) == ("db", 5432, db_env["POSTGRES_DB"])
        assert (url.username, url.password) == (db_env["POSTGRES_USER"],
                                                 SAMPLE["POSTGRES_PASSWORD"])
        assert settings.secret_key == SAMPLE["SECRET_KEY"]
        assert settings.stripe_api_key == SAMPLE["STRIPE_API_KEY"]
        parsed[name] = settings
    # The worker drains; the dashboard's own drainer is off, so one process sends.
    assert parsed["worker"].drainer_enabled and not parsed["app"].drainer_enabled
    # Behind a TLS proxy the two settings the comment names take effect.
    proxied = interpolate(yaml.safe_load((ROOT / "compose.yaml").read_text()),
                          {**SAMPLE, "TRUSTED_PROXIES": "1", "SESSION_COOKIE_SECURE": "true"})
    behind = Settings.from_env({k: str(v) for k, v in
                                proxied["services"]["app"]["environment"].items()})
    assert behind.trusted_proxies == 1 and behind.session_cookie_secure is True


def test_a_bad_setting_in_the_environment_is_refused_not_ignored(
        compose: dict[str, Any]) -> None:
    env = {k: str(v) for k, v in compose["services"]["app"]["environment"].items()}
    with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
        Settings.from_env({**env, "TRUSTED_PROXIES": "many"})


def test_commands_and_grace(compose: dict[str, Any]) -> None:
    services = compose["services"]
    # The app runs the image's own command (migrate, then serve); the worker migrates too
    # (the migration takes a lock, so the two wait for each other), then drains.
    assert "command" not in services["app"]
    assert services["worker"]["command"] == [
        "sh", "-c", "billing-outbox db upgrade && exec billing-outbox worker"]
    assert services["worker"]["healthcheck"] == {"disable": True}
    assert services["app"]["ports"] == ["127.0.0.1:8000:8000"]
    worker = Settings.from_env({k: str(v) for k, v in
                                services["worker"]["environment"].items()})
    for name in ("app", "worker"):
        grace = services[name]["stop_grace_period"]
        m = re.fullmatch(r"(\d+)s", grace)
        assert m, grace
        # Longer than gunicorn's graceful timeout (30 s) and a Stripe call in flight.
        assert int(m.group(1)) > max(30, worker.longest_call_seconds)


def test_the_commands_it_runs_exist(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": SAMPLE["SECRET_KEY"],
           "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}"}
    for args in (("worker", "--help"), ("db", "upgrade", "--help"), ("serve", "--help")):
        done = cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)
