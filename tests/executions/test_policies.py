"""Misfire, overlap and priority policies on the running system: real worker and monitor
processes, real PostgreSQL and RabbitMQ. Every test asserts counts."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from executions.models import ACTIVE_STATUSES, Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_pause, task_resume
from tests.factories import UserFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.clock import db_now
from tooling.harness.ledger import LedgerServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {
    "TMS_HEARTBEAT_INTERVAL": "0.5",
    "TMS_WORKER_TIMEOUT": "5",
    "TMS_MONITOR_MAX_SLEEP": "0.2",
}
#: The tasks' misfire grace.
GRACE = timedelta(seconds=2)


@pytest.fixture
def owner():
    return UserFactory()


def _live(task):
    return Execution.objects.filter(task=task, superseded=False)


def _all_done(*tasks) -> bool:
    return not Execution.objects.filter(task__in=tasks, status__in=ACTIVE_STATUSES).exists()


def _reasons(task) -> list[str]:
    return list(SkippedOccurrence.objects.filter(task=task).values_list("reason", flat=True))


def test_misfire_policies_after_downtime(owner):
    # The platform comes up first: the misfire policy also applies where runs are dispatched and
    # claimed, so the runs within the grace must not wait for a worker to start.
    worker, monitor = start_worker(concurrency=4, **FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        missed_before, missed, tasks = _downtime_tasks(owner)
        wait_for(lambda: _all_done(*tasks.values()), timeout=40, what="every run to finish")
    _check_misfire_outcomes(missed_before, missed, tasks)


def _downtime_tasks(owner):
    # Tasks whose every-second schedule began 20 s ago, while the scheduler was down.
    now = db_now()
    start = now - timedelta(seconds=20)
    options = {
        "runner": "noop",
        "start_at": start,
        "interval": timedelta(seconds=1),
        "end_at": now + timedelta(seconds=2),
        "misfire_grace": GRACE,
    }
    tasks = {
        policy: task_create(owner=owner, misfire_policy=policy, **options) for policy in ("skip", "run_once", "run_all")
    }
    tasks["run_all_5"] = task_create(owner=owner, misfire_policy="run_all", catch_up_limit=5, **options)
    missed_before = now - GRACE
    missed = sum(1 for k in range(30) if start + timedelta(seconds=k) < missed_before)
    assert missed >= 17
    return missed_before, missed, tasks


def _check_misfire_outcomes(missed_before, missed, tasks) -> None:
    """The outcomes, allowing for when each decision was made: the materialiser decides at
    creation (``missed`` fire times were more than the grace late then), the monitor and the
    worker again at dispatch and claim, by which time (a loaded machine, a 2 s grace) up to two
    more fire times may have become misfires too."""

    def started(task):
        return _live(task).filter(started_at__isnull=False)

    def ran_missed(task) -> int:
        return started(task).filter(scheduled_for__lt=missed_before, status=S.SUCCEEDED).count()

    assert ran_missed(tasks["skip"]) == 0
    assert set(_reasons(tasks["skip"])) == {"missed"}
    assert missed <= len(_reasons(tasks["skip"])) <= missed + 3
    coalesced = SkippedOccurrence.objects.filter(task=tasks["run_once"]).order_by("scheduled_for")
    assert set(coalesced.values_list("reason", flat=True)) == {"coalesced"}
    assert missed - 1 <= coalesced.count() <= missed + 2
    last_coalesced = coalesced.last().scheduled_for
    # Nothing before the last coalesced fire time ran; the one catch-up run is the next one.
    assert not started(tasks["run_once"]).filter(scheduled_for__lte=last_coalesced).exists()
    catch_up = started(tasks["run_once"]).order_by("scheduled_for").first()
    assert catch_up.scheduled_for == last_coalesced + timedelta(seconds=1)
    assert catch_up.status == S.SUCCEEDED
    assert ran_missed(tasks["run_all"]) in (missed, missed + 1)
    assert _reasons(tasks["run_all"]) == []
    # run_all within its catch_up_limit: the latest 5 missed fire times run, the earlier ones are
    # coalesced.
    coalesced = list(
        SkippedOccurrence.objects.filter(task=tasks["run_all_5"])
        .order_by("scheduled_for")
        .values_list("scheduled_for", "reason")
    )
    assert {reason for _, reason in coalesced} == {"coalesced"}
    assert missed - 5 <= len(coalesced) <= missed - 5 + 3
    runs = started(tasks["run_all_5"]).order_by("scheduled_for")
    assert runs.first().scheduled_for == coalesced[-1][0] + timedelta(seconds=1)
    assert 2 <= ran_missed(tasks["run_all_5"]) <= 5
    # Nothing within the grace or after it is lost with run_all; for every policy the last fire
    # time (still ahead when the tasks were created) ran.
    recent = _live(tasks["run_all"]).filter(scheduled_for__gte=missed_before)
    assert recent.count() == recent.filter(status=S.SUCCEEDED).count() >= 3
    for task in tasks.values():
        assert _live(task).order_by("-scheduled_for").first().status == S.SUCCEEDED


def test_pause_then_resume_applies_each_misfire_policy(owner):
    worker, monitor = start_worker(concurrency=4, **FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        options = {"runner": "noop", "interval": timedelta(seconds=1), "misfire_grace": GRACE}
        tasks = {p: task_create(owner=owner, misfire_policy=p, **options) for p in ("skip", "run_once", "run_all")}
        wait_for(
            lambda: all(_live(t).filter(status=S.SUCCEEDED).exists() for t in tasks.values()),
            timeout=20,
            what="a first run of each task",
        )
        for task in tasks.values():
            task_pause(task=task, actor="test")
        paused_at = db_now()
        wait_for(lambda: db_now() - paused_at > timedelta(seconds=6), timeout=10, interval=0.2, what="a pause")
        resumed_at = db_now()
        for task in tasks.values():
            task_resume(task=task, actor="test")
        wait_for(lambda: db_now() - resumed_at > timedelta(seconds=2), timeout=10, interval=0.2, what="some runs")
        for task in tasks.values():
            task_pause(task=task, actor="test")
        wait_for(lambda: _all_done(*tasks.values()), timeout=30, what="every run to finish")

    # Fire times well inside the pause that no execution ran.
    window = (paused_at + timedelta(seconds=1), resumed_at - GRACE - timedelta(seconds=1))

    def in_window(query):
        return query.filter(scheduled_for__gte=window[0], scheduled_for__lt=window[1])

    inside = int((window[1] - window[0]).total_seconds())
    assert inside >= 2
    skip, run_once, run_all = tasks["skip"], tasks["run_once"], tasks["run_all"]
    assert in_window(_live(skip)).count() == 0
    assert in_window(SkippedOccurrence.objects.filter(task=skip, reason="paused")).count() in (inside, inside + 1)
    assert in_window(_live(run_once)).count() <= 1
    assert in_window(SkippedOccurrence.objects.filter(task=run_once, reason="paused")).count() >= inside - 1
    assert in_window(_live(run_all).filter(status=S.SUCCEEDED)).count() in (inside, inside + 1)
    assert in_window(SkippedOccurrence.objects.filter(task=run_all)).count() == 0
    # run_once ran exactly one catch-up for the whole pause: the fire time right after the last
    # coalesced one (each resume reads the clock itself, so the exact instant varies).
    coalesced = SkippedOccurrence.objects.filter(task=run_once, scheduled_for__gt=paused_at).order_by("scheduled_for")
    last_coalesced = coalesced.last().scheduled_for
    before_catch_up = _live(run_once).filter(scheduled_for__gt=paused_at, scheduled_for__lte=last_coalesced)
    # An execution materialised within the grace but dispatched or claimed after it (a loaded
    # machine) is dropped there: a CANCELLED row with its own coalesced record, never started.
    assert not before_catch_up.exclude(status=S.CANCELLED).exists()
    assert not before_catch_up.filter(started_at__isnull=False).exists()
    dropped = set(before_catch_up.values_list("scheduled_for", flat=True))
    assert dropped <= set(coalesced.values_list("scheduled_for", flat=True))
    catch_up = _live(run_once).get(scheduled_for=last_coalesced + timedelta(seconds=1))
    assert catch_up.status == S.SUCCEEDED


def _intervals(task):
    rows = _live(task).filter(started_at__isnull=False).order_by("started_at")
    return [(e.pk, e.started_at, e.finished_at, e.status) for e in rows]


def _overlapping_pairs(intervals) -> int:
    return sum(1 for a, b in itertools.combinations(intervals, 2) if a[1] < b[2] and b[1] < a[2])


def test_overlap_policies_with_runs_longer_than_the_interval(owner):
    ledger = LedgerServer(default_duration=2.5).start()
    try:
        worker, monitor = start_worker(concurrency=8, **FAST), start_monitor(**FAST)
        with running(worker, monitor):
            wait_worker_ready(worker)
            now = db_now()
            common = {"interval": timedelta(seconds=1), "start_at": now + timedelta(seconds=1)}
            common["end_at"] = common["start_at"] + timedelta(seconds=6)
            sleep = {"runner": "sleep", "config": {"duration": "2.5s"}, **common}
            tasks = {p: task_create(owner=owner, overlap_policy=p, **sleep) for p in ("allow", "skip", "queue_one")}
            http = {"url": ledger.url, "method": "POST", "json": {"duration": 2.5}, "async": True}
            tasks["cancel_previous"] = task_create(
                owner=owner, overlap_policy="cancel_previous", runner="http", config=http, **common
            )
            wait_for(lambda: _all_done(*tasks.values()), timeout=60, what="every run to end")
    finally:
        ledger.stop()
    occurrences = 7
    for task in tasks.values():
        assert _live(task).count() == occurrences

    allow = _intervals(tasks["allow"])
    assert len(allow) == occurrences
    assert _overlapping_pairs(allow) >= occurrences - 1  # runs of 2.5 s every second overlap

    skip = tasks["skip"]
    ran = [i for i in _intervals(skip) if i[3] == S.SUCCEEDED]
    assert _overlapping_pairs(ran) == 0
    skipped = _live(skip).filter(status=S.CANCELLED)
    assert len(ran) + skipped.count() == occurrences
    assert 2 <= len(ran) <= 4
    assert SkippedOccurrence.objects.filter(task=skip, reason="overlap").count() == skipped.count()
    assert all(e.error.startswith("overlap: previous run") for e in skipped)

    queue = tasks["queue_one"]
    ran = [i for i in _intervals(queue) if i[3] == S.SUCCEEDED]
    assert _overlapping_pairs(ran) == 0
    assert len(ran) >= 3  # the first, and queued ones started as soon as the previous ended
    # Never more than one waiting: the spans from "queued" to start never overlap.
    waits = []
    for execution in _live(queue):
        queued = execution.events.filter(detail__startswith="overlap: queued behind").order_by("at").first()
        if queued is not None:
            waits.append((execution.pk, queued.at, execution.started_at or execution.finished_at, ""))
    assert waits
    assert _overlapping_pairs(waits) == 0
    dropped = _live(queue).filter(status=S.CANCELLED)
    assert len(ran) + dropped.count() == occurrences
    assert SkippedOccurrence.objects.filter(task=queue, reason="overlap").count() == dropped.count()

    cancel = tasks["cancel_previous"]
    runs = list(_live(cancel).order_by("scheduled_for"))
    assert [e.status for e in runs] == [S.CANCELLED] * (occurrences - 1) + [S.SUCCEEDED]
    for previous, following in itertools.pairwise(runs):
        assert previous.error == f"cancelled by the next run ({following.pk})"
    # Each cancelled run was really cancelled through its runner: the job API saw the DELETE.
    for execution in runs[:-1]:
        assert ledger.ledger.by_key[f"tms-{execution.pk}-1"].cancelled
    assert not ledger.ledger.by_key[f"tms-{runs[-1].pk}-1"].cancelled
    assert ledger.ledger.duplicate_launches() == 0


@pytest.mark.parametrize("paced", [True, False], ids=["fair-share pacing", "everything published at once"])
def test_higher_priority_starts_first_under_a_backlog(owner, paced):
    # The backlog exists before the monitor starts. Paced (the default), the monitor's fair pick
    # publishes an owner's runs priority first; unpaced, all 40 are published at once and the
    # broker's priority queue delivers the high ones first.
    low = [task_create(owner=owner, runner="noop", priority=0) for _ in range(30)]
    high = [task_create(owner=owner, runner="noop", priority=9) for _ in range(10)]
    everything = low + high
    pacing = {} if paced else {"TMS_MONITOR_QUEUE_SECONDS": "0"}
    monitor = start_monitor(**FAST, TMS_PENDING_REPUBLISH_AFTER="300", **pacing)
    with running(monitor):
        if not paced:
            wait_for(
                lambda: Execution.objects.filter(task__in=everything, status=S.PENDING).count() == 40,
                timeout=20,
                what="the monitor to publish all 40",
            )
        worker = start_worker(concurrency=1, **FAST)
        with running(worker):
            wait_for(
                lambda: Execution.objects.filter(task__in=everything, status=S.SUCCEEDED).count() == 40,
                timeout=60,
                what="all 40 to run",
            )
    order = list(
        Execution.objects.filter(task__in=everything).order_by("started_at").values_list("priority", flat=True)
    )
    assert order[:10] == [9] * 10, order
    assert sorted(order[10:]) == [0] * 30
