"""End to end on the real stack: API → materialiser → monitor process → RabbitMQ → worker process."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def platform():
    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        yield worker, monitor


class _Failing(BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.send_response(500)
        self.end_headers()
        self.wfile.write(b"internal error, as configured")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def failing_server():
    _Failing.hits = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _trail(execution: Execution) -> list[tuple[str, str, int]]:
    return list(execution.events.order_by("id").values_list("from_status", "to_status", "attempt"))


def _assert_trail_is_complete(execution: Execution) -> None:
    events = list(execution.events.order_by("id"))
    assert events[0].from_status == "" and events[0].to_status == S.SCHEDULED
    for before, after in itertools.pairwise(events):
        assert after.from_status == before.to_status, _trail(execution)
        assert after.at >= before.at
    assert events[-1].to_status == execution.status


def test_one_shot_task_runs_once_and_succeeds(platform, api_client):
    response = api_client.post("/api/v1/tasks", {"name": "once", "runner": "sleep", "config": {"duration": "100ms"}})
    assert response.status_code == 201, response.data
    task_id = response.data["id"]
    wait_for(
        lambda: Execution.objects.filter(task_id=task_id, status=S.SUCCEEDED).exists(), timeout=30, what="SUCCEEDED"
    )
    executions = list(Execution.objects.filter(task_id=task_id))
    assert len(executions) == 1
    (execution,) = executions
    assert execution.attempt == 1 and execution.output == "slept 0.1s"
    assert _trail(execution) == [
        ("", S.SCHEDULED, 1),
        (S.SCHEDULED, S.PENDING, 1),
        (S.PENDING, S.RUNNING, 1),
        (S.RUNNING, S.SUCCEEDED, 1),
    ]
    detail = api_client.get(f"/api/v1/executions/{execution.pk}")
    assert detail.status_code == 200
    assert [e["to_status"] for e in detail.data["events"]] == [S.SCHEDULED, S.PENDING, S.RUNNING, S.SUCCEEDED]


def test_interval_task_runs_repeatedly_on_time(platform, api_client):
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1s"})
    assert response.status_code == 201, response.data
    task_id = response.data["id"]

    def first_three():
        runs = list(Execution.objects.filter(task_id=task_id).order_by("scheduled_for")[:3])
        return runs if all(run.status == S.SUCCEEDED for run in runs) else None

    runs = wait_for(first_three, timeout=30, what="the first 3 runs to succeed")
    first = runs[0].scheduled_for
    for index, run in enumerate(runs):
        assert run.scheduled_for == first + timedelta(seconds=index)
        assert run.attempt == 1
        # On time: started within a second of its occurrence (normally a few milliseconds).
        assert timedelta(0) <= run.started_at - run.scheduled_for < timedelta(seconds=1), run.started_at
        _assert_trail_is_complete(run)


def test_http_500_is_retried_then_fails_after_max_attempts(platform, api_client, failing_server):
    url = f"http://127.0.0.1:{failing_server.server_port}/hook"
    response = api_client.post(
        "/api/v1/tasks",
        {
            "runner": "http",
            "config": {"url": url, "method": "POST", "json": {"hello": "world"}},
            "max_attempts": 3,
            "retry_backoff": "100ms",
            "retry_jitter": False,
        },
    )
    assert response.status_code == 201, response.data
    task_id = response.data["id"]
    wait_for(lambda: Execution.objects.filter(task_id=task_id, status=S.FAILED).exists(), timeout=30, what="FAILED")
    (execution,) = Execution.objects.filter(task_id=task_id)
    assert execution.attempt == 3
    assert _Failing.hits == 3
    assert "500" in execution.error
    _assert_trail_is_complete(execution)
    assert [to for _, to, _ in _trail(execution)] == [
        S.SCHEDULED, S.PENDING, S.RUNNING,  # attempt 1
        S.SCHEDULED, S.PENDING, S.RUNNING,  # attempt 2
        S.SCHEDULED, S.PENDING, S.RUNNING,  # attempt 3
        S.FAILED,
    ]  # fmt: skip
    assert [a for _, _, a in _trail(execution)] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
