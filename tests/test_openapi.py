"""The OpenAPI schema is valid, its docs pages need no CDN, and the API keeps to it: schemathesis
sends generated requests (valid and invalid) to every operation with all its checks: none answers a
server error, every answer's status, content type, headers and body conform to the schema, the
API accepts what the schema calls valid and refuses what it calls invalid (with the exceptions
listed, and explained, in ``schemathesis.toml``)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import schemathesis
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from accounts.account_keys import account_key_digest
from accounts.models import AccountKey
from accounts.service_accounts import service_account_create, service_account_token_create
from executions.models import ExecutionStatus as S
from executions.models import Worker
from tasks_api.calendars import calendar_create
from tasks_app.teams.services import member_set, team_create
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import running
from tms_project.wsgi import application

pytestmark = pytest.mark.django_db

#: Examples per operation in the fuzzing phase; the coverage phase (boundaries of every field of
#: every runner's task schema) is most of the run, about a minute and a half on two busy cores.
MAX_EXAMPLES = 20
#: The project's schemathesis settings, the ones ``st run`` reads from the repository root.
CONFIG_FILE = Path(__file__).resolve().parent.parent / "schemathesis.toml"


def test_schema_is_valid_and_generates_without_warnings(tmp_path):
    # --validate checks the result against the OpenAPI 3 spec; --fail-on-warn fails on any
    # field, serializer or path drf-spectacular could not describe.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    text = (tmp_path / "schema.yaml").read_text()
    for path in ["/api/v1/tasks", "/api/v1/executions/{id}/retry", "/api/v1/workers", "/tasks/{id}"]:
        assert f"  {path}:\n" in text, path


def test_schema_documents_every_route_and_every_error_with_the_error_shape():
    schema = APIClient().get("/api/schema/?format=json").json()
    operations = {
        (method.upper(), path): operation
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in {"get", "post", "patch", "delete", "put"}
    }
    assert set(operations) == {
        ("GET", "/api/v1/tasks"),
        ("POST", "/api/v1/tasks"),
        ("GET", "/api/v1/tasks/{id}"),
        ("PATCH", "/api/v1/tasks/{id}"),
        ("DELETE", "/api/v1/tasks/{id}"),
        ("POST", "/api/v1/tasks/{id}/pause"),
        ("POST", "/api/v1/tasks/{id}/resume"),
        ("POST", "/api/v1/tasks/{id}/trigger"),
        ("GET", "/api/v1/tasks/{id}/trigger-url"),
        ("GET", "/api/v1/tasks/{task_id}/versions"),
        ("POST", "/api/v1/tasks/{task_id}/versions/{number}/restore"),
        ("POST", "/api/v1/tasks/{id}/trigger-url"),
        ("DELETE", "/api/v1/tasks/{id}/trigger-url"),
        ("POST", "/api/v1/tasks/{id}/materialise"),
        ("GET", "/api/v1/tasks/{id}/preview"),
        ("GET", "/api/v1/tasks/{id}/why"),
        ("GET", "/api/v1/tasks/{id}/occurrences"),
        ("POST", "/api/v1/tasks/{id}/backfill"),
        ("POST", "/api/v1/schedules/preview"),
        ("POST", "/api/v1/events/{name}"),
        ("GET", "/api/v1/events/{name}/url"),
        ("POST", "/api/v1/events/{name}/url"),
        ("DELETE", "/api/v1/events/{name}/url"),
        ("GET", "/api/v1/tokens"),
        ("POST", "/api/v1/tokens"),
        ("GET", "/api/v1/tokens/{id}"),
        ("DELETE", "/api/v1/tokens/{id}"),
        ("GET", "/api/v1/tokens/{id}/made"),
        ("POST", "/api/v1/tokens/{id}/made/revoke"),
        ("GET", "/api/v1/teams"),
        ("POST", "/api/v1/teams"),
        ("GET", "/api/v1/teams/{id}"),
        ("PATCH", "/api/v1/teams/{id}"),
        ("DELETE", "/api/v1/teams/{id}"),
        ("GET", "/api/v1/teams/{id}/members"),
        ("POST", "/api/v1/teams/{id}/members"),
        ("GET", "/api/v1/teams/{id}/members/{username}"),
        ("PATCH", "/api/v1/teams/{id}/members/{username}"),
        ("DELETE", "/api/v1/teams/{id}/members/{username}"),
        ("GET", "/api/v1/teams/{id}/quota"),
        ("PATCH", "/api/v1/teams/{id}/quota"),
        ("GET", "/api/v1/teams/{id}/service-accounts"),
        ("POST", "/api/v1/teams/{id}/service-accounts"),
        ("GET", "/api/v1/teams/{id}/service-accounts/{sa_id}"),
        ("DELETE", "/api/v1/teams/{id}/service-accounts/{sa_id}"),
        ("GET", "/api/v1/teams/{id}/service-accounts/{sa_id}/tokens"),
        ("POST", "/api/v1/teams/{id}/service-accounts/{sa_id}/tokens"),
        ("GET", "/api/v1/teams/{id}/service-accounts/{sa_id}/tokens/{token_id}"),
        ("DELETE", "/api/v1/teams/{id}/service-accounts/{sa_id}/tokens/{token_id}"),
        ("GET", "/api/v1/artifacts"),
        ("POST", "/api/v1/artifacts"),
        ("GET", "/api/v1/artifacts/{id}"),
        ("DELETE", "/api/v1/artifacts/{id}"),
        ("POST", "/api/v1/artifacts/uploads"),
        ("POST", "/api/v1/artifacts/{id}/complete"),
        ("PUT", "/api/v1/artifacts/uploads/{token}"),
        ("POST", "/api/v1/executions/{id}/callback"),
        ("GET", "/api/v1/tasks/{task_id}/executions"),
        ("GET", "/api/v1/tasks/{task_id}/archive"),
        ("GET", "/api/v1/tasks/{task_id}/archive/{archive_id}"),
        ("GET", "/api/v1/executions"),
        ("GET", "/api/v1/executions/{id}"),
        ("POST", "/api/v1/executions/{id}/cancel"),
        ("POST", "/api/v1/executions/{id}/cancel-workflow"),
        ("POST", "/api/v1/executions/{id}/retry"),
        ("POST", "/api/v1/executions/{id}/approve"),
        ("POST", "/api/v1/executions/{id}/reject"),
        ("GET", "/api/v1/approvals"),
        ("POST", "/api/v1/executions/replay"),
        ("POST", "/api/v1/executions/{id}/replay"),
        ("GET", "/api/v1/workflows"),
        ("GET", "/api/v1/workflows/{root_task_id}"),
        ("GET", "/api/v1/workflow-runs"),
        ("GET", "/api/v1/workflow-runs/{id}"),
        ("POST", "/api/v1/workflow-runs/{id}/pause"),
        ("POST", "/api/v1/workflow-runs/{id}/resume"),
        ("POST", "/api/v1/workflow-runs/{id}/cancel"),
        ("POST", "/api/v1/workflow-runs/{id}/retry"),
        ("GET", "/api/v1/workers"),
        ("GET", "/api/v1/workers/{id}"),
        ("GET", "/api/v1/audit"),
        ("GET", "/api/v1/audit/{id}"),
        ("GET", "/api/v1/limits"),
        ("POST", "/api/v1/limits"),
        ("GET", "/api/v1/limits/{id}"),
        ("PATCH", "/api/v1/limits/{id}"),
        ("DELETE", "/api/v1/limits/{id}"),
        ("GET", "/api/v1/calendars"),
        ("POST", "/api/v1/calendars"),
        ("GET", "/api/v1/calendars/{id}"),
        ("PATCH", "/api/v1/calendars/{id}"),
        ("DELETE", "/api/v1/calendars/{id}"),
        ("GET", "/api/v1/calendars/{id}/days"),
        ("GET", "/api/v1/artifacts"),
        ("POST", "/api/v1/artifacts"),
        ("GET", "/api/v1/artifacts/{id}"),
        ("DELETE", "/api/v1/artifacts/{id}"),
        ("POST", "/api/v1/executions/{id}/callback"),
        ("GET", "/api/v1/notification-channels"),
        ("POST", "/api/v1/notification-channels"),
        ("GET", "/api/v1/notification-channels/{id}"),
        ("PATCH", "/api/v1/notification-channels/{id}"),
        ("DELETE", "/api/v1/notification-channels/{id}"),
        ("POST", "/api/v1/notification-channels/{id}/test"),
        ("POST", "/api/v1/notification-channels/{id}/rotate-secret"),
        ("GET", "/api/v1/notification-rules"),
        ("POST", "/api/v1/notification-rules"),
        ("GET", "/api/v1/notification-rules/{id}"),
        ("PATCH", "/api/v1/notification-rules/{id}"),
        ("DELETE", "/api/v1/notification-rules/{id}"),
        ("GET", "/api/v1/notification-deliveries"),
        ("GET", "/api/v1/notification-deliveries/{id}"),
        ("GET", "/tasks"),
        ("POST", "/tasks"),
        ("GET", "/tasks/{id}"),
        ("POST", "/hooks/v1/{hook_id}"),
        ("POST", "/hooks/v1/events/{hook_id}"),
    }
    error_ref = {"$ref": "#/components/schemas/Error"}
    for (method, path), operation in operations.items():
        codes = set(operation["responses"])
        assert {"401", "403", "406", "429", "503"} <= codes, (method, path)
        assert operation["responses"]["503"]["headers"]["Retry-After"]["required"] is True, (method, path)
        if "{" in path:
            assert "404" in codes, (method, path)
        if "requestBody" in operation:
            assert {"400", "415"} <= codes, (method, path)
        for code, response in operation["responses"].items():
            if code >= "400":
                assert response["content"]["application/json"]["schema"] == error_ref, (method, path, code)
            assert response.get("description") or code < "300", (method, path, code)
    assert {"409"} <= set(operations[("POST", "/api/v1/executions/{id}/cancel")]["responses"])
    assert {"409"} <= set(operations[("POST", "/api/v1/executions/{id}/retry")]["responses"])
    assert {"422"} <= set(operations[("POST", "/api/v1/tasks")]["responses"])
    schemes = schema["components"]["securitySchemes"]
    assert (schemes["tokenAuth"]["type"], schemes["tokenAuth"]["in"]) == ("apiKey", "header")
    assert (schemes["bearerAuth"]["type"], schemes["bearerAuth"]["scheme"]) == ("http", "bearer")
    for (_method, path), operation in operations.items():
        # Alternatives: either scheme alone authenticates (not both at once in one requirement).
        # The upload PUT and the callback authenticate by their own tokens (security: [{}]).
        if {"tokenAuth": []} in operation["security"]:
            assert {"bearerAuth": []} in operation["security"], path
    assert {"bearerAuth": []} in operations[("PATCH", "/api/v1/tasks/{id}")]["security"]


@pytest.mark.parametrize("url", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_load_everything_from_this_server_not_a_cdn(url):
    response = APIClient().get(url)
    assert response.status_code == 200
    html = response.content.decode()
    # Look for CDN hosts in addresses, not the letters "cdn" anywhere: the page embeds a random
    # CSRF token, which now and then contains them.
    hosts = re.findall(r"""(?:https?:)?//([a-z0-9.-]+)""", html.lower())
    assert not [host for host in hosts if "cdn" in host or "unpkg" in host], hosts
    references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    scripts = [ref for ref in references if ref.endswith((".js", ".css", ".png"))]
    assert scripts, html
    for ref in references:
        assert not re.match(r"^(https?:)?//", ref), f"{url} loads {ref} from elsewhere"
    for ref in scripts:
        assert ref.startswith("/static/"), ref
        assert finders.find(ref.removeprefix("/static/")), f"{ref} is not a static file of this project"
    assert "/api/schema/" in html


@pytest.mark.slow
def test_docs_and_their_scripts_are_served_by_gunicorn_with_debug_off():
    """No CDN and no separate static server: the web process serves Swagger UI and ReDoc itself."""
    import urllib.request

    from tests.web import start_web

    web, base = start_web(workers=1)
    with running(web):
        for page in ("/api/docs/", "/api/redoc/"):
            with urllib.request.urlopen(base + page, timeout=10) as response:
                html = response.read().decode()
            refs = re.findall(r"""(?:src|href)\s*=\s*["'](/static/[^"']+)["']""", html)
            assert refs, html
            for ref in refs:
                with urllib.request.urlopen(base + ref, timeout=10) as asset:
                    assert asset.status == 200 and len(asset.read()) > 100, ref
        with urllib.request.urlopen(base + "/api/schema/?format=json", timeout=10) as response:
            assert b'"/api/v1/tasks"' in response.read()


# --- schemathesis ----------------------------------------------------------------------------


#: The schemathesis user's token (its row is created by the ``schemathesis_data`` fixture).
TOKEN = "5c8e0c3a9f1b4e2d8a7b6c5d4e3f2a1b0c9d8e7f"
STAFF_TOKEN = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
#: Ids that exist while an operation is tested, filled by ``schemathesis_data``.
KNOWN: dict[str, list] = {"tasks": [], "executions": [], "calendars": [], "teams": [], "accounts": [], "tokens": []}


# Loaded at collection time from the WSGI app (schema generation needs no database). The lazy
# ``schemathesis.pytest.from_fixture`` loader does not work with pytest 9 in this schemathesis.
def _config() -> SchemathesisConfig:
    """``schemathesis.toml`` plus this suite's seed and size; every check is on. Credentials go with
    each call: schemathesis' ``ignored_auth`` check then knows them as given, and probes without."""
    config = SchemathesisConfig.from_path(CONFIG_FILE)
    config.update(seed=20261121, max_failures=None)
    config.projects.default.generation.update(max_examples=MAX_EXAMPLES, modes=list(GenerationMode))
    config.projects.default.phases.update(phases=["examples", "coverage", "fuzzing"])
    return config


schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application, config=_config())


@schema.hook("flatmap_path_parameters")
def known_ids(context, path_parameters):  # type: ignore[no-untyped-def]
    """Half of the cases use ids that exist (the user's own and another user's), half generated ones."""
    path = context.operation.path if context.operation else ""
    if not path_parameters:
        return st.just(path_parameters)
    if "task_id" in path_parameters:
        name, kind = "task_id", "tasks"
    elif "id" in path_parameters and path.startswith(("/api/v1/tasks", "/tasks")):
        name, kind = "id", "tasks"
    elif "id" in path_parameters and path.startswith("/api/v1/executions"):
        name, kind = "id", "executions"
    elif "id" in path_parameters and path.startswith("/api/v1/calendars"):
        name, kind = "id", "calendars"
    elif "id" in path_parameters and path.startswith("/api/v1/teams"):
        name, kind = "id", "teams"
        if "sa_id" in path_parameters:  # the shared team's service account (and its token)
            return st.one_of(st.just(path_parameters), st.just({**path_parameters, **_known_account(path_parameters)}))
    else:
        return st.just(path_parameters)
    if not _valid_id(kind, path_parameters[name]):
        # A negative case's id: swapping in a real one would make the case valid behind
        # schemathesis' back (and its negative-data check fail on a request it did not send).
        return st.just(path_parameters)
    known = st.sampled_from(KNOWN[kind] or [path_parameters[name]]).map(lambda i: {**path_parameters, name: i})
    return st.one_of(st.just(path_parameters), known)


def _known_account(path_parameters: dict) -> dict:
    """The ids of the seeded service account, its team and its token, for the parameters a path has
    (all of them valid, or the case as generated: a negative case stays negative)."""
    if not (KNOWN["accounts"] and all(_valid_id("teams", value) for value in path_parameters.values())):
        return {}
    team, account = KNOWN["accounts"][0]
    known = {"id": team, "sa_id": account}
    if "token_id" in path_parameters:
        known["token_id"] = KNOWN["tokens"][0]
    return known


def _valid_id(kind: str, value: object) -> bool:
    """Whether ``value`` is an id the schema allows: a UUID for tasks, a positive integer for executions."""
    if kind in ("executions", "calendars", "teams"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


@pytest.fixture
def schemathesis_data(db, user, other_user, staff_user, settings, tmp_path):
    """Tasks and executions in every state, the user's and another user's, for the ids to hit.

    Requests go through the real WSGI handler inside this test's transaction, so Django's
    per-request connection clean-up is switched off meanwhile, as its test client does.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    settings.MEDIA_ROOT = str(tmp_path / "media")  # uploaded artifacts
    settings.TMS_ARTIFACT_CACHE_DIR = str(tmp_path / "artifact-cache")
    now = timezone.now()
    tasks = [
        TaskFactory(owner=user, interval=timedelta(minutes=5), start_at=now + timedelta(minutes=1)),
        TaskFactory(owner=user, runner="sleep", config={"duration": "1s"}),
        TaskFactory(owner=other_user),
    ]
    executions = [
        ExecutionFactory(task=tasks[0], status=status, scheduled_for=now + timedelta(minutes=i))
        for i, status in enumerate([S.SCHEDULED, S.PENDING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED])
    ]
    executions.append(ExecutionFactory(task=tasks[2], status=S.FAILED))
    AccountKey.objects.create(user=user, digest=account_key_digest(TOKEN))
    AccountKey.objects.create(user=staff_user, digest=account_key_digest(STAFF_TOKEN))
    Worker.objects.create(id="host-a:10", hostname="host-a", pid=10)
    KNOWN["tasks"] = [str(task.pk) for task in tasks]
    KNOWN["executions"] = [execution.pk for execution in executions]
    calendars = [
        calendar_create(owner=user, name="de", country="DE", subdivision="BY", weekends_closed=True),
        calendar_create(owner=other_user, name="us", country="US"),
    ]
    KNOWN["calendars"] = [calendar.pk for calendar in calendars]
    shared = team_create(creator=user, name="Shared")
    member_set(team=shared, username=other_user.username, role="viewer")
    KNOWN["teams"] = [user.personal_team.pk, other_user.personal_team.pk, shared.pk]
    # In a team of its own: a team with a service account is not deleted (a 400, as for one with
    # tasks), and the shared team's DELETE should stay a 204.
    robots = team_create(creator=user, name="Robots")
    account = service_account_create(team=robots, name="ci", role="operator", creator=user)
    token, _ = service_account_token_create(account=account, name="ci", scopes=["read"], expires_at=None)
    KNOWN["accounts"], KNOWN["tokens"] = [(robots.pk, account.pk)], [token.pk]
    yield
    KNOWN["tasks"], KNOWN["executions"], KNOWN["calendars"], KNOWN["teams"] = [], [], [], []
    KNOWN["accounts"], KNOWN["tokens"] = [], []
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_to_the_schema_and_never_answers_a_server_error(case, schemathesis_data):
    # Workers are staff only: test them as staff (their 403 for others is tested elsewhere).
    token = STAFF_TOKEN if case.operation.path.startswith("/api/v1/workers") else TOKEN
    case.call_and_validate(headers={"Authorization": f"Token {token}"})
