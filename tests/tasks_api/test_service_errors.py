"""Services speak in domain errors, not HTTP: bad input is :class:`InvalidInput` with per-field
messages (the API turns it into a 400, any other caller into errors on its own fields), and the
limits services apply are read from the typed ``TMS`` settings."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from executions.models import Execution
from executions.services import executions_materialise
from tasks_api.backfill import task_backfill
from tasks_api.creation import task_bulk_create, task_create
from tasks_api.editing import task_update
from tasks_app.idempotency import idempotency_key_clean
from tasks_app.models import Task
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
#: Modules callers outside the API use (admin, pages, commands): no DRF errors, no API settings.
SERVICE_MODULES = [
    "tasks_api/backfill.py",
    "tasks_api/checks.py",
    "tasks_api/creation.py",
    "tasks_api/editing.py",
    "tasks_api/lifecycle.py",
    "tasks_api/moving.py",
    "tasks_api/replan.py",
    "tasks_api/task_config.py",
    "tasks_api/task_writes.py",
    "tasks_api/triggers.py",
    "tasks_app/idempotency.py",
    "tasks_app/artifacts.py",
    "executions/services.py",
    "executions/runs.py",
    "executions/reports.py",
    "executions/worker_services.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tasks_app" / "selectors").glob("*.py")),
]


def _imports(path: str) -> set[str]:
    """The names a module imports (``module`` and ``module.name`` for ``from module import name``)."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", SERVICE_MODULES)
def test_services_do_not_import_the_api_layer_or_drf_errors(path):
    imported = _imports(path)
    assert not {name for name in imported if name.startswith("tms_project")}
    assert "rest_framework.exceptions" not in imported
    assert "rest_framework.exceptions.ValidationError" not in imported


def test_worker_services_and_user_services_do_not_import_each_other():
    assert not {name for name in _imports("executions/worker_services.py") if name.startswith("executions.services")}
    assert not {name for name in _imports("executions/services.py") if name.startswith("executions.worker_services")}
    # The web process applies callback reports without loading the worker's module.
    assert not {name for name in _imports("executions/reports.py") if "worker_services" in name}


def test_an_unknown_runner_or_a_bad_config_is_invalid_input_on_its_field(user):
    with pytest.raises(InvalidInput) as unknown:
        task_create(owner=user, runner="no-such-runner")
    assert list(unknown.value.errors) == ["runner"]
    assert "no-such-runner" in unknown.value.errors["runner"][0]
    with pytest.raises(InvalidInput) as bad:
        task_create(owner=user, runner="noop", config={"surprise": 1})
    assert list(bad.value.errors) == ["config"]
    assert Task.objects.count() == 0


def test_bulk_create_keys_each_bad_spec_by_position_and_writes_nothing(user):
    with pytest.raises(InvalidInput) as error:
        task_bulk_create(
            owner=user,
            specs=[{"runner": "noop"}, {"runner": "nope"}, {"runner": "noop", "cron": "not a cron"}],
        )
    assert set(error.value.errors) == {"1", "2"}
    assert "runner" in error.value.errors["1"]
    assert "schedule" in error.value.errors["2"]
    assert Task.objects.count() == 0


def test_update_of_a_field_that_cannot_change_is_invalid_input(user):
    task = task_create(owner=user, runner="noop", start_at=timezone.now() + timedelta(hours=1))
    with pytest.raises(InvalidInput) as error:
        task_update(task=task, actor="user:alice", changes={"owner": None})
    assert error.value.errors == {"owner": ["This field cannot be changed."]}


def test_backfill_of_a_future_range_is_invalid_input_on_end(user):
    task = task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    now = timezone.now()
    with pytest.raises(InvalidInput) as error:
        task_backfill(task=task, start=now, end=now + timedelta(hours=1), actor="user:alice")
    assert list(error.value.errors) == ["end"]


def test_a_malformed_idempotency_key_is_invalid_input_on_the_header():
    with pytest.raises(InvalidInput) as error:
        idempotency_key_clean("caf\u00e9")
    assert list(error.value.errors) == ["Idempotency-Key"]
    assert idempotency_key_clean(None) is None


def test_materialise_limits_come_from_the_tms_settings(user, settings):
    task = task_create(owner=user, runner="noop", start_at=timezone.now() + timedelta(hours=1), interval=timedelta(1))
    settings.TMS = {**settings.TMS, "MATERIALISE_MAX": 3, "MATERIALISE_MAX_AHEAD": 86400.0 * 10}
    with pytest.raises(InvalidInput) as too_many:
        executions_materialise(task=task, until=timezone.now() + timedelta(days=5))
    assert "more than 3 executions" in too_many.value.errors["until"][0]
    settings.TMS = {**settings.TMS, "MATERIALISE_MAX_AHEAD": 3600.0}
    with pytest.raises(InvalidInput) as too_far:
        executions_materialise(task=task, until=timezone.now() + timedelta(hours=2))
    assert too_far.value.errors == {"until": ["May be at most 3600 seconds ahead."]}
    assert Execution.objects.filter(task=task).count() == 0
