"""The documentation says what the code does: the settings table of docs/configuration.md names
every ``TMS_*`` variable the code reads and no other, the metrics table of docs/metrics.md every
family ``/metrics`` exports and no other, the README stays a first screen, and every relative
link of the README and of docs/ leads somewhere (``mkdocs build --strict`` in ``make lint`` checks
docs/ too, anchors included; the README is outside the site, so it is checked here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from django.test import Client
from markdown.extensions.toc import slugify as mkdocs_slug
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import ROOT
from tms_core import metrics as process_metrics
from tms_core.conf import TmsSettings

DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: A read of an environment variable in Python: ``env.int("TMS_X", ...)``, ``os.environ.get("TMS_X")``,
#: ``os.getenv("TMS_X")``, ``environ.Env().str("TMS_X")``, ``os.environ["TMS_X"]``; not a write such as
#: ``env["TMS_CALLBACK_URL"] = ...`` (what a runner hands its job).
PYTHON_READ = re.compile(
    r"""(?:\benv|environ|getenv|Env\(\))[\w.]*"""
    r"""(?:\(\s*["'](TMS_[A-Z0-9_]+)["']|\[\s*["'](TMS_[A-Z0-9_]+)["']\s*\](?!\s*=[^=]))"""
)
#: A read in a shell script, Procfile, Makefile or compose file: ``${TMS_X}``, ``${TMS_X:-default}``.
SHELL_READ = re.compile(r"\$\{(TMS_[A-Z0-9_]+)[:}-]")
#: The suite's own settings module and tests are not the product; the test settings set
#: ``TMS_TEST_XDIST_WORKER`` for the suite's processes only.
NOT_PRODUCT = ("tests/", "tms_project/settings/test.py", "docs/")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.splitlines() if not name.startswith(NOT_PRODUCT)]


def settings_the_code_reads() -> dict[str, set[str]]:
    """Every ``TMS_*`` environment variable read by the product (and by ``make run``'s and the
    image's scripts), with the files that read it."""
    found: dict[str, set[str]] = {}
    for name in tracked_files():
        path = ROOT / name
        if name.endswith(".py"):
            pattern = PYTHON_READ
        elif name.endswith((".sh", ".yaml", "Procfile", "Makefile")):
            pattern = SHELL_READ
        else:
            continue
        if not path.is_file():
            continue
        for match in pattern.finditer(path.read_text(errors="replace")):
            variable = next(group for group in match.groups() if group)
            found.setdefault(variable, set()).add(name)
    # The settings read each TmsSettings field NAME from TMS_NAME (tms_core.conf.tms_from_environment).
    for field in fields(TmsSettings):
        found.setdefault(f"TMS_{field.name}", set()).add("tms_core/conf.py")
    return found


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows (cells) of every Markdown table whose first header cell is ``first_header``."""
    rows: list[list[str]] = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not (line.startswith("|") and cells[0] == first_header and index + 1 < len(lines)):
            continue
        if not re.fullmatch(r"\|?[\s|:-]+\|?", lines[index + 1]):
            continue
        for row in lines[index + 2 :]:
            if not row.startswith("|"):
                break
            rows.append([cell.strip() for cell in row.strip().strip("|").split("|")])
    return rows


def documented_settings() -> set[str]:
    rows = table_rows((DOCS / "configuration.md").read_text(), "variable")
    assert rows, "docs/configuration.md has no settings table (a table whose first column is 'variable')"
    return {name for row in rows for name in re.findall(r"`(TMS_[A-Z0-9_]+)`", row[0])}


def test_the_settings_table_lists_every_tms_setting_the_code_reads_and_no_other():
    read = settings_the_code_reads()
    documented = documented_settings()
    missing = {name: sorted(files) for name, files in read.items() if name not in documented}
    assert not missing, f"read by the code but not in docs/configuration.md's settings table: {missing}"
    extra = documented - set(read)
    assert not extra, f"in docs/configuration.md's settings table but read nowhere: {sorted(extra)}"


def test_the_settings_scan_finds_reads_of_every_form(tmp_path):
    """The scan itself: each way the code reads a variable is found, and a write or a mention is not."""
    text = "\n".join(
        [
            'A = env.int("TMS_ONE", default=1)',
            "B = env.list(\n    'TMS_TWO', default=[])",
            'C = os.environ.get("TMS_THREE", "")',
            'D = environ.Env().str("TMS_FOUR", default="x")',
            'E = os.environ["TMS_FIVE"]',
            'F = os.getenv("TMS_SIX")',
            'env["TMS_WRITTEN"] = callback_url',
            '"""TMS_SEVEN is only mentioned here."""',
        ]
    )
    found = [next(group for group in match.groups() if group) for match in PYTHON_READ.finditer(text)]
    assert found == ["TMS_ONE", "TMS_TWO", "TMS_THREE", "TMS_FOUR", "TMS_FIVE", "TMS_SIX"]
    assert SHELL_READ.findall('--concurrency "${TMS_WORKER_CONCURRENCY:-4}" ${TMS_X} $TMS_Y') == [
        "TMS_WORKER_CONCURRENCY",
        "TMS_X",
    ]


def exposition_name(family_name: str, kind: str) -> str:
    """The name a family is queried by: a counter's samples carry ``_total``."""
    return f"{family_name}_total" if kind == "counter" else family_name


def documented_metrics() -> set[str]:
    rows = table_rows((DOCS / "metrics.md").read_text(), "metric")
    assert rows, "docs/metrics.md has no metrics table (a table whose first column is 'metric')"
    return {name for row in rows for name in re.findall(r"`(tms_[a-z0-9_]+)`", row[0])}


@pytest.mark.django_db
def test_the_metrics_table_lists_every_metric_metrics_exports_and_no_other():
    response = Client().get("/metrics")
    assert response.status_code == 200, response.content
    families = list(text_string_to_metric_families(response.content.decode()))
    up = [family for family in families if family.name == "tms_metrics_database_up"]
    assert up and up[0].samples[0].value == 1.0, "the database-derived metrics were not read"
    exported = {exposition_name(family.name, family.type) for family in families if family.name.startswith("tms_")}
    # Process-local families appear in a scrape only once some process has written a value (a
    # labelled counter never incremented has no sample): the registry they are defined in has them all.
    exported |= {exposition_name(family.name, family.type) for family in process_metrics.REGISTRY.collect()}
    documented = documented_metrics()
    assert not exported - documented, f"exported but not in docs/metrics.md: {sorted(exported - documented)}"
    assert not documented - exported, f"in docs/metrics.md but not exported: {sorted(documented - exported)}"


def test_the_readme_is_a_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the details to docs/"
    first_screen = "\n".join(lines[:40])
    assert "make run" in first_screen and "make test" in first_screen


# --- links ------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading).lower())
    return text.replace(" ", "-")


def anchors(path: Path, slug) -> set[str]:  # type: ignore[no-untyped-def]
    text = FENCE.sub("", path.read_text())
    return {slug(match) for match in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.MULTILINE)}


def broken_links(page: Path, slug) -> list[str]:  # type: ignore[no-untyped-def]
    """The relative links of a Markdown page that lead to no file, or to no heading of it."""
    broken = []
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved, slug):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_relative_link_of_the_readme_resolves():
    """On GitHub's terms: the README is read there (and in an editor), not on the site."""
    assert not broken_links(README, github_slug)


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda page: page.name)
def test_every_relative_link_of_the_docs_resolves(page):
    """On the site's terms (Python-Markdown's anchors); ``mkdocs build --strict`` checks it too."""
    assert not broken_links(page, lambda heading: mkdocs_slug(CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading), "-"))


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-code-heading) [ok](#here) [web](https://example.com/x)\n"
        "# Here\n[gone](missing.md) [bad anchor](other.md#nowhere)\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page, github_slug) == ["missing.md: no such file", "other.md#nowhere: no such heading"]


def _lint_docs_build(folder: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs`` run in ``folder`` with the arguments ``make lint`` gives it (read from the
    Makefile's lint recipe, so that this builds as lint does)."""
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "no lint target in the Makefile"
    line = next(line for line in recipe.group(1).splitlines() if "$(MKDOCS)" in line)
    mkdocs = Path(sys.executable).with_name("mkdocs")
    return subprocess.run(
        [str(mkdocs), *line.split("$(MKDOCS)", 1)[1].split(), "--site-dir", str(site)],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_a_warning_fails_the_docs_build_of_make_lint(tmp_path):
    """``mkdocs build --strict --quiet`` returned 0 with a broken anchor: --quiet hides the
    warnings that --strict would have counted. Lint's build must fail on one."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[gone](other.md#nowhere)\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nvalidation:\n  anchors: warn\n")
    built = _lint_docs_build(tmp_path, tmp_path / "site")
    assert built.returncode != 0 and "nowhere" in built.stdout + built.stderr, built.stdout + built.stderr


def test_the_site_builds_strictly_and_loads_nothing_from_elsewhere(tmp_path):
    """What ``make lint`` runs, and the built pages fetch no script, stylesheet or font from
    another host (the Material theme loads Google's fonts unless ``font: false``)."""
    built = _lint_docs_build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    pages = sorted((tmp_path / "site").glob("*.html"))
    assert {page.stem for page in pages} >= {"index", "configuration", "metrics", "runners", "api"}
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"")
    fetched = {page.name: remote.findall(page.read_text()) for page in pages}
    assert not {name: found for name, found in fetched.items() if found}


def test_every_repository_path_the_docs_name_exists():
    """A file or folder of the repository named in backticks (`runners/sandbox.py`,
    `executions/transitions/`) still exists: modules move, and the pages must follow them."""
    top = {name.split("/", 1)[0] for name in tracked_files() if "/" in name} | {"tests", "docs"}
    folders = "|".join(re.escape(name) for name in sorted(top))
    path = re.compile(rf"`((?:{folders})/(?:[\w.-]+/)*(?:[\w-]+\.(?:py|sh|ya?ml|json|md|txt|toml|html)|[\w.-]+/))`")
    missing = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in [README, *sorted(DOCS.glob("*.md"))]
        for name in path.findall(page.read_text())
        if not (ROOT / name).exists()
    }
    assert not missing, sorted(missing)


# --- docs/api.md and docs/architecture.md against the code (issue 44) ---------------------------


def _marked(text: str, name: str) -> str:
    """The part of a page between ``<!-- name: ... -->`` and ``<!-- /name -->``."""
    found = re.search(rf"<!-- {name}:[^>]*-->(.*?)<!-- /{name} -->", text, re.S)
    assert found, f"no <!-- {name}: --> ... <!-- /{name} --> section"
    return found.group(1)


def _api_lists() -> dict[str, str]:
    """Each list endpoint of the API (``/api/v1/...`` with its ids as ``{}``) -> ``cursor`` or
    ``offset``, from its view's ``pagination_class``."""
    from rest_framework import mixins

    from tms_core.api.keyset import KeysetPagination
    from tms_project.api import urls

    found: dict[str, str] = {}
    for pattern in urls.urlpatterns:
        view = getattr(pattern.callback, "cls", None)
        actions = getattr(pattern.callback, "actions", None)
        if view is None:
            continue
        lists = actions.get("get") == "list" if actions else issubclass(view, mixins.ListModelMixin)
        if not lists or view.pagination_class is None:
            continue
        route = re.sub(r"\(\?P<[^>]+>[^)]*\)", "{}", str(pattern.pattern)).strip("^$").removesuffix("/?")
        found[f"/api/v1/{route}"] = "cursor" if issubclass(view.pagination_class, KeysetPagination) else "offset"
    return found


def test_the_paging_table_of_the_api_page_is_each_list_view_s_pagination():
    """Issue 44: docs/api.md said only tasks, executions, deliveries and the audit log page by
    cursor; the teams, members, service accounts, their tokens and task versions do too."""
    section = _marked((DOCS / "api.md").read_text(), "paging")
    documented: dict[str, str] = {}
    for row in table_rows(section, "paged"):
        kind = {"by cursor": "cursor", "by offset": "offset"}[row[0]]
        for path in re.findall(r"`([^`]+)`", row[1]):
            documented[re.sub(r"\{[^}]*\}", "{}", path)] = kind
    code = _api_lists()
    assert len(code) >= 18
    assert documented == code


def _tree_entry(folder: str, name: str) -> str:
    """The text of one entry (``  models.py  ...`` and its continuation lines) of ``folder`` in
    the module tree of docs/architecture.md."""
    text = (DOCS / "architecture.md").read_text()
    tree = text[text.index("## Where each piece lives") :]
    lines = tree.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{folder}/"))
    entry = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(f"  {name} "))
    body = [lines[entry]]
    for line in lines[entry + 1 :]:
        if not line.startswith(" " * 21):  # the tree's continuation lines, under the description
            break
        body.append(line)
    return " ".join(body)


def _tree_sections() -> dict[str, str]:
    """docs/architecture.md's module tree, cut at each top-level folder: folder -> its lines."""
    text = (DOCS / "architecture.md").read_text()
    tree = text[text.index("## Where each piece lives") :]
    block = tree[tree.index("```\n") + 4 :]
    sections: dict[str, str] = {}
    folder = None
    for line in block[: block.index("```")].splitlines():
        if heading := re.match(r"([a-z_]+)/", line):
            folder = heading.group(1)
            sections[folder] = ""
        if folder:
            sections[folder] += line + "\n"
    return sections


def test_the_module_tree_is_the_code():
    """Issue 47: the tree named 40 modules fewer than the packages held, and two packages not at
    all. Every module of a ranked package is named in its package's part of the tree (by its name,
    or by a folder of it that the tree names), and every ``name.py`` the tree names exists there."""
    from tests.test_layering import PACKAGES

    sections = _tree_sections()
    unnamed, gone = [], []
    for package in PACKAGES:
        text = sections.get(package, "")
        words = set(re.findall(r"\w+", text))
        modules = [
            path.relative_to(ROOT / package)
            for path in (ROOT / package).rglob("*.py")
            if "migrations" not in path.parts and path.name not in {"__init__.py", "apps.py"}
        ]
        unnamed += [
            f"{package}/{module}"
            for module in modules
            if module.stem not in words and not any(folder in words for folder in module.parts[:-1])
        ]
        stems = {module.stem for module in modules}
        named = set(re.findall(r"\b(\w+)\.py\b", text)) - {"manage"}  # `manage.py tms_prune`: the entry point
        gone += [f"{package}/{name}.py" for name in sorted(named - stems)]
    assert len(sections) >= len(PACKAGES)
    assert unnamed == [], f"say in docs/architecture.md what these hold: {unnamed}"
    assert gone == [], f"docs/architecture.md names modules that are not there: {gone}"


@pytest.mark.parametrize("app", ["tasks_app", "executions"])
def test_the_module_tree_names_every_model_of_the_app(app):
    """Issue 44: the tree named 7 of tasks_app's 13 models."""
    from django.apps import apps

    models = {model.__name__ for model in apps.get_app_config(app).get_models()}
    listed = set(re.findall(r"\b([A-Z][A-Za-z]+)\b", _tree_entry(app, "models.py")))
    assert len(models) >= 7 and not models - listed, f"missing: {sorted(models - listed)}"


def test_the_beat_row_names_every_periodic_job():
    """Issue 44: the notification jobs were missing from the processes table."""
    from executions.periodic import periodic_jobs
    from notifications.periodic import periodic_jobs as notification_jobs

    rows = table_rows((DOCS / "architecture.md").read_text(), "process")
    (beat,) = [row for row in rows if row[0] == "beat" and "celery -A tms_project beat" in row[1]]
    named = set(re.findall(r"`(tms\.[a-z_]+)`", beat[2]))
    jobs = {task for task, _ in [*periodic_jobs().values(), *notification_jobs().values()]}
    assert len(jobs) >= 10 and named == jobs
