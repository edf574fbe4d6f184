"""TMS_QUEUE_TYPE (issue 45): TMS's queues as classic queues with ``x-max-priority`` (the
default) or as quorum queues, declared alike by every declarer; a process that meets a queue of
the other type stops with what to do; on quorum queues no message carries an ETA (a worker
consuming one has no global QoS to hold it with), so the monitor takes no run before its time.

The processes here run on the shared RabbitMQ node (a quorum queue works on one node as well);
the loss of a cluster node is tests/ha/test_quorum_queues.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
from datetime import timedelta

import pytest
import requests
from amqp.exceptions import PreconditionFailed
from django.conf import settings
from django.utils import timezone
from kombu import Queue

from executions.messages import eta_of
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from executions.transitions import Dispatch
from tests.executions.test_dispatch_batches import ManyPublisher
from tests.executions.test_monitor import FlakyPublisher
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import ROOT, process_env, running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_project.celery import app

_names = itertools.count(1)


def _settings_of(**env: str) -> subprocess.CompletedProcess[str]:
    """The queue settings a process started with ``env`` declares (its stdout), or its error."""
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print([(q.name, q.queue_arguments) for q in s.CELERY_TASK_QUEUES]); "
        "print(s.CELERY_TASK_QUEUE_MAX_PRIORITY, s.CELERY_TASK_DEFAULT_QUEUE_TYPE, s.TMS['QUEUE_TYPE'])"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=process_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_queue_type_setting_gives_every_queue_its_arguments():
    classic = _settings_of()
    assert classic.returncode == 0, classic.stderr
    assert "('tms.test." in classic.stdout and classic.stdout.count("{'x-max-priority': 9}") == 2
    assert classic.stdout.splitlines()[1] == "9 classic classic"

    quorum = _settings_of(TMS_QUEUE_TYPE="quorum")
    assert quorum.returncode == 0, quorum.stderr
    # Both queues quorum, neither with x-max-priority (a 3.10 quorum queue refuses it), and no
    # priority argument Celery would add to a queue of its own.
    assert quorum.stdout.count("{'x-queue-type': 'quorum'}") == 2 and "x-max-priority" not in quorum.stdout
    assert quorum.stdout.splitlines()[1] == "None quorum quorum"

    bad = _settings_of(TMS_QUEUE_TYPE="stream")
    assert bad.returncode != 0
    assert "TMS_QUEUE_TYPE must be classic or quorum, not 'stream'" in bad.stderr

    embedded = _settings_of(TMS_QUEUE_TYPE="quorum", CELERY_BROKER_URL="filesystem://")
    assert embedded.returncode != 0 and "TMS_QUEUE_TYPE=quorum needs RabbitMQ" in embedded.stderr


def test_no_eta_on_quorum_queues(settings):
    later = timezone.now() + timedelta(seconds=5)
    items = [Dispatch(1, 1, 0, "1-x", "run", later)]
    assert eta_of(items) == later
    settings.TMS = {**settings.TMS, "QUEUE_TYPE": "quorum"}
    assert eta_of(items) is None


@pytest.mark.django_db
def test_on_quorum_queues_the_monitor_takes_no_run_before_its_due_time():
    """With a lookahead of 0.8 s a run due in 0.3 s is taken now on classic queues (published with
    an ETA); on quorum queues it stays SCHEDULED until due, and the pass wakes for it then."""
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    run = ExecutionFactory(task=task, scheduled_for=db_now() + timedelta(seconds=0.3))
    base = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.0, MONITOR_LOOKAHEAD=0.8)

    quorum = Monitor(
        conf=dataclasses.replace(base, QUEUE_TYPE="quorum"), publish=FlakyPublisher(), publish_many=ManyPublisher()
    )
    assert quorum.ahead == 0.0
    sent, wait = quorum.dispatch_once(housekeeping=False)
    assert sent == 0 and Execution.objects.get(pk=run.pk).status == S.SCHEDULED
    assert wait is not None and 0.05 < wait <= 0.3, wait

    classic = Monitor(conf=base, publish=FlakyPublisher(), publish_many=ManyPublisher())
    sent, _ = classic.dispatch_once(housekeeping=False)
    assert sent == 1 and Execution.objects.get(pk=run.pk).status == S.PENDING


def _fresh_names() -> dict[str, str]:
    name = f"{settings.TMS_QUEUE}.qt{next(_names)}"
    return {"TMS_QUEUE": name, "TMS_NOTIFY_QUEUE": f"{name}.notify"}


def _delete(*names: str) -> None:
    with app.connection_for_write() as conn:
        for name in names:
            conn.default_channel.queue_delete(name)


def _declare_classic(name: str) -> None:
    with app.connection_for_write() as conn:
        Queue(name, durable=True, queue_arguments={"x-max-priority": 9})(conn.default_channel).declare()


HINT = re.compile(
    r"TMS_QUEUE_TYPE=quorum\): it exists with other arguments .*set TMS_QUEUE_TYPE=classic again, or migrate"
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_monitor_meeting_a_classic_queue_as_quorum_stops_naming_the_setting():
    names = _fresh_names()
    _declare_classic(names["TMS_QUEUE"])
    try:
        task = TaskFactory(misfire_grace=timedelta(hours=1))
        run = ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(seconds=1))
        monitor = start_monitor(TMS_QUEUE_TYPE="quorum", **names)
        with running(monitor):
            wait_for(lambda: not monitor.alive, timeout=30, what="the monitor to stop")
            assert monitor.popen.returncode == 1
            log = monitor.log()
            assert "CommandError: RabbitMQ refused to declare queue" in log and HINT.search(log), log[-3000:]
        # Nothing taken: the declare comes before the take.
        assert Execution.objects.get(pk=run.pk).status == S.SCHEDULED
    finally:
        _delete(names["TMS_QUEUE"])


@pytest.mark.slow
def test_a_worker_meeting_a_classic_queue_as_quorum_stops_naming_the_setting():
    names = _fresh_names()
    _declare_classic(names["TMS_QUEUE"])
    try:
        worker = start_worker(concurrency=1, queue=names["TMS_QUEUE"], TMS_QUEUE_TYPE="quorum", **names)
        with running(worker):
            wait_for(lambda: not worker.alive, timeout=60, what="the worker to stop")
            assert worker.popen.returncode == 1
            log = worker.log()
            assert HINT.search(log), log[-3000:]
            # Once, not a restart every 2 s.
            assert len(re.findall("RabbitMQ refused to declare queue", log)) == 1, log[-3000:]
    finally:
        _delete(names["TMS_QUEUE"])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runs_go_through_quorum_queues_in_priority_order_each_once():
    """A monitor and a worker on quorum queues: the queue is a quorum queue (a classic declare of
    it is refused), every run starts once, and a herd queued behind a busy worker is started in
    priority order (the monitor's take orders it; the broker delivers in publish order)."""
    names = _fresh_names()
    env = {"TMS_QUEUE_TYPE": "quorum", "TMS_MONITOR_MAX_SLEEP": "0.3", "TMS_DISPATCH_BATCH": "1", **names}
    try:
        worker = start_worker(concurrency=1, queue=names["TMS_QUEUE"], **env)
        with running(worker):
            wait_worker_ready(worker)
            due = timezone.now() - timedelta(seconds=1)
            low = TaskFactory(misfire_grace=timedelta(hours=1), priority=1)
            # One owner: the fair share interleaves owners; within one, the take is by priority.
            high = TaskFactory(misfire_grace=timedelta(hours=1), priority=9, owner=low.owner)
            ids = [ExecutionFactory(task=low, scheduled_for=due - timedelta(milliseconds=i)).pk for i in range(10)]
            ids += [ExecutionFactory(task=high, scheduled_for=due - timedelta(milliseconds=i)).pk for i in range(10)]
            monitor = start_monitor(**env)
            with running(monitor):
                wait_for(
                    lambda: Execution.objects.filter(pk__in=ids, status=S.SUCCEEDED).count() == 20,
                    timeout=60,
                    what="every run to succeed",
                )
        for pk in ids:
            starts = ExecutionEvent.objects.filter(execution_id=pk, from_status=S.PENDING, to_status=S.RUNNING)
            assert starts.count() == 1
        order = list(Execution.objects.filter(pk__in=ids).order_by("started_at").values_list("task_id", flat=True))
        assert order[:10] == [high.pk] * 10, order
        with app.connection_for_write() as conn, pytest.raises(PreconditionFailed):
            Queue(names["TMS_QUEUE"], durable=True, queue_arguments={"x-max-priority": 9})(
                conn.default_channel
            ).declare()
    finally:
        _delete(names["TMS_QUEUE"], names["TMS_NOTIFY_QUEUE"])


def _declare_quorum(name: str) -> None:
    with app.connection_for_write() as conn:
        Queue(name, durable=True, queue_arguments={"x-queue-type": "quorum"})(conn.default_channel).declare()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_api_meeting_a_queue_of_the_other_type_answers_503_naming_the_setting():
    """A web process whose TMS_QUEUE_TYPE differs from the broker's queues: a task is still
    created (the monitor publishes its runs, not the API), and a channel's test message, which the
    web publishes, is a 503 naming the setting, not a 500."""
    from notifications.services import channel_create
    from tests.conftest import account_key_for
    from tests.factories import UserFactory
    from tests.web import start_web

    names = _fresh_names()
    _declare_classic(names["TMS_QUEUE"])
    _declare_classic(names["TMS_NOTIFY_QUEUE"])
    user = UserFactory()
    headers = {"Authorization": f"Token {account_key_for(user)}"}
    channel = channel_create(owner=user, data={"name": "hook", "kind": "webhook", "target": "http://127.0.0.1:9/"})
    try:
        web, base = start_web(workers=1, TMS_QUEUE_TYPE="quorum", **names)
        with running(web):
            created = requests.post(f"{base}/api/v1/tasks", json={"runner": "noop"}, headers=headers, timeout=30)
            assert created.status_code == 201, created.text

            test = requests.post(f"{base}/api/v1/notification-channels/{channel.pk}/test", headers=headers, timeout=30)
            assert test.status_code == 503, test.text
            assert test.headers["Retry-After"] and test.json()["type"] == "service_unavailable"
            detail = test.json()["detail"]
            assert "TMS_QUEUE_TYPE=quorum" in detail and names["TMS_NOTIFY_QUEUE"] in detail, detail
            log = web.log()
            assert "RabbitMQ refused to declare queue" in log and "Traceback" not in log, log[-3000:]
    finally:
        _delete(names["TMS_QUEUE"], names["TMS_NOTIFY_QUEUE"])


def test_a_refused_declare_of_a_quorum_queue_as_classic_is_a_503_naming_the_setting():
    """The other way round, in this process (classic): RabbitMQ's real 406 for a classic declare
    of a quorum queue, as a view would meet it, answered by the outage middleware."""
    from django.test import RequestFactory

    from ops.middleware import OutageMiddleware

    name = _fresh_names()["TMS_NOTIFY_QUEUE"]
    _declare_quorum(name)
    try:
        with pytest.raises(PreconditionFailed) as refused:
            _declare_classic(name)
    finally:
        _delete(name)
    middleware = OutageMiddleware(lambda request: None)
    response = middleware.process_exception(
        RequestFactory().post("/api/v1/notification-channels/1/test"), refused.value
    )
    assert response is not None and response.status_code == 503
    detail = json.loads(response.content)["detail"]
    assert "TMS_QUEUE_TYPE=classic" in detail and "set TMS_QUEUE_TYPE=quorum again" in detail, detail
    # Any other broker channel error is still not an outage (left to the 500 handler).
    assert middleware.process_exception(RequestFactory().get("/api/v1/tasks"), PreconditionFailed("other")) is None
