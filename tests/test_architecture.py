"""The layout's own rules that import-linter (``make lint``) does not express: nothing imports
the package root back, every product module stays a readable size, and no test double ships
in the product package."""

from __future__ import annotations

import ast
import re
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


TEMPLATES = PACKAGE.parent / "templates"
#: A status name as a whole string, or quoted inside one (SQL text, a template's literal).
QUOTED_STATUS = re.compile(r"""['"](pending|processing|retrying|sent|dead|resolved|rejected"""
                           r"""|cancelled|failed)['"]""")


def _quoted_statuses(source: str) -> list[tuple[int, str]]:
    """Where a module spells a status: a string constant that is one (docstrings aside), or
    holds one quoted."""
    from webapp.status import ALL, DELIVERY_ALL

    words = set(ALL) | set(DELIVERY_ALL)
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings
            and (n.value in words or QUOTED_STATUS.search(n.value))]


#: The same words meaning something else, where they are spelled: (file, word) -> what it is.
HOMONYMS: dict[tuple[str, str], str] = {
    ("webapp/notify_settings.py", "rejected"): "an alert kind",
    ("webapp/read/overview.py", "rejected"): "an alert kind",
    ("webapp/outbox/reconciliation.py", "pending"): "a run's count of buckets still settling",
    ("webapp/read/reconciliation.py", "pending"): "a run's count of buckets still settling",
    ("templates/reconciliation/index.html", "pending"): "a run's count of buckets still settling",
    ("webapp/outbox/rejections.py", "rejected"): "an error sample's outcome",
    ("webapp/read/stripe_side.py", "rejected"): "an error sample's outcome",
    ("webapp/read/event_billing.py", "pending"): "a unit's place: no finalized line yet",
    ("templates/events/show.html", "pending"): "a unit's place; an adjustment's status at Stripe",
    ("webapp/read/usage_table.py", "dead"): "the Tenants & usage filter ?only=dead",
    ("webapp/web/tenants.py", "dead"): "the Tenants & usage filter ?only=dead",
    ("webapp/web/tenants.py", "sent"): "a chart's unit",
    ("webapp/web/dashboard.py", "sent"): "a chart's unit",
    ("webapp/web/cli/notify.py", "sent"): "a test message's outcome, in words",
    ("webapp/web/notifications.py", "sent"): "a test message's outcome, in words",
    ("webapp/web/rejected.py", "rejected"): "the Rejected page's blueprint",
    ("webapp/worker/drainer.py", "sent"): "a drain pass's count",
    ("webapp/worker/drainer.py", "retrying"): "a drain pass's count",
    ("webapp/worker/drainer.py", "dead"): "a drain pass's count",
    ("webapp/worker/stripe_events.py", "rejected"): "a poll's count, in its JSON",
    ("webapp/worker/notify/channels.py", "resolved"): "an alert's state",
    ("webapp/worker/notify/notifier.py", "resolved"): "an alert's state",
}


def test_statuses_are_spelled_in_their_module_only() -> None:
    """``webapp.status`` holds every status and group; a quoted status anywhere else in the
    product (Python or template) is a copy that can drift. Migrations keep theirs; a word
    that means something else there is listed in :data:`HOMONYMS` with what it is."""
    offenders = [f"{p.relative_to(PACKAGE.parent)}:{line}: {value!r}"
                 for p in MODULES if p != PACKAGE / "status.py"
                 for line, value in _quoted_statuses(p.read_text())
                 if (str(p.relative_to(PACKAGE.parent)), value) not in HOMONYMS]
    offenders += [f"{p.relative_to(PACKAGE.parent)}:{n}: {word!r}"
                  for p in sorted(TEMPLATES.rglob("*.html"))
                  for n, text in enumerate(p.read_text().splitlines(), 1)
                  for word in QUOTED_STATUS.findall(text)
                  if (str(p.relative_to(PACKAGE.parent)), word) not in HOMONYMS]
    assert offenders == []


def test_the_status_module_is_a_leaf() -> None:
    """``webapp.status`` imports the standard library only: everything can read it."""
    tree = ast.parse((PACKAGE / "status.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and not n.level}
    relative = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == [] and imported <= {"__future__", "collections", "enum"}


def test_the_status_rule_sees_constants_and_sql_but_not_docstrings() -> None:
    source = ('"""Module: \'sent\' here is prose."""\n'
              'A = "dead"\nB = "status IN (\'pending\')"\nC = f"x {y} \'sent\'"\n'
              'def f():\n    """\'sent\'"""\n    return "deadline"\n')
    assert [line for line, _ in _quoted_statuses(source)] == [2, 3, 4]
