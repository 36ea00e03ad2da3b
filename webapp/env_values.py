"""How an environment variable's text becomes a value: numbers with their bounds (and unit
suffixes), booleans, choices, URLs and the secret key's strength, each refusing a bad value
with one line that names the variable. :mod:`webapp.config` reads the variables; this module
only parses what it is handed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import urlparse


class ConfigError(ValueError):
    """A configuration value is missing, unparseable or unsafe. The message names the variable."""


#: Values copied from examples and templates instead of generated.
PLACEHOLDER_SECRETS = ("changeme", "changethis", "replaceme", "yoursecret", "secretkey",
                       "mysecret", "supersecret", "placeholder", "notasecret", "insecure",
                       "development", "defaultkey", "example", "password", "xxxxxxxx",
                       "12345678", "letmein", "sessionkey")


def secret_key_problem(key: str) -> str | None:
    """Why ``key`` is too weak to sign sessions, or None. Named in the one-line refusal."""
    if len(key.encode()) < 32:
        return f"SECRET_KEY is too short ({len(key.encode())} bytes; at least 32 are needed)"
    if len(set(key)) == 1:
        return "SECRET_KEY is one character repeated"
    for size in range(1, len(key) // 2 + 1):
        if len(key) % size == 0 and key == key[:size] * (len(key) // size):
            return f"SECRET_KEY is one block of {size} characters repeated"
    if len(set(key)) < 8:
        return f"SECRET_KEY uses only {len(set(key))} different characters"
    squashed = "".join(ch for ch in key.lower() if ch.isalnum())
    for word in PLACEHOLDER_SECRETS:
        if word in squashed:
            return f"SECRET_KEY looks like a placeholder (it contains {word!r})"
    return None


def url(name: str, raw: str | None) -> str | None:
    """An http(s) base URL without its trailing slash; None when unset."""
    if not raw:
        return None
    url = raw.strip().rstrip("/")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"{name} must be an http(s) URL, got {raw!r}")
    return url


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def number(env: Mapping[str, str], name: str, default: float, *, low: float, high: float,
            unit_suffixes: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    factor = 1.0
    if unit_suffixes and text[-1:] in _UNITS:
        factor, text = _UNITS[text[-1]], text[:-1]
    try:
        value = float(text) * factor
    except ValueError:
        raise ConfigError(f"{name}: not a number: {raw!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ConfigError(f"{name}: {raw!r} is outside {low:g}…{high:g}")
    return value


def integer(env: Mapping[str, str], name: str, default: int, *, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: not a whole number: {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}: {raw!r} is outside {low}…{high}")
    return value


def boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...],
            *, upper: bool = False) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper() if upper else raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    return value
