"""Production settings refuse to start without a real secret key, with DEBUG on or without
allowed hosts; a forged callback token signed with the repository's key changes nothing."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core import signing
from django.utils import timezone
from rest_framework.test import APIClient

from executions import transitions
from executions.callbacks import _SALT
from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.factories import TaskFactory
from tests.processes import ROOT
from tms_project.settings.base import DEVELOPMENT_SECRET_KEY, PUBLIC_KEYS, development_secrets_key
from tms_project.settings.public_keys import TEST_SECRET_KEY, TEST_SECRETS_KEY

STRONG_KEY = secrets.token_urlsafe(50)
FRESH_FERNET = Fernet.generate_key().decode()
PRODUCTION = "tms_project.settings.production"


def _settings_env(module: str, **variables: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env["DJANGO_SETTINGS_MODULE"] = module
    env.update({k: v for k, v in variables.items() if v is not None})
    return env


def _start(module: str, *argv: str, **variables: str | None) -> subprocess.CompletedProcess[str]:
    """Load the settings the way every process does (``manage.py`` + ``django.setup()``)."""
    return subprocess.run(
        [sys.executable, "manage.py", *(argv or ("check",))],
        cwd=ROOT,
        env=_settings_env(module, **variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


GOOD = {"DJANGO_SECRET_KEY": STRONG_KEY, "DJANGO_ALLOWED_HOSTS": "tms.example.com", "TMS_SECRET_KEYS": FRESH_FERNET}


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY is not set"),
        ({"DJANGO_SECRET_KEY": ""}, "DJANGO_SECRET_KEY is not set"),
        ({"DJANGO_SECRET_KEY": DEVELOPMENT_SECRET_KEY}, "DJANGO_SECRET_KEY is the development key"),
        ({"DJANGO_SECRET_KEY": "short-key"}, "DJANGO_SECRET_KEY is too weak"),
        ({"DJANGO_SECRET_KEY": "ab" * 40}, "DJANGO_SECRET_KEY is too weak"),
        ({"DJANGO_SECRET_KEY": "django-insecure-" + STRONG_KEY}, "DJANGO_SECRET_KEY is too weak"),
        ({"DJANGO_DEBUG": "true"}, "DJANGO_DEBUG is on"),
        ({"DJANGO_ALLOWED_HOSTS": None}, "DJANGO_ALLOWED_HOSTS is not set"),
        ({"DJANGO_ALLOWED_HOSTS": ""}, "DJANGO_ALLOWED_HOSTS is not set"),
        ({"TMS_SECRET_KEYS": ""}, "TMS_SECRET_KEYS is not set"),
        ({"TMS_SECRET_KEYS": "not-a-fernet-key"}, "TMS_SECRET_KEYS: key 1 is not a Fernet key"),
        # Issue 27, finding 8: every key from the repository, the test settings' included.
        ({"DJANGO_SECRET_KEY": TEST_SECRET_KEY}, "DJANGO_SECRET_KEY is a key from the repository"),
        ({"TMS_SECRET_KEYS": TEST_SECRETS_KEY}, "TMS_SECRET_KEYS: key 1 is a key from the repository"),
        (
            {"TMS_SECRET_KEYS": f"{FRESH_FERNET},{development_secrets_key(DEVELOPMENT_SECRET_KEY)}"},
            "TMS_SECRET_KEYS: key 2 is a key from the repository",
        ),
    ],
)
def test_production_refuses_to_start(variables, reason):
    result = _start(PRODUCTION, **{**GOOD, **variables})
    assert result.returncode != 0
    assert "ImproperlyConfigured: Refusing to start with the production settings" in result.stderr
    assert reason in result.stderr


def test_production_names_every_problem_at_once():
    result = _start(PRODUCTION, DJANGO_DEBUG="true")
    assert result.returncode != 0
    for reason in ("DJANGO_SECRET_KEY is not set", "DJANGO_DEBUG is on", "DJANGO_ALLOWED_HOSTS is not set"):
        assert reason in result.stderr


def test_production_deploy_check_is_clean_with_a_proper_environment():
    result = _start(PRODUCTION, "check", "--deploy", "--fail-level", "WARNING", **GOOD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced)."


def test_production_reads_the_proxy_header_and_refuses_a_malformed_one():
    shell = (
        "from django.conf import settings; "
        "print(settings.SECURE_PROXY_SSL_HEADER, settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS)"
    )
    ok = _start(
        PRODUCTION,
        "shell",
        "--no-imports",
        "-c",
        shell,
        DJANGO_SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SECURE_HSTS_SECONDS="60",
        **GOOD,
    )
    assert ok.stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https') False 60", ok.stderr
    bad = _start(PRODUCTION, DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto", **GOOD)
    assert bad.returncode != 0 and "DJANGO_SECURE_PROXY_SSL_HEADER must be 'HEADER,value'" in bad.stderr


def test_local_settings_run_a_checkout_with_the_development_key():
    shell = "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"
    result = _start("tms_project.settings.local", "shell", "--no-imports", "-c", shell)
    assert result.stdout.strip() == f"True {DEVELOPMENT_SECRET_KEY}", result.stderr


def test_the_base_settings_sign_nothing_without_a_key():
    """The base no longer falls back to the repository's key: signing refuses."""
    shell = "from executions.callbacks import callback_token; callback_token(execution_id=1, attempt=1, timeout=60)"
    result = _start("tms_project.settings.base", "shell", "--no-imports", "-c", shell)
    assert result.returncode != 0
    assert "The SECRET_KEY setting must not be empty" in result.stderr


@pytest.mark.django_db
def test_a_token_signed_with_the_repository_key_cannot_finish_an_execution(settings):
    """The reported attack: a self-signed token turned a RUNNING execution into SUCCEEDED."""
    settings.SECRET_KEY = STRONG_KEY  # what production runs with, now that it must be set
    task = TaskFactory(timeout=timedelta(minutes=5))
    (execution_id,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now(), 5)], actor="test"
    )
    transitions.executions_take_due(limit=100, actor="monitor")
    assert transitions.execution_claim_loaded(execution_id=execution_id, attempt=1, worker_id="w:1:1", lease_seconds=60)
    claim = {"e": execution_id, "a": 1, "x": int(time.time()) + 600}
    forged = signing.dumps(claim, key=DEVELOPMENT_SECRET_KEY, salt=_SALT, compress=True)

    response = APIClient().post(
        f"/api/v1/executions/{execution_id}/callback",
        {"status": "succeeded"},
        format="json",
        headers={"X-TMS-Callback-Token": forged},
    )

    assert response.status_code == 403
    assert response.json() == {"type": "permission_denied", "detail": "The callback token is not valid."}
    assert Execution.objects.get(pk=execution_id).status == S.RUNNING


_REGISTERED = """
import json
import django
django.setup()
from django.conf import settings
from django.core.management import get_commands
from tms_project.celery import app
app.loader.import_default_modules()
print(json.dumps({
    "apps": settings.INSTALLED_APPS,
    "commands": sorted(name for name, app_name in get_commands().items() if app_name == "tooling"),
    "bench_task": "tms.bench_noop" in app.tasks,
}))
"""


def _registered(module: str) -> dict:
    import json

    result = subprocess.run(
        [sys.executable, "-c", _REGISTERED],
        cwd=ROOT,
        env=_settings_env(module, **GOOD),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_production_does_not_install_the_benchmark_and_chaos_tooling():
    """The tooling app (chaos, tms_bench, tms_demo, tms_scale and the benchmark's Celery task) is
    installed by the checkout's and the suite's settings only (issue 26: production registered
    them all)."""
    production = _registered(PRODUCTION)
    assert "tooling" not in production["apps"]
    assert production["commands"] == [] and production["bench_task"] is False
    local = _registered("tms_project.settings.local")
    assert local["apps"][-1] == "tooling" and local["bench_task"] is True
    assert local["commands"] == ["chaos", "tms_bench", "tms_demo", "tms_scale"]
    from django.conf import settings

    assert "tooling" in settings.INSTALLED_APPS  # the suite runs the benchmark and the chaos run


def test_the_image_leaves_the_tooling_out():
    ignored = (ROOT / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert "tooling" in ignored


#: A value assigned to a secret-key setting or variable in a file (Python, shell, YAML, .env, docs).
_ASSIGNED_KEY = re.compile(r"""SECRET_KEYS?["']?\s*[:=,]\s*["']?([A-Za-z0-9_\-=+/.:!@#%^&*]{8,})""")
#: A url-safe base64 text of 32 bytes: what a Fernet key is.
_FERNET = re.compile(r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{43}=(?![A-Za-z0-9_\-=])")


def test_every_key_in_the_repository_is_refused_by_production():
    """Issue 27, finding 8: a key that production would accept and that appears anywhere in the
    repository (settings, tests, documentation, examples) is listed in PUBLIC_KEYS, so that
    production refuses it."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found: dict[str, str] = {}
    for name in files:
        path = ROOT / name
        if path.suffix in {".png", ".jpg", ".ico", ".gz", ".woff2", ".json"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for match in _FERNET.finditer(text):
            try:
                Fernet(match.group(0))
            except ValueError:
                continue
            found.setdefault(match.group(0), name)
        for match in _ASSIGNED_KEY.finditer(text):
            value = match.group(1).strip("'\"")
            strong = len(value) >= 50 and len(set(value)) >= 5 and not value.startswith("django-insecure-")
            if strong or value == DEVELOPMENT_SECRET_KEY:
                found.setdefault(value, name)
    assert TEST_SECRETS_KEY in found and TEST_SECRET_KEY in found  # the scan sees the test settings' keys
    missing = {key: name for key, name in found.items() if key not in PUBLIC_KEYS}
    assert not missing, f"keys in the repository that production would accept: {missing}"
