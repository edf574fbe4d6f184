"""Notifications on the running system: real worker processes (executions and notifications
queues), the monitor and beat, a real local webhook receiver and a real local SMTP server."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.conf import settings
from django.utils import timezone

from notifications.models import Delivery, DeliveryStatus
from tests.notifications.receiver import Receiver, webhook_receiver
from tests.processes import (
    LOG_DIR,
    ManagedProcess,
    process_env,
    running,
    start_monitor,
    start_worker,
    wait_for,
    wait_worker_ready,
)
from tests.web import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Short leases so that a killed sender's delivery is taken over within seconds.
FAST = {"TMS_NOTIFY_LEASE": "6", "TMS_NOTIFY_TIMEOUT": "3"}


def start_notify_worker(name: str = "notify", **env: str) -> ManagedProcess:
    node = f"{name}-{time.monotonic_ns()}@%h"
    argv = [
        sys.executable, "-m", "celery", "-A", "tms_project", "worker", "-l", "info", "-n", node, "-c", "2",
        "-Q", settings.TMS_NOTIFY_QUEUE, "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    return ManagedProcess(name, argv, process_env(**FAST, **env), LOG_DIR)


def start_beat(**env: str) -> ManagedProcess:
    schedule = f"{tempfile.mkdtemp(prefix='tms-beat-')}/schedule"
    argv = [sys.executable, "-m", "celery", "-A", "tms_project", "beat", "-l", "info", "--pidfile=", "-s", schedule]
    return ManagedProcess("beat", argv, process_env(**FAST, **env), LOG_DIR)


@contextmanager
def platform(**notify_env: str) -> Iterator[dict[str, ManagedProcess]]:
    procs = {
        "worker": start_worker(concurrency=2),
        "monitor": start_monitor(),
        "notify": start_notify_worker(**notify_env),
        "beat": start_beat(),
    }
    with running(*procs.values()):
        wait_worker_ready(procs["worker"])
        wait_worker_ready(procs["notify"])
        yield procs
        for proc in procs.values():
            proc.stop()


class Endpoint:
    """The task's own endpoint: fails (500) the first ``failures`` calls, then answers 200."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def answer(self) -> int:
        with self.lock:
            self.calls += 1
            return 500 if self.calls <= self.failures else 200


@contextmanager
def endpoint(failures: int) -> Iterator[tuple[str, Endpoint]]:
    state = Endpoint(failures)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state.answer())
            self.end_headers()
            self.wfile.write(b"done")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/job", state
    finally:
        server.shutdown()
        server.server_close()


def _post(client: Any, path: str, data: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, data, format="json")
    assert response.status_code == 201, response.data
    return response.data


def _task(client: Any, url: str, **fields: Any) -> dict[str, Any]:
    data = {"name": "job", "runner": "http", "config": {"url": url}, "max_attempts": 1, **fields}
    return _post(client, "/api/v1/tasks", data)


def _webhook(client: Any, receiver: Receiver) -> dict[str, Any]:
    return _post(client, "/api/v1/notification-channels", {"name": "hook", "kind": "webhook", "target": receiver.url})


def test_a_task_failing_three_times_sends_one_failing_and_one_recovered(api_client):
    with webhook_receiver() as receiver, endpoint(failures=3) as (url, job), platform():
        channel = _webhook(api_client, receiver)
        # The owner-wide default, in place before the task's first run.
        _post(
            api_client,
            "/api/v1/notification-rules",
            {"channel": channel["id"], "on_failure": True, "on_recovery": True},
        )
        _task(api_client, url, interval="2s")
        wait_for(lambda: "recovered" in receiver.events(), timeout=60, what="the recovered notification")
        calls = job.calls
        wait_for(lambda: job.calls >= calls + 2, timeout=20, what="two more successful runs")
        time.sleep(2)  # any further notification would have arrived by now
        events = receiver.events()
        arrivals = list(receiver.arrivals)
    assert events == ["failing", "recovered"]
    recovered = next(a.payload for a in arrivals if a.payload["event"] == "recovered")
    assert recovered["failures"] == 3
    assert len(arrivals) == 2 and all(a.signature_valid(channel["secret"]) for a in arrivals)
    assert list(Delivery.objects.values_list("status", flat=True)) == [DeliveryStatus.DELIVERED] * 2


def test_a_sender_killed_mid_delivery_still_ends_with_one_delivery_per_event(api_client):
    with webhook_receiver() as receiver, endpoint(failures=1000) as (url, _), platform() as procs:
        receiver.hold_first = True
        channel = _webhook(api_client, receiver)
        _post(api_client, "/api/v1/notification-rules", {"channel": channel["id"], "on_failure": True})
        for _ in range(3):
            _task(api_client, url)  # one-shot, fails once: one "failing" each
        assert receiver.held.wait(60), "no delivery reached the receiver"
        procs["notify"].signal_group(signal.SIGKILL)  # the sender holding the request, and its pool
        procs["notify"].popen.wait(10)
        replacement = start_notify_worker("notify-2")
        with running(replacement):
            wait_for(
                lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 3,
                timeout=60,
                what="three delivered",
            )
            arrivals = list(receiver.arrivals)
            accepted = dict(receiver.accepted)
    keys = set(Delivery.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 3
    # What reached the receiver: every event, the held one twice (sent again after the kill),
    # and exactly once per event after deduplication by Idempotency-Key.
    assert set(accepted) == keys
    counts = {key: sum(1 for a in arrivals if a.key == key) for key in keys}
    assert counts[arrivals[0].key] == 2, counts  # the held one: once to the killed sender, once more
    # Another delivery may have been in flight (sent, not yet recorded) when the kill came: it is
    # sent again too. Nothing is sent more than once per sender that took it.
    assert set(counts.values()) <= {1, 2}, counts
    assert sum(Delivery.objects.values_list("attempts", flat=True)) >= len(arrivals)


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope)
        return "250 OK"


def test_an_email_rule_delivers_to_a_real_smtp_server(api_client):
    port = free_port()
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with endpoint(failures=1000) as (url, _), platform(DJANGO_EMAIL_HOST="127.0.0.1", DJANGO_EMAIL_PORT=str(port)):
            channel = _post(
                api_client,
                "/api/v1/notification-channels",
                {"name": "mail", "kind": "email", "target": "ops@example.com"},
            )
            _post(api_client, "/api/v1/notification-rules", {"channel": channel["id"], "on_failure": True})
            _task(api_client, url)
            wait_for(lambda: mailbox.messages, timeout=60, what="an e-mail")
            time.sleep(1)
    finally:
        controller.stop()
    (message,) = mailbox.messages
    delivery = Delivery.objects.get()
    assert message.rcpt_tos == ["ops@example.com"]
    text = message.content.decode()
    assert "is failing" in text and f"<{delivery.idempotency_key}@tms.notifications>" in text
    assert delivery.status == DeliveryStatus.DELIVERED


def test_a_late_run_and_a_dead_mans_switch_fire(api_client):
    with webhook_receiver() as receiver, endpoint(failures=1000) as (url, job), platform():
        channel = _webhook(api_client, receiver)
        _post(api_client, "/api/v1/notification-rules", {"channel": channel["id"], "late_after": "5s"})
        # Due 20 s ago: it starts (within its misfire grace) about 20 s late.
        _post(
            api_client,
            "/api/v1/tasks",
            {"name": "late", "runner": "noop", "start_at": (timezone.now() - timedelta(seconds=20)).isoformat()},
        )
        wait_for(lambda: "late" in receiver.events(), timeout=60, what="the late notification")
        # A recurring task that never succeeds, with a dead man's switch of 4 s.
        task = _task(api_client, url, interval="1s")
        _post(
            api_client,
            "/api/v1/notification-rules",
            {"task": task["id"], "channel": channel["id"], "no_success_within": "4s"},
        )
        wait_for(lambda: "overdue" in receiver.events(), timeout=60, what="the overdue notification")
        job.failures = 0  # it succeeds from now on
        wait_for(lambda: "recovered" in receiver.events(), timeout=60, what="the recovered notification")
        time.sleep(3)
        events = receiver.events()
    assert sorted(events) == ["late", "overdue", "recovered"]
    late = next(p for p in receiver.accepted.values() if p["event"] == "late")
    assert late["lateness_seconds"] >= 15
