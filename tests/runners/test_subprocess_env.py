"""What a task's ``env`` may give a subprocess run (issue 43, item 3).

With ``allowed_executables`` pinning python3 to one script, ``PYTHONWARNINGS`` (which imports a
module named in it: ``antigravity`` opens a web browser) and ``BROWSER`` (the browser's command)
ran a shell: the arguments were pinned, the environment was not. Now a pinned program gets only
the variables ``allowed_env`` names for it (none by default), no program gets a variable that
makes an interpreter or shell run other code unless ``allowed_env`` names it, and both rules are
checked at save time (a per-field error on ``env``) and again at launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners.base import RunSpec, RunState
from runners.subprocess import SubprocessRunner
from runners.subprocess.config import injects_code
from tests.runners.conftest import SYSTEM_PYTHON, reachable_dir, wait_for_result

SCRIPT = "print('report ran')\n"


def _script(tmp_path: Path) -> Path:
    jobs = reachable_dir(tmp_path) / "jobs"
    jobs.mkdir(mode=0o755, exist_ok=True)
    (jobs / "report.py").write_text(SCRIPT)
    (jobs / "report.py").chmod(0o644)
    return jobs / "report.py"


def _pinned(tmp_path: Path, **options: Any) -> tuple[SubprocessRunner, Path]:
    script = _script(tmp_path)
    options.setdefault("allowed_executables", {SYSTEM_PYTHON: ["^" + str(script).replace(".", r"\.") + "$"]})
    options.setdefault("work_dir", str(reachable_dir(tmp_path) / "runs"))
    options.setdefault("sandbox", "none")  # the rule is the runner's, whatever the sandbox
    return SubprocessRunner("local", options), script


def _env_errors(runner: SubprocessRunner, config: dict[str, Any]) -> list[str]:
    with pytest.raises(serializers.ValidationError) as refused:
        runner.validate_config(config)
    detail = refused.value.detail
    assert isinstance(detail, dict) and set(detail) == {"env"}, detail
    return [str(message) for message in detail["env"]]


def _attack(marker: Path) -> dict[str, str]:
    return {"PYTHONWARNINGS": "ignore::antigravity.Foo::0", "BROWSER": f"/bin/sh -c 'touch {marker}' #%s"}


def test_a_pinned_program_is_refused_the_audit_s_environment_at_save_naming_each_variable(tmp_path):
    runner, script = _pinned(tmp_path)

    errors = _env_errors(runner, {"command": [SYSTEM_PYTHON, str(script)], "env": _attack(tmp_path / "ran")})

    assert len(errors) == 2
    assert errors[0].startswith("'PYTHONWARNINGS': '/usr/bin/python3' is pinned to its arguments")
    assert errors[1].startswith("'BROWSER'") and "allowed_env option of the 'local' runner" in errors[1]
    # Any variable, not only a known-bad one: a pinned program's environment is the operator's.
    assert _env_errors(runner, {"command": [SYSTEM_PYTHON, str(script)], "env": {"MODE": "fast"}})
    assert runner.validate_config({"command": [SYSTEM_PYTHON, str(script)]})["env"] == {}


def test_allowed_env_names_what_a_pinned_program_may_be_given(tmp_path):
    runner, script = _pinned(tmp_path, allowed_env={SYSTEM_PYTHON: ["MODE"], "*": ["PYTHONUNBUFFERED"]})
    command = [SYSTEM_PYTHON, str(script)]

    accepted = runner.validate_config({"command": command, "env": {"MODE": "fast", "PYTHONUNBUFFERED": "1"}})

    assert accepted["env"] == {"MODE": "fast", "PYTHONUNBUFFERED": "1"}
    assert _env_errors(runner, {"command": command, "env": {"MODE": "x", "PYTHONWARNINGS": "error"}}) == [
        "'PYTHONWARNINGS': '/usr/bin/python3' is pinned to its arguments, and gets only the variables allowed_env "
        "names for it. An operator can add it to the allowed_env option of the 'local' runner."
    ]


@pytest.mark.parametrize(
    "name",
    ["PYTHONSTARTUP", "PYTHONPATH", "PERL5OPT", "PERL5LIB", "NODE_OPTIONS", "BASH_ENV", "ENV", "RUBYOPT",
     "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GIT_SSH_COMMAND", "BROWSER", "GCONV_PATH"],
)  # fmt: skip
def test_no_program_gets_a_code_injecting_variable_unless_allowed(tmp_path, name):
    runner = SubprocessRunner("local", {"allowed_executables": ["echo", SYSTEM_PYTHON]})
    allowing = SubprocessRunner(
        "local", {"allowed_executables": ["echo", SYSTEM_PYTHON], "allowed_env": {SYSTEM_PYTHON: [name]}}
    )

    assert injects_code(name) and injects_code(name.lower())
    assert any(name in error for error in _env_errors(runner, {"command": ["echo"], "env": {name: "x"}}))
    assert allowing.validate_config({"command": [SYSTEM_PYTHON, "-V"], "env": {name: "x"}})["env"] == {name: "x"}
    # Allowed for python3 only: echo still may not have it.
    assert _env_errors(allowing, {"command": ["echo"], "env": {name: "x"}})


def test_an_unpinned_program_keeps_ordinary_variables(tmp_path):
    runner = SubprocessRunner("local", {"allowed_executables": ["echo"]})

    config = runner.validate_config({"command": ["echo"], "env": {"GREETING": "hi", "REPORT_DAY": "friday"}})

    assert config["env"] == {"GREETING": "hi", "REPORT_DAY": "friday"}


def test_the_audit_s_injection_does_not_run_at_launch_either(tmp_path):
    """A config saved before the rule (or before ``allowed_env`` changed) is refused at launch,
    not retried, and the shell it asked for never runs."""
    runner, script = _pinned(tmp_path)
    marker = reachable_dir(tmp_path) / "shell-ran"
    spec = RunSpec(
        execution_id=1, attempt=1, task_id="t", timeout=20.0,
        config={"command": [SYSTEM_PYTHON, str(script)], "args": [], "env": _attack(marker), "limits": {}},
    )  # fmt: skip

    result = wait_for_result(runner, spec, runner.start(spec), seconds=20)

    assert result.state is RunState.FAILED and result.retryable is False
    assert "env refused: 'PYTHONWARNINGS'" in result.error
    assert not marker.exists()


def test_allowed_env_must_name_allowed_programs_and_variable_names(tmp_path):
    with pytest.raises(ImproperlyConfigured, match="not in allowed_executables"):
        SubprocessRunner("local", {"allowed_executables": ["echo"], "allowed_env": {"perl": ["X"]}})
    with pytest.raises(ImproperlyConfigured, match="list of variable names"):
        SubprocessRunner("local", {"allowed_executables": ["echo"], "allowed_env": {"echo": ["A B"]}})
    with pytest.raises(ImproperlyConfigured, match="dict of program"):
        SubprocessRunner("local", {"allowed_executables": ["echo"], "allowed_env": ["X"]})
