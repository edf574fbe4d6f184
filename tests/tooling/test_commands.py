"""The tooling commands that run in seconds: the materialiser scale check and the demo set-up.
(``tms_bench`` has its own smoke test; ``chaos`` restarts the shared services and runs alone.)"""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from accounts.account_keys import account_key_digest
from accounts.models import AccountKey
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


def test_tms_demo_creates_the_admin_once_with_a_random_password_and_prints_its_token():
    printed = _run("tms_demo", "--port", "8123")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser
    # Never the well-known admin/admin: a random password, printed with the admin's line.
    assert not admin.check_password("admin")
    (password,) = re.findall(r"user 'admin', password '([^']+)' \(new", printed)
    assert len(password) >= 16 and admin.check_password(password)
    (token,) = re.findall(r"token:     ([0-9a-f]{40})\n", printed)
    assert AccountKey.objects.get(user=admin).digest == account_key_digest(token)
    assert "http://127.0.0.1:8123/api/v1/tasks" in printed

    # Running it again (a second `make run`) neither resets nor shows the password, and says how
    # to reset it; the key (stored hashed: not shown again) and the single admin stay.
    again = _run("tms_demo")
    admin.refresh_from_db()
    assert admin.check_password(password)
    assert password not in again
    assert "password unchanged (set earlier; to reset it: python manage.py changepassword admin)" in again
    assert token not in again and "token:     unchanged (shown when made" in again
    assert AccountKey.objects.get(user=admin).digest == account_key_digest(token)
    assert get_user_model().objects.filter(username="admin").count() == 1


def test_tms_demo_draws_a_new_password_for_each_new_admin():
    first = _run("tms_demo", "--username", "demo-one")
    second = _run("tms_demo", "--username", "demo-two")
    passwords = [re.findall(r"password '([^']+)'", text)[0] for text in (first, second)]
    assert passwords[0] != passwords[1]
    assert get_user_model().objects.get(username="demo-two").check_password(passwords[1])


def test_tms_demo_never_changes_an_existing_users_password_even_when_given_one():
    user = get_user_model().objects.create_user("admin", password="chosen-by-the-operator")
    printed = _run("tms_demo", "--password", "something-else")
    user.refresh_from_db()
    assert user.check_password("chosen-by-the-operator")
    assert "something-else" not in printed and "changepassword admin" in printed
