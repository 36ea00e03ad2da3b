"""The lock files: every dependency pinned with hashes, in step with pyproject.toml, and what
each `make` target installs from them (`make run` the runtime alone)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\]+)")


def read_lock(name: str) -> dict[str, tuple[str, int]]:
    """{package: (version, number of hashes)}; fails on any line that is not a hashed pin."""
    pins: dict[str, tuple[str, int]] = {}
    current: str | None = None
    for raw in (ROOT / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash=sha256:"):
            assert current is not None, f"{name}: a hash before any pin: {raw!r}"
            assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( \\)?", line), raw
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
            continue
        m = PIN.match(line)
        assert m, f"{name}: not a pinned requirement: {raw!r}"
        current = canonicalize_name(m.group(1))
        assert current not in pins, f"{name}: {current} pinned twice"
        pins[current] = (m.group(2), 0)
    for package, (_, hashes) in pins.items():
        assert hashes >= 1, f"{name}: {package} has no hash"
    return pins


def project() -> dict[str, list[str]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"runtime": meta["dependencies"], **meta["optional-dependencies"]}


def test_every_line_is_a_hashed_pin() -> None:
    assert len(read_lock("requirements.lock")) >= 7
    assert len(read_lock("requirements-dev.lock")) > len(read_lock("requirements.lock"))


@pytest.mark.parametrize(("lock", "groups"), [
    ("requirements.lock", ("runtime",)),
    ("requirements-dev.lock", ("runtime", "dev", "bench")),
])
def test_lock_satisfies_pyproject(lock: str, groups: tuple[str, ...]) -> None:
    """Each requirement of pyproject.toml is pinned, at a version its range allows: a range
    changed without `make lock` fails here."""
    pins = read_lock(lock)
    deps = project()
    for group in groups:
        for spec in deps[group]:
            req = Requirement(spec)
            name = canonicalize_name(req.name)
            assert name in pins, f"{lock}: {req.name} ({group}) is not pinned; run make lock"
            assert req.specifier.contains(pins[name][0], prereleases=True), (
                f"{lock}: {req.name}=={pins[name][0]} is outside {req.specifier}; run make lock")
            for extra in req.extras:  # psycopg[binary] → psycopg-binary, pinned alike
                assert canonicalize_name(f"{req.name}-{extra}") in pins, (lock, spec)


def test_runtime_lock_has_no_tools_and_the_tools_keep_its_pins() -> None:
    runtime = read_lock("requirements.lock")
    dev = read_lock("requirements-dev.lock")
    tools = {canonicalize_name(Requirement(s).name) for g in ("dev", "bench")
             for s in project()[g]}
    assert not tools & set(runtime), tools & set(runtime)
    for package, (version, _) in runtime.items():
        assert dev[package][0] == version, f"{package}: {version} vs {dev[package][0]}"


def make_dry(target: str) -> str:
    return subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_make_run_installs_the_runtime_alone() -> None:
    out = make_dry("run")
    assert "--require-hashes -r requirements.lock" in out
    assert "requirements-dev" not in out and "[dev" not in out and "bench" not in out, out
    assert "pip install" in out and "--no-deps -e ." in out


def test_make_test_installs_the_tools_from_their_lock() -> None:
    out = make_dry("test")
    assert "--require-hashes -r requirements-dev.lock" in out
    assert re.search(r"pip install (?!.*--require-hashes)(?!.*--no-deps)", out) is None, out


@pytest.mark.slow
def test_fresh_venv_installs_from_the_lock(tmp_path: Path) -> None:
    """Hash-checking mode refuses any dependency the lock does not pin, so a clean install
    proves the runtime lock complete; `pip check` that the pins agree."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    done = subprocess.run([py, "-m", "pip", "install", "--quiet", "--require-hashes", "-r",
                           str(ROOT / "requirements.lock")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    got = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                         text=True, check=True).stdout
    installed = {canonicalize_name(line.split("==")[0]): line.split("==")[1]
                 for line in got.splitlines() if "==" in line}
    for package, (version, _) in read_lock("requirements.lock").items():
        assert installed.get(package) == version, (package, version, installed.get(package))

    # The package itself as the image installs it: a wheel, not editable, used from outside
    # the checkout. Its templates, static files and migrations travel inside it.
    wheels = tmp_path / "wheels"
    # Built by the lock's own setuptools and wheel, as the Dockerfile builds it.
    built = subprocess.run([py, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("billing_outbox-*.whl")
    done = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'outbox.sqlite3'}",
           "SECRET_KEY": "Gm2v9QkTz4-rWb7pXe1LhN0sYc8uJd3fA6oKi5qHt_E"}
    upgrade = subprocess.run([str(venv / "bin" / "billing-outbox"), "db", "upgrade"], env=env,
                             cwd=elsewhere, capture_output=True, text=True)
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]
    served = subprocess.run([py, "-c", SERVES_FROM_THE_WHEEL], env=env, cwd=elsewhere,
                            capture_output=True, text=True)
    assert served.returncode == 0, served.stderr[-3000:]
    assert served.stdout.split() == ["site-packages", "200", "200", "200"], served.stdout


#: Run by the fresh venv's Python: the app from the installed wheel answers a page (a
#: template) and two static files, and the package is the site-packages copy.
SERVES_FROM_THE_WHEEL = """
import webapp
from webapp.app import TEMPLATES, create_app
assert TEMPLATES.startswith(webapp.__path__[0]), TEMPLATES
print("site-packages" if "site-packages" in webapp.__file__ else webapp.__file__)
client = create_app().test_client()
for path in ("/login", "/static/app.css", "/static/htmx-2.0.11.min.js"):
    print(client.get(path).status_code)
"""


def test_every_package_and_template_folder_is_listed() -> None:
    """pyproject.toml names the packages one by one (the templates and static files are
    packages of their own there): a new folder under webapp/ or templates/ must be added."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "webapp").rglob("*")
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    on_disk |= {"webapp", "webapp.static", "webapp.templates"}
    on_disk |= {f"webapp.templates.{p.name}" for p in (ROOT / "templates").iterdir()
                if p.is_dir()}
    assert listed == on_disk


def test_the_dockerfile_installs_the_lock_on_a_pinned_base() -> None:
    """The contract's image: ``ARG BASE=python:3.11-slim@sha256:…`` then ``FROM ${BASE}``;
    the lock with ``--require-hashes`` into a venv of its own; the package as a wheel."""
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert re.fullmatch(r"ARG BASE=python:3\.11-slim@sha256:[0-9a-f]{64}", instructions[0])
    assert instructions[1] == "FROM ${BASE}"
    assert "python3.11 -m venv" in text
    assert "pip install --require-hashes -r /build/requirements.lock" in text
    assert "pip install --no-deps /tmp/wheel/billing_outbox-" in text
    assert " -e " not in text and "--editable" not in text
    assert "USER 10001:10001" in text
