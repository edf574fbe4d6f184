"""Named limits on the running system: several real worker processes, a monitor, PostgreSQL and
RabbitMQ. A concurrency cap shared by several tasks, a rate window, and a slot whose worker is
SIGKILLed. Each is checked from the event log (and the cap also sampled while the runs go)."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from executions.models import ACTIVE_STATUSES, Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_bulk_create, task_create
from tasks_api.limits import limit_create
from tests.executions.test_max_concurrency import _max_overlap
from tests.factories import UserFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.clock import db_now

FAST = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "5", "TMS_MONITOR_MAX_SLEEP": "0.2"}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _starts(executions) -> dict[int, object]:
    return dict(
        ExecutionEvent.objects.filter(execution__in=executions, from_status=S.PENDING, to_status=S.RUNNING)
        .order_by("at")
        .values_list("execution_id", "at")
    )


def test_a_limit_capped_at_two_never_has_three_running_across_tasks_and_workers():
    owner = UserFactory()
    limit_create(owner=owner, name="pair", max_concurrency=2)
    now = db_now()
    workers = [start_worker(f"worker-{n}", concurrency=2, **FAST) for n in range(3)]
    monitor = start_monitor(**FAST)
    with running(*workers, monitor):
        for worker in workers:
            wait_worker_ready(worker, timeout=180)
        # Three tasks share the limit: 12 runs of 0.5 s due within 0.2 s, six worker slots.
        tasks = [
            task_create(
                owner=owner,
                runner="sleep",
                config={"duration": "500ms"},
                start_at=now,
                interval=timedelta(milliseconds=50),
                max_runs=4,
                limits=["pair"],
            )
            for _ in range(3)
        ]
        rows = Execution.objects.filter(task__in=tasks)
        most, samples = 0, 0
        deadline = time.monotonic() + 90
        while rows.count() < 12 or rows.filter(status__in=ACTIVE_STATUSES).exists():
            assert time.monotonic() < deadline, list(rows.values_list("status", "waiting"))
            most = max(most, rows.filter(status=S.RUNNING).count())
            samples += 1
            time.sleep(0.02)
    assert set(rows.values_list("status", flat=True)) == {S.SUCCEEDED}
    assert most <= 2 and samples > 50, (most, samples)
    events = ExecutionEvent.objects.filter(execution__task__in=tasks)
    starts = _starts(rows)
    ends = dict(events.filter(to_status=S.SUCCEEDED).values_list("execution_id", "at"))
    assert len(starts) == len(ends) == 12  # each run started once
    assert _max_overlap([(starts[i], ends[i]) for i in starts]) == 2  # the cap held, and was used
    waits = events.filter(from_status=S.PENDING, to_status=S.SCHEDULED, detail="waiting: limit pair concurrency 2")
    assert waits.exists()
    assert waits.count() <= 4 * 12, waits.count()  # released by the ends of runs, not by polling
    assert not rows.exclude(waiting="").exists()


@pytest.mark.timeout(900)
def test_a_rate_of_five_per_second_over_a_minute_with_three_workers():
    owner = UserFactory()
    limit_create(owner=owner, name="five", windows=[{"count": 5, "seconds": 1}])
    workers = [start_worker(f"worker-{n}", concurrency=2, **FAST) for n in range(3)]
    monitor = start_monitor(**FAST)
    with running(*workers, monitor):
        for worker in workers:
            wait_worker_ready(worker, timeout=180)
        # More one-shot runs due now than a minute at 5/s can start.
        tasks = task_bulk_create(owner=owner, specs=[{"runner": "noop", "limits": ["five"]}] * 400)
        rows = Execution.objects.filter(task__in=tasks)
        first = wait_for(lambda: next(iter(_starts(rows).values()), None), timeout=30, what="a first start")
        while db_now() < first + timedelta(seconds=61):
            time.sleep(0.5)
    starts = sorted(_starts(rows).values())
    in_minute = [at for at in starts if at < first + timedelta(seconds=60)]
    assert 285 <= len(in_minute) <= 305, len(in_minute)
    # Never more than five in any one-second window: any six starts span at least a second.
    tight = [(a, b) for a, b in zip(starts, starts[5:], strict=False) if b - a < timedelta(seconds=1)]
    assert not tight, tight[:3]
    waits = ExecutionEvent.objects.filter(execution__in=rows, detail="waiting: limit five 5/s")
    # Waiters are booked one rate interval apart, not woken together when the window rolls, so a
    # run is refused a bounded number of times, not once per second it waits (400 runs waiting up
    # to 80 s would be about 16,000 refusals). A booked run that arrives after its slot went to
    # another is booked again at the back of the line: about 6 waits per run were measured.
    assert waits.count() <= 10 * rows.count(), waits.count()


class _SlowOrFast(BaseHTTPRequestHandler):
    """``/slow`` answers after a minute (a synchronous run that lives in its worker); ``/fast`` at once."""

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(60)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowOrFast)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_slot_held_by_a_sigkilled_worker_is_taken_by_another_run_after_its_lease(slow_server):
    owner = UserFactory()
    # One run at a time per target host: both tasks call 127.0.0.1.
    limit_create(owner=owner, name="solo", scope="host", max_concurrency=1)
    doomed, monitor = start_worker("doomed", concurrency=2, **FAST), start_monitor(**FAST)
    with running(doomed, monitor):
        wait_worker_ready(doomed, timeout=180)
        # A synchronous HTTP call: the run lives in the worker and dies with it.
        holder = task_create(
            owner=owner, runner="http", config={"url": f"{slow_server}/slow", "method": "GET"}, limits=["solo"]
        )
        wait_for(
            lambda: Execution.objects.filter(task=holder, status=S.RUNNING).exists(), timeout=30, what="holder runs"
        )
        other = task_create(
            owner=owner, runner="http", config={"url": f"{slow_server}/fast", "method": "GET"}, limits=["solo"]
        )
        wait_for(
            lambda: Execution.objects.filter(task=other, waiting="limit 127.0.0.1 concurrency 1").exists(),
            timeout=30,
            what="the other run waiting for the slot",
        )
        # The holder keeps its slot while its worker lives: the other run still waits 6 s later.
        time.sleep(6)
        assert Execution.objects.filter(task=other, status=S.SCHEDULED).exists()
        killed_at = db_now()
        doomed.signal_group(signal.SIGKILL)
        rescuer = start_worker("rescuer", concurrency=2, **FAST)
        with running(rescuer):
            wait_worker_ready(rescuer, timeout=180)
            wait_for(
                lambda: Execution.objects.filter(task=other, status=S.SUCCEEDED).exists(),
                timeout=45,
                what="the other run took the slot and finished",
            )
    (started,) = _starts(Execution.objects.filter(task=other)).values()
    # Not before the dead worker's lease (5 s) could lapse; well before the 60 s run would end.
    assert killed_at + timedelta(seconds=4) < started < killed_at + timedelta(seconds=5 + 30 + 2), (killed_at, started)
