"""Modules depend downward only: a static check of every import in the project's packages
(and none of them needs a package installed for the tests only).

Read with ``ast`` (nothing is imported), so an import inside a function, under
``TYPE_CHECKING`` or through ``importlib.import_module("...")`` / ``import_string("...")`` with
a literal counts as much as one at the top of a module. Dotted paths in settings (runner
``BACKEND``s) are configuration, not imports, and are not checked here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("tms_core", "runners", "tasks_app", "executions", "notifications", "tms_project", "tooling", "tests")
PRODUCTION = ("tms_core", "runners", "tasks_app", "executions", "notifications", "tms_project")

#: Installed for the suite only (requirements-dev.txt): no production module needs them.
TEST_ONLY = frozenset({"pytest", "pytest_django", "factory", "hypothesis", "aiosmtpd", "schemathesis", "croniter"})
#: For each production package, the packages it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "tms_core": TEST_ONLY | (frozenset(PROJECT) - {"tms_core"}),  # the shared basics sit below everything
    "runners": TEST_ONLY | {"tasks_app", "executions", "notifications", "tms_project", "tooling", "tests"},
    # Notifications sit above executions: the outbox is filled by database triggers, so neither
    # tasks nor executions know of them.
    "tasks_app": TEST_ONLY | {"notifications", "tooling", "tests"},
    "executions": TEST_ONLY | {"notifications", "tooling", "tests"},
    "notifications": TEST_ONLY | {"tooling", "tests", "backoffice"},
    "tms_project": TEST_ONLY | {"tooling", "tests"},
}
_DYNAMIC = {"import_module", "import_string", "__import__"}


def imports_of(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of every module that ``source`` (the text of ``module``) imports."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield node.lineno, target
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0]
            if name in _DYNAMIC and isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def violations_in(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """What ``module`` imports against the rules of its top-level package, as ``module:line -> name``."""
    forbidden = FORBIDDEN.get(module.split(".")[0], frozenset())
    return [
        f"{module}:{line} -> {name}"
        for line, name in imports_of(source, module, is_package=is_package)
        if name.split(".")[0] in forbidden
    ]


def _modules(package: str) -> Iterator[tuple[Path, str]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", PRODUCTION)
def test_production_packages_import_only_downward(package):
    modules = list(_modules(package))
    assert len(modules) >= 3, f"found no modules under {package}/"  # a check of nothing passes vacuously
    found = [
        violation
        for path, module in modules
        for violation in violations_in(path.read_text(), module, is_package=path.name == "__init__.py")
    ]
    assert found == [], f"{package} imports what it must not: {found}"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("executions.monitor", "from tooling.harness import bench", ["executions.monitor:1 -> tooling.harness"]),
        ("tasks_app.api", "def f():\n    import tests.factories", ["tasks_app.api:2 -> tests.factories"]),
        ("runners.http", "from tasks_app.models import Task", ["runners.http:1 -> tasks_app.models"]),
        ("runners.http", "from executions import transitions", ["runners.http:1 -> executions"]),
        ("runners.noop", "import tms_project.settings", ["runners.noop:1 -> tms_project.settings"]),
        ("tms_core.conf", "from runners.base import Runner", ["tms_core.conf:1 -> runners.base"]),
        ("tms_project.urls", "importlib.import_module('tooling.scale')", ["tms_project.urls:1 -> tooling.scale"]),
        ("runners.http", "from .base import Runner\nfrom tms_core.durations import parse", []),
        ("executions.services", "from tasks_app.models import Task\nfrom runners import registry", []),
        ("tasks_app.schedules", "from croniter import croniter", ["tasks_app.schedules:1 -> croniter"]),
        ("tooling.scale", "from executions.materialiser import materialise_due", []),
        ("executions.runs", "from notifications import dispatch", ["executions.runs:1 -> notifications"]),
        ("notifications.dispatch", "from executions.models import Execution", []),  # tooling may use the product
    ],
)
def test_the_check_sees_each_kind_of_import(module, source, expected):
    assert violations_in(source, module) == expected


def test_relative_imports_resolve_against_their_package():
    # A relative import never leaves its top-level package, so it can break no rule; it must
    # still resolve, so that a rule on a sub-package would see it.
    assert list(imports_of("from . import base\nfrom ..tms_core import clock", "runners.backends.http")) == [
        (1, "runners.backends"),
        (2, "runners.tms_core"),
    ]
    assert list(imports_of("from .http import HttpRunner", "runners.backends", is_package=True)) == [
        (1, "runners.backends.http")
    ]
