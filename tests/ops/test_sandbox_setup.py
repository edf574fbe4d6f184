"""``manage.py tms_sandbox_setup``: what sandboxed subprocess runs need on a host, and the mode they get."""

from __future__ import annotations

import io
import pwd
from typing import Any

import pytest
from django.core.management import CommandError, call_command


def test_check_reports_the_run_users_and_the_mode_of_this_host() -> None:
    out = io.StringIO()
    call_command("tms_sandbox_setup", "--check", stdout=out)
    text = out.getvalue()
    assert "run users: 32 of 32" in text
    assert "sandbox mode of subprocess runs on this host: bwrap" in text  # root, bubblewrap installed


def test_missing_run_users_are_named_with_the_command_that_creates_them(settings: Any) -> None:
    settings.TMS = {**settings.TMS, "SUBPROCESS_RUN_USER_PREFIX": "tms-nobody-", "SUBPROCESS_RUN_USERS": 2}
    with pytest.raises(KeyError):
        pwd.getpwnam("tms-nobody-0")
    with pytest.raises(CommandError, match=r"run users missing \(tms-nobody-0, tms-nobody-1\).*tms_sandbox_setup"):
        call_command("tms_sandbox_setup", "--check", stdout=io.StringIO())
