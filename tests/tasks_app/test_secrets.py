"""Secret config values: encrypted at rest, write-only in the API, masked everywhere, opened only
for the runner; staff are read-only support (issue 15, finding 3)."""

from __future__ import annotations

import importlib
import io
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet
from django.apps import apps as django_apps
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.task_config import task_config
from tasks_app.masking import MASK
from tasks_app.models import ApiIdempotencyKey, AuditEntry, Task
from tasks_app.secrets import config_masked, config_open, config_seal, redact, secret_paths, secret_values
from tests.conftest import client_for
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-secret-0123456789"
CUSTOM = "custom-header-secret-42"
LATER = timezone.now() + timedelta(days=1)


def _raw_config(task_id) -> str:
    """The config column as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT config::text FROM tasks_app_task WHERE id = %s", [task_id])
        return cursor.fetchone()[0]


def _http_task(owner, **extra):
    config = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET, "X-Custom": CUSTOM}}
    return task_create(owner=owner, runner="http", config=config, start_at=LATER, **extra)


# --- which values are secret, per runner ---------------------------------------------------------


def test_secret_values_per_runner():
    http = {"url": "https://u:pw@example.com/x?api_key=k&page=2", "headers": {"Accept": "a", "X-Trace": "t"}}
    assert sorted(secret_paths("http", http)) == [("headers", "Accept"), ("headers", "X-Trace"), ("url",)]
    subprocess = {"command": ["/bin/sh"], "args": ["-c", "run", "hunter2"], "env": {"A": "1", "B": ""}}
    assert secret_paths("subprocess", subprocess) == [("env", "A")]  # an empty value stays visible
    assert secret_paths("subprocess", subprocess, ["args.2"]) == [("args", 2), ("env", "A")]
    lam = {"function_name": "f", "payload": {"user": "ann", "token": "t0k", "nested": {"pin": 1234}}}
    assert secret_paths("lambda", lam) == [("payload", "token")]  # a key that looks secret
    marked = sorted(secret_paths("lambda", lam, ["payload.nested"]))
    assert marked == [("payload", "nested", "pin"), ("payload", "token")]
    email = {"to": ["a@example.com"], "subject": "s", "body": "pin 1234"}
    assert secret_paths("email", email) == [] and secret_paths("email", email, ["body"]) == [("body",)]
    kubernetes = {"image": "busybox", "env": {"DB_PASSWORD": "x"}}
    assert secret_paths("kubernetes", kubernetes) == [("env", "DB_PASSWORD")]


def test_seal_open_and_mask_round_trip():
    config = {"url": "https://u:pw@example.com/x", "headers": {"Authorization": SECRET}, "json": {"n": 1}}
    sealed = config_seal("http", config)
    assert SECRET not in json.dumps(sealed) and "pw@" not in json.dumps(sealed)
    assert sealed["json"] == {"n": 1} and set(sealed["headers"]["Authorization"]) == {"$enc"}
    assert config_open(sealed) == config
    assert config_masked("http", sealed) == {
        "url": f"https://u:{MASK}@example.com/x",  # its shape, without the password
        "headers": {"Authorization": MASK},
        "json": {"n": 1},
    }


# --- at rest -------------------------------------------------------------------------------------


def test_the_database_row_holds_no_plaintext_secret(user):
    task = _http_task(user)
    raw = _raw_config(task.pk)
    assert SECRET not in raw and CUSTOM not in raw and "sk-live" not in raw
    assert '"$enc"' in raw
    assert task_config(task)["headers"] == {"Authorization": SECRET, "X-Custom": CUSTOM}


def test_owner_marked_payload_fields_are_encrypted(api_client):
    body = {
        "runner": "http",
        "config": {"url": "http://127.0.0.1:9/hook", "json": {"user": "ann", "pin": "4711"}},
        "secret_fields": ["json.pin"],
        "start_at": LATER.isoformat(),
    }
    response = api_client.post("/api/v1/tasks", body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["config"]["json"] == {"user": "ann", "pin": MASK}
    assert response.data["secret_fields"] == ["json.pin"]
    raw = _raw_config(response.data["id"])
    assert "4711" not in raw and "ann" in raw


def test_bad_secret_fields_and_reserved_keys_are_400_and_create_nothing(api_client):
    base = {"runner": "http", "config": {"url": "http://127.0.0.1:9/hook"}, "start_at": LATER.isoformat()}
    response = api_client.post("/api/v1/tasks", {**base, "secret_fields": ["json.nope"]}, format="json")
    assert response.status_code == 400 and "secret_fields" in response.json()["errors"], response.content
    response = api_client.post("/api/v1/tasks", {**base, "secret_fields": "json"}, format="json")
    assert response.status_code == 400 and "secret_fields" in response.json()["errors"]
    stolen = {"url": "http://127.0.0.1:9/hook", "headers": {"X": {"$enc": "gAAAA"}}}
    response = api_client.post("/api/v1/tasks", {**base, "config": stolen}, format="json")
    assert response.status_code == 400 and "config" in response.json()["errors"]
    assert Task.objects.count() == 0


def test_the_data_migration_encrypts_existing_secrets(user):
    task = _http_task(user)
    plain = task_config(task)
    Task.objects.filter(pk=task.pk).update(config=plain)  # as a row written before the migration
    assert SECRET in _raw_config(task.pk)
    replay = ApiIdempotencyKey.objects.create(
        owner=user, key="k1", request_fingerprint="f", response_status=201,
        response_body={"id": str(task.pk), "runner": "http", "config": plain},
    )  # fmt: skip
    migration = importlib.import_module("tasks_app.migrations.0007_secret_fields_and_audit_log")
    editor = SimpleNamespace(connection=connection)
    migration.encrypt_existing(django_apps, editor)
    migration.mask_stored_responses(django_apps, editor)
    assert SECRET not in _raw_config(task.pk)
    task.refresh_from_db()
    assert task_config(task) == plain
    replay.refresh_from_db()
    assert replay.response_body["config"]["headers"] == {"Authorization": MASK, "X-Custom": MASK}


def test_rotation_re_encrypts_with_the_new_key_and_the_old_key_can_go(user, settings):
    old = tuple(settings.TMS["SECRET_KEYS"])
    task = _http_task(user)
    before = _raw_config(task.pk)
    new = Fernet.generate_key().decode()
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (new, *old)}
    out = io.StringIO()
    call_command("tms_rotate_keys", stdout=out)
    assert "re-encrypted 2 secret value(s) in 1 task(s)" in out.getvalue()
    assert _raw_config(task.pk) != before
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (new,)}  # the old key removed
    task.refresh_from_db()
    assert task_config(task)["headers"]["Authorization"] == SECRET
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (Fernet.generate_key().decode(),)}  # a wrong key
    with pytest.raises(CommandError, match="1 task"):
        call_command("tms_rotate_keys", stdout=io.StringIO())


# --- write-only in the API -----------------------------------------------------------------------


def test_the_api_masks_secrets_on_read(user, api_client):
    task = _http_task(user)
    data = api_client.get(f"/api/v1/tasks/{task.pk}").json()
    assert data["config"]["headers"] == {"Authorization": MASK, "X-Custom": MASK}
    listed = api_client.get("/api/v1/tasks").json()["results"][0]
    assert listed["config"]["headers"]["Authorization"] == MASK
    assert SECRET not in json.dumps(data) and CUSTOM not in json.dumps(listed)


def test_a_patch_of_another_field_keeps_the_secrets(user, api_client):
    task = _http_task(user)
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", {"name": "renamed"}, format="json")
    assert response.status_code == 200, response.data
    task.refresh_from_db()
    assert task.name == "renamed" and task_config(task)["headers"]["Authorization"] == SECRET


def test_sending_the_mask_back_keeps_a_secret_and_a_new_value_replaces_it(user, api_client):
    task = _http_task(user)
    masked = api_client.get(f"/api/v1/tasks/{task.pk}").json()["config"]
    edited = {**masked, "headers": {**masked["headers"], "X-Custom": "new-value"}, "follow_redirects": False}
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", {"config": edited}, format="json")
    assert response.status_code == 200, response.data
    task.refresh_from_db()
    assert task_config(task)["headers"] == {"Authorization": SECRET, "X-Custom": "new-value"}
    assert task_config(task)["follow_redirects"] is False
    assert "new-value" not in _raw_config(task.pk) and SECRET not in _raw_config(task.pk)
    # The audit entry says a secret changed without showing either value.
    entry = AuditEntry.objects.filter(task_id=task.pk, action="update").get()
    text = json.dumps(entry.changes)
    assert "new-value" not in text and CUSTOM not in text and f"{MASK} (changed)" in text


# --- staff are read-only support -----------------------------------------------------------------


def test_a_staff_token_reads_another_users_authorization_header_masked(user, staff_client):
    task = _http_task(user)
    response = staff_client.get(f"/api/v1/tasks/{task.pk}")
    assert response.status_code == 200
    assert response.json()["config"]["headers"]["Authorization"] == MASK
    assert SECRET not in response.content.decode()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("patch", "/api/v1/tasks/{id}", {"name": "taken over"}),
        ("post", "/api/v1/tasks/{id}/pause", None),
        ("post", "/api/v1/tasks/{id}/trigger", None),
        ("post", "/api/v1/tasks/{id}/backfill", {"start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z"}),
        ("delete", "/api/v1/tasks/{id}", None),
    ],
)
def test_staff_writes_on_another_owners_task_are_403_and_change_nothing(user, staff_client, method, path, body):
    task = _http_task(user, interval=timedelta(hours=1))
    before = (Task.objects.filter(pk=task.pk).values().get(), Execution.objects.count())
    response = getattr(staff_client, method)(path.format(id=task.pk), body, format="json")
    assert response.status_code == 403, response.content
    assert (Task.objects.filter(pk=task.pk).values().get(), Execution.objects.count()) == before
    assert not AuditEntry.objects.exclude(action="create").exists()


def test_staff_act_on_their_own_tasks(staff_user, staff_client):
    task = _http_task(staff_user)
    assert staff_client.patch(f"/api/v1/tasks/{task.pk}", {"name": "mine"}, format="json").status_code == 200


def test_a_superuser_may_change_another_owners_task_and_it_is_audited(user, admin_user):
    task = _http_task(user)
    client = client_for(admin_user)
    response = client.patch(f"/api/v1/tasks/{task.pk}", {"name": "fixed by ops"}, format="json")
    assert response.status_code == 200
    entry = AuditEntry.objects.get(task_id=task.pk, action="update")
    assert (entry.actor_id, entry.owner_id, entry.source) == (admin_user.pk, user.pk, "api")
    assert entry.changes == {"name": {"from": "", "to": "fixed by ops"}}
    # The owner sees who changed their task.
    own = client_for(user).get(f"/api/v1/audit?task={task.pk}&action=update").json()["results"]
    assert [item["actor"] for item in own] == [admin_user.username]


# --- the runner still gets the real value; logs and events never see it ---------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        type(self).seen.append(dict(self.headers))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.end_headers()
        # A careless endpoint echoes the credential back: the stored output must not keep it.
        self.wfile.write(f"received {self.headers.get('Authorization')}".encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_run_sends_the_real_secret_and_logs_and_events_hold_none(user, api_client):
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker, monitor = start_worker(concurrency=1, TMS_LOG_LEVEL="DEBUG"), start_monitor()
    try:
        with running(worker, monitor):
            wait_worker_ready(worker)
            url = f"http://127.0.0.1:{server.server_address[1]}/hook"
            body = {
                "runner": "http",
                "config": {"url": url, "method": "POST", "headers": {"Authorization": SECRET, "X-Custom": CUSTOM}},
            }
            created = api_client.post("/api/v1/tasks", body, format="json")
            assert created.status_code == 201, created.data
            # An unrelated change first: the secret must survive it into the run.
            task_url = f"/api/v1/tasks/{created.data['id']}"
            assert api_client.patch(task_url, {"name": "x"}, format="json").status_code == 200
            api_client.post(f"{task_url}/trigger")
            wait_for(
                lambda: Execution.objects.filter(task_id=created.data["id"], status=S.SUCCEEDED).count() >= 1,
                timeout=60,
                what="a successful run",
            )
        # Read once both have stopped: a process may still be writing lines about the run.
        logs = worker.log() + monitor.log()
    finally:
        server.shutdown()
        server.server_close()
    assert any(seen.get("Authorization") == SECRET and seen.get("X-Custom") == CUSTOM for seen in _Recorder.seen)
    assert "sk-live" not in logs and CUSTOM not in logs
    executions = Execution.objects.filter(task_id=created.data["id"])
    stored = json.dumps(list(executions.values()), default=str)
    stored += json.dumps(list(ExecutionEvent.objects.filter(execution__in=executions).values()), default=str)
    stored += json.dumps(list(AuditEntry.objects.values()), default=str)
    assert "sk-live" not in stored and CUSTOM not in stored
    assert executions.filter(output=f"received {MASK}").exists()  # the echo, redacted


def test_secret_values_are_redacted_from_errors_and_outputs(user):
    config = {"url": "http://127.0.0.1:9/hook?api_key=key-abcdef&page=2", "headers": {"X-Token": "tok-123456"}}
    task = task_create(owner=user, runner="http", config=config, start_at=LATER)
    values = secret_values(task.runner, task.config, task.secret_fields)
    assert set(values) == {"key-abcdef", "tok-123456"}
    error = "ConnectionError: Max retries exceeded with url: /hook?api_key=key-abcdef&page=2; sent tok-123456"
    assert (
        redact(error, values)
        == f"ConnectionError: Max retries exceeded with url: /hook?api_key={MASK}&page=2; sent {MASK}"
    )


def test_the_back_office_shows_and_edits_configs_masked(user):
    from django.test import Client

    from backoffice.forms import TaskForm

    task = _http_task(user)
    client = Client()
    client.force_login(user)
    for page in (f"/ui/tasks/{task.pk}/", f"/ui/tasks/{task.pk}/edit/"):
        text = client.get(page).content.decode()
        assert MASK in text and "sk-live" not in text and CUSTOM not in text, page
    data = {key: value for key, value in TaskForm.initial_for(task).items() if value not in (None, "")}
    response = client.post(f"/ui/tasks/{task.pk}/edit/", {**data, "name": "edited in the back office"})
    assert response.status_code == 302, response.content.decode()[:2000]
    task.refresh_from_db()
    assert task.name == "edited in the back office"
    assert task_config(task)["headers"] == {"Authorization": SECRET, "X-Custom": CUSTOM}
