"""The tooling commands that run in seconds: the materialiser scale check and the demo set-up.
(``tms_bench`` has its own smoke test; ``chaos`` restarts the shared services and runs alone.)"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

from executions.models import Execution
from tasks_app.models import Task
from tooling.scale import SCALE_USER

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_tms_scale_times_two_passes_the_second_creating_nothing_and_cleans_up(settings):
    # The check places every fire time inside the production horizon (the suite's is 60 s).
    settings.TMS = {**settings.TMS, "MATERIALISE_HORIZON": 300.0}
    printed = _run("tms_scale", "30")
    assert printed.startswith("30 recurring tasks")
    assert "created 30; second pass" in printed
    assert printed.rstrip().endswith("created 0")
    assert not Task.objects.filter(owner__username=SCALE_USER).exists()
    assert not Execution.objects.filter(task__owner__username=SCALE_USER).exists()


@pytest.mark.parametrize("count", ["0", "-5", "many"])
def test_tms_scale_refuses_a_count_that_is_not_positive(count):
    with pytest.raises(CommandError, match="argument N"):
        _run("tms_scale", count)
    assert not Task.objects.exists()


def test_materialise_is_operational_only():
    # The destructive benchmark left the operational command for tms_scale.
    with pytest.raises(CommandError, match="unrecognized arguments: --scale"):
        call_command("materialise", "--scale", "10")
    assert not Task.objects.exists()
    assert _run("materialise").strip() == "created 0 executions"


def test_tms_demo_creates_the_admin_once_and_prints_its_token():
    printed = _run("tms_demo", "--port", "8123")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser and admin.check_password("admin")
    token = Token.objects.get(user=admin).key
    assert f"token:     {token}" in printed
    assert "http://127.0.0.1:8123/api/v1/tasks" in printed
    again = _run("tms_demo")
    assert "(unchanged; set earlier)" in again and f"token:     {token}" in again
    assert get_user_model().objects.filter(username="admin").count() == 1
