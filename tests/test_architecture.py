"""The layout's own rules that import-linter (``make lint``) does not express: nothing imports
the package root back, every product module stays a readable size, and no test double ships
in the product package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "webapp"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_submodule(name: str) -> bool:
    target = PACKAGE.parent.joinpath(*name.split("."))
    return target.with_suffix(".py").exists() or (target / "__init__.py").exists()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_imports_the_package_root(path: Path) -> None:
    """``from webapp import X`` (or ``from .. import X`` up to it) with X not a module of its
    own reaches into ``webapp/__init__``: the composition root must depend on everything,
    never the other way round."""
    if path == PACKAGE / "__init__.py":
        return
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            assert all(a.name != "webapp" for a in node.names), f"{here}: import webapp"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != "webapp":
                continue
            for alias in node.names:
                assert is_submodule(f"webapp.{alias.name}"), \
                    f"{here} imports {alias.name!r} from the package root"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_module_is_a_readable_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name}: {lines} lines; split it into two rooms"


def test_no_test_double_in_the_product() -> None:
    offenders = [p for p in PACKAGE.rglob("*.py") if "fake" in p.name or "testing" in p.parts]
    assert offenders == []


#: What only the input layer (``webapp/web/params.py``) reads of a request.
RAW_INPUT = {"args", "form", "values", "get_json", "json", "files"}


def test_only_the_input_layer_reads_parameters() -> None:
    """Every query parameter and form field goes through ``webapp.web.params`` (typed,
    ranged, refused with a 400 naming it). The Stripe webhook reads its raw body and its
    signature header, which is not a parameter: ``request.get_data`` stays allowed."""
    layer = PACKAGE / "web" / "params.py"
    offenders = []
    for path in sorted((PACKAGE / "web").rglob("*.py")):
        if path == layer:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in RAW_INPUT
                    and isinstance(node.value, ast.Name) and node.value.id == "request"):
                offenders.append(f"{path.name}:{node.lineno} request.{node.attr}")
    assert offenders == []


#: Where the environment is read: the settings, and ``serve``, which hands it whole to gunicorn.
READS_THE_ENVIRONMENT = {"webapp/config.py", "webapp/env_values.py", "webapp/web/cli/core.py"}


def test_settings_are_read_in_config_only() -> None:
    """Every variable a person sets is parsed, bounded and named in ``webapp/config.py``
    (through ``env_values.py``); nothing else reads ``os.environ`` or ``os.getenv``."""
    offenders = []
    for path in MODULES:
        name = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and name not in READS_THE_ENVIRONMENT):
                offenders.append(f"{name}:{node.lineno} os.{node.attr}")
    assert offenders == []


TESTS = Path(__file__).resolve().parent
#: Calls that read the clock: at import they fix a time that is stale by the time the suite
#: reaches the test (a busy machine takes minutes).
#: (``day_start`` and ``_ago`` are the tests' own helpers that read it.)
CLOCK_FUNCTIONS = {"utcnow", "day_start", "_ago"}
CLOCK_METHODS = {("datetime", "now"), ("datetime", "utcnow"), ("date", "today"),
                 ("time", "time"), ("time", "monotonic"), ("time", "perf_counter")}


def _import_time_clock_reads(tree: ast.Module) -> list[int]:
    """Lines of the calls that read the clock when the module is imported: module and class
    bodies, decorators, default values — not the bodies of functions and lambdas."""
    found: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for part in (*node.decorator_list, *node.args.defaults,
                         *(d for d in node.args.kw_defaults if d is not None)):
                visit(part)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in CLOCK_FUNCTIONS) or (
                    isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                    and (f.value.id, f.attr) in CLOCK_METHODS):
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_no_test_reads_the_clock_at_import() -> None:
    offenders = [f"{p.relative_to(TESTS.parent)}:{line}"
                 for p in sorted(TESTS.rglob("*.py")) if "node_modules" not in p.parts
                 for line in _import_time_clock_reads(ast.parse(p.read_text()))]
    assert offenders == []


def test_the_clock_rule_sees_what_runs_at_import() -> None:
    """The rule itself: a module constant, a default value and a decorator's argument read
    at import; a function's body does not."""
    tree = ast.parse("import time\nfrom datetime import datetime\n"
                     "T0 = utcnow()\n"
                     "def f(at=datetime.now()):\n    return time.time()\n"
                     "@mark(time.monotonic())\ndef g():\n    utcnow()\n"
                     "class C:\n    at = date.today()\n    def m(self):\n        utcnow()\n"
                     "h = lambda: utcnow()\n")
    assert _import_time_clock_reads(tree) == [3, 4, 6, 10]
