"""Modules depend downward only: every product package has a rank, a module imports only its own
package or a lower rank, and no module takes part in an import cycle.

Read with ``ast`` (nothing is imported), so an import inside a function, under
``TYPE_CHECKING`` or through ``importlib.import_module("...")`` / ``import_string("...")`` with
a literal counts as much as one at the top of a module. So does any other string literal that is
a dotted path into a ranked package (``target_class = "tasks_api.serializers.X"``, a lazy model
reference, a permission name): knowledge of a higher layer is a climb whether or not it is an
``import``. Dotted paths in settings (runner ``BACKEND``s, DRF classes) are configuration read by
the top, which may name anything. docs/architecture.md's layer table is :data:`RANKS` (checked below).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The product's packages, lowest first, with what each holds (docs/architecture.md shows this
#: table). A module may import its own package and any package before it, never one after it.
RANKS: tuple[tuple[str, str], ...] = (
    ("tms_core", "basics below everything; `api/`: REST plumbing (base views, errors, keyset pages, parsers, schema)"),
    ("runners", "the runner interface, registry and backends; never touch the database"),
    (
        "tasks_app",
        "the task core the engine needs: Task model, teams (`teams/`: the rule and its services), schedules, "
        "secrets, quotas, audit log, artifacts",
    ),
    (
        "teams_api",
        "the teams' REST layer: `/api/v1/teams` and members, and the scoping every API over team-owned rows "
        "shares (views, the `team` field, `?team=`); the rule itself is `tasks_app/teams/`",
    ),
    ("executions", "the engine: Execution models, transitions, materialiser, monitor, worker services, Celery tasks"),
    ("tasks_api", "tasks as users see them: task services, REST API, serializers, selectors, admin, named limits"),
    (
        "accounts",
        "who calls the API and the pages: personal access tokens, their authentication and scopes; single sign-on "
        "(OpenID Connect: `oidc.py`, `sso.py`, the groups' roles in `roles.py`); service accounts and their tokens",
    ),
    ("notifications", "channels, rules, the outbox's dispatch"),
    ("ops", "health checks, metrics, the outage middleware, `manage.py tms_check`"),
    ("backoffice", "the operator pages"),
    ("tms_project", "the top: settings, URLs, the Celery app, WSGI; imported by nothing but entry points"),
    ("tooling", "benchmark, chaos and demo harness; never imported by the product, not installed in production"),
)
PACKAGES = tuple(package for package, _ in RANKS)
RANK = {package: rank for rank, package in enumerate(PACKAGES)}
#: Installed for the suite only (requirements-dev.txt): no production module needs them.
TEST_ONLY = frozenset({"pytest", "pytest_django", "factory", "hypothesis", "aiosmtpd", "schemathesis", "croniter"})
#: Not product code at all: nothing ranked may import it.
ABOVE_ALL = frozenset({"tests"})
_DYNAMIC = {"import_module", "import_string", "__import__"}
#: A string that is nothing but a dotted path (``package.module.Name``, ``app_label.Model``).
_DOTTED = re.compile(r"[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def imports_of(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of every module that ``source`` (the text of ``module``) imports.

    ``from a import b`` yields ``a.b``: the caller decides whether that names a module or
    something defined in ``a``.
    """
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
            for alias in node.names:
                yield node.lineno, target if alias.name == "*" else f"{target}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0]
            if name in _DYNAMIC and isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def dotted_strings_of(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of every string literal of ``source`` that names something of a ranked
    package: what a module knows of another by name, without importing it. A dotted path, an app
    label handed to ``get_app_config``/``get_model``, or an ``(app label, model)`` pair."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            if node.value.split(".")[0] in RANK:
                yield node.lineno, node.value
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in {"get_app_config", "get_model"}:
            labels = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            if labels and labels[0] in RANK:
                yield node.lineno, ".".join(labels)
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
            label, model = node.elts
            named = isinstance(label, ast.Constant) and label.value in RANK and isinstance(model, ast.Constant)
            if named and isinstance(model.value, str) and model.value.isidentifier():
                yield node.lineno, f"{label.value}.{model.value}"


def _migration_dependencies(source: str) -> set[str]:
    """The apps a migration's ``dependencies`` name (Django runs migrations in that order)."""
    apps = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "dependencies" for t in node.targets):
            for item in getattr(node.value, "elts", []):
                if isinstance(item, ast.Tuple) and isinstance(item.elts[0], ast.Constant):
                    apps.add(str(item.elts[0].value))
    return apps


def violations_in(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """What ``module`` imports against the ranks, as ``module:line -> name``.

    An import of a higher rank is one; so is an import of ``tests``, or, from a production
    package, of a package installed for the suite only. A migration may import another app's
    migration when it depends on that app: migrations are ordered by their graph, not by rank.
    """
    own = module.split(".")[0]
    production = own != "tooling"
    migration_deps = _migration_dependencies(source) if ".migrations." in module else set()

    def forbidden(name: str) -> bool:
        top = name.split(".")[0]
        if top in ABOVE_ALL or (production and top in TEST_ONLY):
            return True
        climbs = top in RANK and RANK[top] > RANK[own]
        return climbs and not (".migrations." in name and top in migration_deps)

    named = {*imports_of(source, module, is_package=is_package), *dotted_strings_of(source)}
    return [f"{module}:{line} -> {name}" for line, name in sorted(named) if forbidden(name)]


def modules_under(root: Path, package: str) -> Iterator[tuple[Path, str]]:
    """(path, dotted name) of every module of ``package`` under ``root``."""
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports; ``sources`` maps a module to (its text,
    whether it is a package). A name inside a module counts as an import of that module."""

    def module_of(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, (source, is_package) in sources.items():
        targets = {module_of(name) for _, name in imports_of(source, module, is_package=is_package)}
        graph[module] = {target for target in targets if target and target != module}
    return graph


def cycles_in(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module,
    sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def check_tree(root: Path, packages: Iterable[str] = PACKAGES) -> tuple[list[str], list[list[str]]]:
    """(rank violations, import cycles) of the packages under ``root``."""
    sources = {
        module: (path.read_text(), path.name == "__init__.py")
        for package in packages
        for path, module in modules_under(root, package)
    }
    violations = [
        violation
        for module, (source, is_package) in sources.items()
        for violation in violations_in(source, module, is_package=is_package)
    ]
    return violations, cycles_in(import_graph(sources))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_ranked_and_imports_only_downward(package):
    modules = list(modules_under(ROOT, package))
    assert len(modules) >= 3, f"found no modules under {package}/"  # a check of nothing passes vacuously
    found = [
        violation
        for path, module in modules
        for violation in violations_in(path.read_text(), module, is_package=path.name == "__init__.py")
    ]
    assert found == [], f"{package} (rank {RANK[package]}) imports a higher rank: {found}"


def test_no_import_cycle_among_the_products_modules():
    _, cycles = check_tree(ROOT)
    assert cycles == []


def test_every_python_package_of_the_product_has_a_rank():
    unranked = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in RANK and path.parent.name not in ABOVE_ALL
    }
    assert unranked == set(), f"give these packages a place in RANKS (and docs/architecture.md): {unranked}"


def test_nothing_imports_tms_project_but_itself():
    # The top is configuration and entry points (manage.py, wsgi, celery -A tms_project), named
    # by string in the settings: never a library.
    found = [
        f"{module}:{line} -> {name}"
        for package in PACKAGES
        if package != "tms_project"
        for path, module in modules_under(ROOT, package)
        for line, name in imports_of(path.read_text(), module, is_package=path.name == "__init__.py")
        if name.split(".")[0] == "tms_project"
    ]
    assert found == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("executions.monitor", "from tooling.harness import bench", ["executions.monitor:1 -> tooling.harness.bench"]),
        ("tasks_api.api", "def f():\n    import tests.factories", ["tasks_api.api:2 -> tests.factories"]),
        ("runners.http", "from tasks_app.models import Task", ["runners.http:1 -> tasks_app.models.Task"]),
        ("runners.http", "from executions import transitions", ["runners.http:1 -> executions.transitions"]),
        ("runners.noop", "import tms_project.settings", ["runners.noop:1 -> tms_project.settings"]),
        ("tms_core.conf", "from runners.base import Runner", ["tms_core.conf:1 -> runners.base.Runner"]),
        ("tms_project.urls", "importlib.import_module('tooling.scale')", ["tms_project.urls:1 -> tooling.scale"]),
        ("tms_core.api.base", "import_string('tasks_app.roles.x')", ["tms_core.api.base:1 -> tasks_app.roles.x"]),
        # The engine below the task services: the climb that issue 29 removed.
        ("executions.api", "from tasks_api import creation", ["executions.api:1 -> tasks_api.creation"]),
        (
            "tasks_app.models",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from executions.models import Execution",
            ["tasks_app.models:3 -> executions.models.Execution"],
        ),
        ("runners.http", "from .base import Runner\nfrom tms_core.durations import parse", []),
        ("executions.services", "from tasks_app.models import Task\nfrom runners import registry", []),
        ("tasks_app.schedules", "from croniter import croniter", ["tasks_app.schedules:1 -> croniter.croniter"]),
        ("tooling.scale", "from executions.materialiser import materialise_due", []),
        ("tooling.bench", "import pytest", []),  # tooling is never installed in production
        ("executions.runs", "from notifications import dispatch", ["executions.runs:1 -> notifications.dispatch"]),
        ("notifications.dispatch", "from executions.models import Execution", []),
        ("backoffice.views", "from tasks_api.creation import task_create", []),
        # Names of a higher layer in strings: knowledge without an import.
        (
            "tms_core.api.schema",
            'target_class = "tasks_api.serializers.LocalDateTimeField"',
            ["tms_core.api.schema:1 -> tasks_api.serializers.LocalDateTimeField"],
        ),
        (
            "tms_core.roles",
            'VIEWS = [("executions", "execution")]\nP = "executions.view_execution"',
            ["tms_core.roles:1 -> executions.execution", "tms_core.roles:2 -> executions.view_execution"],
        ),
        (
            "tasks_app.apps",
            'connect(f, sender=apps.get_app_config("executions"))',
            ["tasks_app.apps:1 -> executions"],
        ),
        (
            "tasks_app.models",
            'models.ForeignKey("executions.Execution", on_delete=CASCADE)',
            ["tasks_app.models:1 -> executions.Execution"],
        ),
        ("tasks_api.schema", 'target_class = "tasks_api.serializers.RunnerAliasField"', []),
        ("executions.models", 'models.ForeignKey("tasks_app.Task", on_delete=CASCADE)', []),
        ("tasks_app.models", '"""See executions.models for the runs."""\nhelp_text = "a path, e.g. a.b"', []),
    ],
)
def test_the_check_sees_each_kind_of_import(module, source, expected):
    assert violations_in(source, module) == expected


def test_a_migration_may_import_the_migration_of_an_app_it_depends_on():
    source = 'import importlib\n_r = importlib.import_module("executions.migrations.0006_rollup")\n'
    declared = source + 'dependencies = [("tasks_app", "0004_x"), ("executions", "0006_rollup")]\n'
    assert violations_in(declared, "tasks_app.migrations.0005_x") == []
    assert violations_in(source, "tasks_app.migrations.0005_x") == [
        "tasks_app.migrations.0005_x:2 -> executions.migrations.0006_rollup"
    ]
    # Only a migration: the app itself still may not reach up.
    assert violations_in(declared, "tasks_app.models") == ["tasks_app.models:2 -> executions.migrations.0006_rollup"]


def test_relative_imports_resolve_against_their_package():
    # A relative import never leaves its top-level package, so it can break no rank; it must
    # still resolve, for the cycle check.
    assert list(imports_of("from . import base\nfrom ..tms_core import clock", "runners.backends.http")) == [
        (1, "runners.backends.base"),
        (2, "runners.tms_core.clock"),
    ]
    assert list(imports_of("from .http import HttpRunner", "runners.backends", is_package=True)) == [
        (1, "runners.backends.http.HttpRunner")
    ]


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import():
    sources = {
        "tasks_api.api": ("from tms_core.api.schema import AutoSchema", False),
        "tms_core.api.schema": ("def f():\n    from tasks_api.compat import BlankIsNone", False),
        "tasks_api.compat": ("from tasks_api.api import idempotent_create_response", False),
        "tasks_api.serializers": ("from tasks_api import api", False),
        "tasks_api": ("", True),
    }
    graph = import_graph(sources)
    assert graph["tasks_api.serializers"] == {"tasks_api.api"}  # `from package import module`
    assert cycles_in(graph) == [["tasks_api.api", "tasks_api.compat", "tms_core.api.schema"]]
    assert cycles_in({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_whole_check_fails_on_a_deliberate_bad_import(tmp_path):
    # A copy of a small corner of the tree, with one module reaching up a rank and a cycle.
    for name, text in {
        "tms_core/__init__.py": "",
        "tms_core/clock.py": "",
        "runners/__init__.py": "",
        "runners/base.py": "from tms_core import clock\n",
        "tasks_app/__init__.py": "",
        "tasks_app/models.py": "from runners import base\n\ndef f():\n    from executions.models import Execution\n",
        "executions/__init__.py": "",
        "executions/models.py": "from tasks_app.models import Task\n",
    }.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    violations, cycles = check_tree(tmp_path, ("tms_core", "runners", "tasks_app", "executions"))
    assert violations == ["tasks_app.models:4 -> executions.models.Execution"]
    assert cycles == [["executions.models", "tasks_app.models"]]


def test_the_architecture_docs_layer_table_is_the_ranks():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("<!-- layers: tests/test_layering.py RANKS -->")[1].split("<!-- /layers -->")[0]
    rows = [
        tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
        for line in table.strip().splitlines()[2:]  # after the header and its rule
    ]
    assert rows == [(str(rank), f"`{package}/`", what) for rank, (package, what) in enumerate(RANKS)]
