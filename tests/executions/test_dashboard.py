"""The dashboard's data: the rollup the trigger keeps equals what the executions say, per owner,
in a fixed number of queries."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta

import pytest
from django.db.models import Q, Sum
from django.utils import timezone

from executions import transitions
from executions.dashboard import OUTCOMES, dashboard_snapshot
from executions.histogram import BUCKETS, EDGES, bucket_of, percentile
from executions.models import (
    ROLLUP_SHARDS,
    Execution,
    ExecutionEvent,
    RunRollup,
    SkippedOccurrence,
    TaskRollup,
    Worker,
)
from executions.models import ExecutionStatus as S
from executions.periodic import periodic_jobs
from executions.rollup import CARRY_MINUTE, COUNTER_COLUMNS, floor_minute, rollup_compact, rollup_prune, rollup_rebuild
from tasks_api.moving import task_move
from tasks_app.models import Membership, Task
from tasks_app.teams.services import member_remove, member_set, personal_team_of, team_create
from tests.factories import TaskFactory, UserFactory
from tms_core.clock import db_now

pytestmark = pytest.mark.django_db

MAX = 1000
WORKER = "host:1:1"
#: The history is made of runs claimed long after they were due: not misfires (the policy
#: is applied at claim time too; tests/executions/test_misfire_outage.py covers it).
GRACE = timedelta(hours=1)


class Ledger:
    """Drives executions through the real transitions and remembers each ended attempt's times,
    which a retry overwrites on the row."""

    def __init__(self) -> None:
        self.retried: list[dict] = []

    def start(self, task: Task, *, late: float = 0.0, ran_for: float = 0.0) -> Execution:
        """A new execution of ``task`` due ``late`` seconds ago, taken, claimed, and made to look as
        if it started ``ran_for`` seconds ago (started_at only; its status went through
        transitions)."""
        due = timezone.now() - timedelta(seconds=late + ran_for)
        (pk,) = transitions.executions_create(rows=[transitions.NewExecution(task.pk, due, 5)], actor="test")
        return self._claim(pk, 1, ran_for)

    def _claim(self, pk: int, attempt: int, ran_for: float) -> Execution:
        taken = transitions.executions_take_due(limit=MAX, actor="monitor:test")
        assert pk in [d.execution_id for d in taken]
        assert transitions.execution_claim_loaded(execution_id=pk, attempt=attempt, worker_id=WORKER, lease_seconds=60)
        if ran_for:
            Execution.objects.filter(pk=pk).update(started_at=timezone.now() - timedelta(seconds=ran_for))
        return Execution.objects.get(pk=pk)

    def succeed(self, execution: Execution) -> None:
        assert transitions.execution_succeed(
            execution_id=execution.pk, attempt=execution.attempt, worker_id=WORKER, output="ok", max_chars=MAX
        )

    def fail(self, execution: Execution, *, retry: bool = False, claim: bool = True) -> Execution | None:
        before = Execution.objects.get(pk=execution.pk)
        outcome = transitions.execution_fail(
            execution_id=execution.pk,
            attempt=execution.attempt,
            worker_id=WORKER,
            error="boom",
            output="",
            retry_in=0 if retry else None,
            max_chars=MAX,
        )
        assert outcome == (S.SCHEDULED if retry else S.FAILED)
        if not retry:
            return None
        event = ExecutionEvent.objects.filter(execution=execution, from_status=S.RUNNING, to_status=S.SCHEDULED).last()
        self.retried.append(
            {"task": before.task, "started_at": before.started_at, "due_at": before.due_at, "ended": event.at}
        )
        if not claim:
            return Execution.objects.get(pk=execution.pk)
        return self._claim(execution.pk, execution.attempt + 1, 0)


def _expected(ledger: Ledger, team_ids: set[int] | None) -> dict:
    """What the execution table (and the retries the ledger saw) says the snapshot must show of
    the runs of the tasks of ``team_ids`` (None: every team)."""
    finished = Execution.objects.filter(status__in=(S.SUCCEEDED, S.FAILED, S.CANCELLED), superseded=False)
    if team_ids is not None:
        finished = finished.filter(task__team_id__in=team_ids)
    # A cancelled execution's last attempt ran if it was cancelled while RUNNING.
    cancelled_running = set(
        ExecutionEvent.objects.filter(to_status=S.CANCELLED, from_status=S.RUNNING).values_list(
            "execution_id", flat=True
        )
    )
    ended = [
        {
            "task": e.task,
            "outcome": e.status,
            "started_at": e.started_at if e.status != S.CANCELLED or e.pk in cancelled_running else None,
            "due_at": e.due_at,
            "ended": e.finished_at,
        }
        for e in finished.select_related("task")
    ]
    ended += [
        {**attempt, "outcome": "RETRIED"}
        for attempt in ledger.retried
        if team_ids is None or attempt["task"].team_id in team_ids
    ]
    by_outcome = Counter(row["outcome"] for row in ended)
    lateness: dict[datetime, list[int]] = defaultdict(lambda: [0] * BUCKETS)
    duration: dict[str, list[int]] = defaultdict(lambda: [0] * BUCKETS)
    per_minute: dict[datetime, Counter] = defaultdict(Counter)
    late_values: dict[datetime, list[float]] = defaultdict(list)
    took_values: dict[str, list[float]] = defaultdict(list)
    failures, runs = Counter(), Counter()
    for row in ended:
        minute = floor_minute(row["ended"])
        per_minute[minute][row["outcome"]] += 1
        runs[str(row["task"].pk)] += 1
        failures[str(row["task"].pk)] += row["outcome"] in ("FAILED", "RETRIED")
        if row["started_at"] is not None:
            late, took = (
                (row["started_at"] - row["due_at"]).total_seconds(),
                (row["ended"] - row["started_at"]).total_seconds(),
            )
            lateness[minute][bucket_of(late)] += 1
            duration[row["task"].runner][bucket_of(took)] += 1
            late_values[minute].append(late)
            took_values[row["task"].runner].append(took)
    return {
        "runs": {outcome: by_outcome.get(outcome, 0) for outcome in OUTCOMES},
        "per_minute": per_minute,
        "lateness": lateness,
        "duration": duration,
        # The extremes that bound each histogram's percentiles.
        "lateness_extremes": {m: (min(v), max(v)) for m, v in late_values.items()},
        "duration_extremes": {r: (min(v), max(v)) for r, v in took_values.items()},
        "failures": failures,
        "task_runs": runs,
    }


def _live(team_ids: set[int] | None) -> dict:
    executions = Execution.objects.all()
    if team_ids is not None:
        executions = executions.filter(task__team_id__in=team_ids)
    now = timezone.now()
    return {
        "running_now": executions.filter(status=S.RUNNING).count(),
        "due_backlog": executions.filter(Q(due_at__lte=now) | ~Q(waiting=""), status=S.SCHEDULED).count(),
        "pending_depth": executions.filter(status=S.PENDING).count(),
    }


def _teams_of(user) -> set[int]:
    return set(Membership.objects.filter(user=user).values_list("team_id", flat=True))


@pytest.fixture
def scene():
    """Two owners' tasks driven through success, failure, a retry, cancels and a supersede."""
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    a_noop = TaskFactory(owner=alice, runner="noop", name="alice noop", misfire_grace=GRACE)
    a_sleep = TaskFactory(owner=alice, runner="sleep", name="alice sleep", misfire_grace=GRACE)
    b_noop = TaskFactory(owner=bob, runner="noop", name="bob noop", misfire_grace=GRACE)
    ledger = Ledger()
    for late, ran_for in ((0, 0), (30, 0.3), (120, 7)):
        ledger.succeed(ledger.start(a_noop, late=late, ran_for=ran_for))
    ledger.fail(ledger.start(a_sleep, late=3, ran_for=40))
    # Fails, is retried, fails again for good.
    ledger.fail(ledger.fail(ledger.start(a_sleep, late=1, ran_for=2), retry=True))
    # Fails, is retried, succeeds.
    ledger.succeed(ledger.fail(ledger.start(b_noop, late=0.5, ran_for=1), retry=True))
    # Fails, is retried, and is cancelled while waiting for the retry: that attempt never ran.
    waiting = ledger.fail(ledger.start(b_noop, late=2, ran_for=3), retry=True, claim=False)
    assert transitions.execution_cancel(execution_id=waiting.pk, actor="bob").won
    running = ledger.start(b_noop, late=10)
    assert transitions.execution_cancel(execution_id=running.pk, actor="bob").won
    ledger.fail(ledger.start(b_noop, ran_for=300))
    # Cancelled before it started: a run (cancelled) with no lateness nor duration.
    (never,) = transitions.executions_create(
        rows=[transitions.NewExecution(b_noop.pk, timezone.now() + timedelta(minutes=5), 5)], actor="test"
    )
    assert transitions.execution_cancel(execution_id=never, actor="bob").won
    # Superseded by a schedule change: never a run.
    (superseded,) = transitions.executions_create(
        rows=[transitions.NewExecution(a_noop.pk, timezone.now() + timedelta(minutes=7), 5)], actor="test"
    )
    assert transitions.execution_cancel(execution_id=superseded, actor="alice", supersede=True).won
    # Live states: one of each, per owner where it matters.
    ledger.start(a_sleep)  # RUNNING
    (pending,) = transitions.executions_create(
        rows=[transitions.NewExecution(b_noop.pk, timezone.now() - timedelta(seconds=2), 5)], actor="test"
    )
    transitions.executions_take_due(limit=MAX, actor="monitor:test")  # PENDING
    transitions.executions_create(  # SCHEDULED past due (backlog) and upcoming
        rows=[
            transitions.NewExecution(a_noop.pk, timezone.now() - timedelta(seconds=1), 5),
            transitions.NewExecution(a_noop.pk, timezone.now() + timedelta(minutes=10), 5),
            transitions.NewExecution(b_noop.pk, timezone.now() + timedelta(minutes=20), 5),
        ],
        actor="test",
    )
    Task.objects.filter(pk=a_sleep.pk).update(next_run_at=timezone.now() + timedelta(minutes=30))
    Task.objects.filter(pk=b_noop.pk).update(next_run_at=timezone.now() + timedelta(hours=2))  # beyond the hour
    Task.objects.filter(pk=a_noop.pk).update(next_run_at=None)
    now = timezone.now()
    SkippedOccurrence.objects.create(task=a_noop, scheduled_for=now - timedelta(minutes=3), reason="missed")
    SkippedOccurrence.objects.create(task=b_noop, scheduled_for=now - timedelta(minutes=2), reason="overlap")
    SkippedOccurrence.objects.create(task=b_noop, scheduled_for=now - timedelta(minutes=1), reason="overlap")
    Worker.objects.create(id="w:1", hostname="w", pid=1, status="ALIVE")
    Worker.objects.create(id="w:2", hostname="w", pid=2, status="ALIVE")
    Worker.objects.create(id="w:3", hostname="w", pid=3, status="DEAD")
    Worker.objects.create(id="w:4", hostname="w", pid=4, status="DEAD", last_heartbeat=now - timedelta(days=3))
    return {"alice": alice, "bob": bob, "ledger": ledger, "tasks": (a_noop, a_sleep, b_noop), "pending": pending}


@pytest.mark.parametrize("viewer", ["staff", "alice", "bob"])
def test_snapshot_equals_the_execution_table(scene, viewer, staff_user):
    user = staff_user if viewer == "staff" else scene[viewer]
    team_ids = None if viewer == "staff" else _teams_of(user)
    expected = _expected(scene["ledger"], team_ids)

    snap = dashboard_snapshot(user=user)

    assert snap.runs_last_hour == expected["runs"]
    assert sum(expected["runs"].values()) > 0
    done = expected["runs"]["SUCCEEDED"] + expected["runs"]["FAILED"]
    assert snap.success_rate == pytest.approx(expected["runs"]["SUCCEEDED"] / done)
    assert {k: getattr(snap, k) for k in ("running_now", "due_backlog", "pending_depth")} == _live(team_ids)
    assert (snap.workers_alive, snap.workers_dead) == (2, 1)

    assert len(snap.runs_per_minute) == 1440
    assert snap.runs_per_minute[-1].minute == floor_minute(snap.now)
    shown = {p.minute: p.counts for p in snap.runs_per_minute if p.total}
    assert shown == {m: {o: c.get(o, 0) for o in OUTCOMES} for m, c in expected["per_minute"].items()}

    # Percentiles are clamped to the values' extremes; a retry's end is its statement's time,
    # which the ledger reads back from the event a moment later: compared to the millisecond.
    lateness = {p.minute: (p.count, p.p50, p.p99) for p in snap.lateness_per_minute if p.count}
    late_bounds = expected["lateness_extremes"]
    assert lateness == {
        m: (
            sum(h),
            pytest.approx(percentile(h, 0.5, late_bounds[m]), abs=1e-3),
            pytest.approx(percentile(h, 0.99, late_bounds[m]), abs=1e-3),
        )
        for m, h in expected["lateness"].items()
        if sum(h)
    }
    took_bounds = expected["duration_extremes"]
    assert [(d.runner, d.count, d.p50, d.p99) for d in snap.duration_by_runner] == [
        (
            runner,
            sum(h),
            pytest.approx(percentile(h, 0.5, took_bounds[runner]), abs=1e-3),
            pytest.approx(percentile(h, 0.99, took_bounds[runner]), abs=1e-3),
        )
        for runner, h in sorted(expected["duration"].items())
    ]

    failing = [(t.task_id, t.failures, t.runs) for t in snap.top_failing_tasks]
    assert failing == sorted(
        [(task, n, expected["task_runs"][task]) for task, n in expected["failures"].items() if n],
        key=lambda row: (-row[1], row[0]),
    )
    names = {str(t.pk): t.name for t in Task.objects.all()}
    assert all(t.name == names[t.task_id] for t in snap.top_failing_tasks)

    a_noop, a_sleep, b_noop = scene["tasks"]
    upcoming = {"staff": 3, "alice": 2, "bob": 1}[viewer]  # 2 SCHEDULED executions + a_sleep's cursor
    assert snap.upcoming_count == upcoming
    assert [u.due_at for u in snap.upcoming] == sorted(u.due_at for u in snap.upcoming)
    assert len(snap.upcoming) == upcoming
    skipped = {"staff": {"missed": 1, "overlap": 2}, "alice": {"missed": 1}, "bob": {"overlap": 2}}
    assert snap.skipped_by_reason == skipped[viewer]

    if viewer != "staff":  # isolation: nothing of the other owner's shows anywhere
        others = {str(t.pk) for t in (a_noop, a_sleep, b_noop) if t.owner_id != user.pk}
        seen = {t.task_id for t in snap.top_failing_tasks} | {u.task_id for u in snap.upcoming}
        assert seen and not (seen & others)


def test_the_expected_figures_are_not_trivial(scene, staff_user):
    """The scene covers every outcome, several lateness and duration buckets, and both runners."""
    expected = _expected(scene["ledger"], None)
    assert all(expected["runs"][o] > 0 for o in OUTCOMES)
    assert expected["runs"] == {"SUCCEEDED": 4, "FAILED": 3, "CANCELLED": 3, "RETRIED": 3}
    buckets = {b for h in expected["lateness"].values() for b, n in enumerate(h) if n}
    assert len(buckets) >= 4
    assert set(expected["duration"]) == {"noop", "sleep"}


def test_snapshot_query_count_is_fixed(scene, staff_user, django_assert_num_queries, django_assert_max_num_queries):
    alice = scene["alice"]
    # A member's team ids are read once (one query), then named as values in the statements that
    # need them; a team named is one of theirs, resolved by the page before.
    for user, team in (
        (staff_user, None),
        (alice, None),
        (alice, alice.personal_team),
        (staff_user, alice.personal_team),
    ):
        # A cold cache reads the settled hours and the minutes before the first whole one too.
        with django_assert_max_num_queries(12):
            dashboard_snapshot(user=user, team=team)
        # Then only the live tail (the same statement that read the whole day before): unless the
        # window moved on a minute in between, when the minutes before the first hour are read again.
        with django_assert_max_num_queries(11):
            dashboard_snapshot(user=user, team=team)
    now = timezone.now()
    with django_assert_num_queries(8):  # no clock read
        dashboard_snapshot(user=staff_user, now=now)


def test_a_member_sees_the_runs_of_a_teammates_tasks_and_a_team_narrows_them(staff_user):
    """Carol's task is in the team "ops", where Dave is a viewer: Dave's dashboard counts its runs
    (it counted only tasks one made, before the rollups were kept by team) beside his own task's;
    Erin, in neither team, sees nothing of them; ``team`` narrows to one team, for staff too."""
    carol, dave, erin = (UserFactory(username=name) for name in ("carol", "dave", "erin"))
    ops = team_create(creator=carol, name="Ops")
    member_set(team=ops, username="dave", role="viewer")
    shared = TaskFactory(owner=carol, team=ops, runner="noop", name="shared", misfire_grace=GRACE)
    own = TaskFactory(owner=dave, runner="sleep", name="dave's", misfire_grace=GRACE)
    ledger = Ledger()
    ledger.succeed(ledger.start(shared, late=2, ran_for=1))
    ledger.fail(ledger.fail(ledger.start(shared, late=0.3, ran_for=3), retry=True))
    ledger.fail(ledger.start(own, ran_for=0.5))
    ledger.start(shared)  # RUNNING
    transitions.executions_create(
        rows=[transitions.NewExecution(shared.pk, timezone.now() + timedelta(minutes=9), 5)], actor="test"
    )
    SkippedOccurrence.objects.create(task=shared, scheduled_for=timezone.now(), reason="overlap")
    views = {
        "dave": (dave, None, {ops.pk, dave.personal_team.pk}),
        "dave in ops": (dave, ops, {ops.pk}),
        "dave in his own": (dave, dave.personal_team, {dave.personal_team.pk}),
        "carol": (carol, None, {ops.pk, carol.personal_team.pk}),
        "erin": (erin, None, {erin.personal_team.pk}),
        "staff in ops": (staff_user, ops, {ops.pk}),
    }
    seen = {}
    for label, (user, team, team_ids) in views.items():
        snap = dashboard_snapshot(user=user, team=team)
        expected = _expected(ledger, team_ids)
        assert snap.runs_last_hour == expected["runs"], label
        assert {k: getattr(snap, k) for k in ("running_now", "due_backlog", "pending_depth")} == _live(team_ids)
        shown = {p.minute: p.counts for p in snap.runs_per_minute if p.total}
        assert shown == {m: {o: c.get(o, 0) for o in OUTCOMES} for m, c in expected["per_minute"].items()}, label
        failing = [(t.task_id, t.failures, t.runs) for t in snap.top_failing_tasks]
        assert failing == sorted(
            [(task, n, expected["task_runs"][task]) for task, n in expected["failures"].items() if n],
            key=lambda row: (-row[1], row[0]),
        ), label
        assert _figures(snap) == _figures(dashboard_snapshot(user=user, team=team, now=snap.now)), label
        seen[label] = (
            snap.runs_last_hour,
            snap.skipped_by_reason,
            snap.upcoming_count,
            [d.runner for d in snap.duration_by_runner],
        )
    assert seen["dave"] == (
        {"SUCCEEDED": 1, "FAILED": 2, "CANCELLED": 0, "RETRIED": 1},
        {"overlap": 1},
        1,
        ["noop", "sleep"],
    )
    assert seen["dave in ops"] == seen["carol"] == seen["staff in ops"]
    assert seen["dave in ops"][0] == {"SUCCEEDED": 1, "FAILED": 1, "CANCELLED": 0, "RETRIED": 1}
    assert seen["dave in his own"] == ({"SUCCEEDED": 0, "FAILED": 1, "CANCELLED": 0, "RETRIED": 0}, {}, 0, ["sleep"])
    assert seen["erin"] == (dict.fromkeys(OUTCOMES, 0), {}, 0, [])


def test_a_moved_tasks_failing_hours_go_with_it():
    """A task moved to another team takes its hours of "failing most" along, as its runs: the old
    team's dashboard no longer names it (its members may not see it now), the new team's does."""
    carol = UserFactory(username="carol")
    ops = team_create(creator=carol, name="Ops")
    task = TaskFactory(owner=carol, runner="noop", name="flaky", misfire_grace=GRACE)
    ledger = Ledger()
    ledger.fail(ledger.start(task, ran_for=1))
    assert [t.name for t in dashboard_snapshot(user=carol, team=carol.personal_team).top_failing_tasks] == ["flaky"]
    task_move(task=task, team=ops, user=carol)
    assert dashboard_snapshot(user=carol, team=carol.personal_team).top_failing_tasks == []
    assert [(t.name, t.failures) for t in dashboard_snapshot(user=carol, team=ops).top_failing_tasks] == [("flaky", 1)]


def test_the_kept_settled_hours_follow_a_change_of_membership():
    """What a render keeps of the settled hours is named by the teams it counts, not by the user:
    a member added to a team sees its history at the next render, and one removed no longer does."""
    carol, erin = UserFactory(username="carol"), UserFactory(username="erin")
    ops = team_create(creator=carol, name="Ops")
    minute = floor_minute(timezone.now() - timedelta(hours=3))
    RunRollup.objects.create(minute=minute, team_id=ops.pk, runner="noop", shard=0, succeeded=4)

    def total(user) -> int:
        return sum(p.total for p in dashboard_snapshot(user=user).runs_per_minute)

    assert (total(carol), total(erin)) == (4, 0)  # both kept
    member_set(team=ops, username="erin", role="viewer")
    assert total(erin) == 4
    member_remove(team=ops, username="erin")
    assert total(erin) == 0


def test_snapshot_of_an_empty_platform(staff_user):
    snap = dashboard_snapshot(user=staff_user)
    assert snap.runs_last_hour == dict.fromkeys(OUTCOMES, 0)
    assert snap.success_rate is None
    assert (snap.running_now, snap.due_backlog, snap.pending_depth, snap.upcoming_count) == (0, 0, 0, 0)
    assert snap.top_failing_tasks == snap.upcoming == snap.duration_by_runner == []
    assert all(p.p50 is None for p in snap.lateness_per_minute)


def test_a_lost_write_counts_nothing_and_a_dead_workers_run_counts_once():
    """A worker that dies mid-run counted nothing; the worker that resumes and ends the run
    counts it once, and the dead worker's late write loses and counts nothing."""
    task = TaskFactory(misfire_grace=GRACE)
    ledger = Ledger()
    execution = ledger.start(task)
    Execution.objects.filter(pk=execution.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    handed = transitions.executions_take_polls(limit=10, in_flight_for=30, actor="monitor:test")
    assert [d.execution_id for d in handed] == [execution.pk]
    assert not RunRollup.objects.exists()  # RUNNING -> RUNNING: nothing ended
    assert transitions.execution_acquire(execution_id=execution.pk, attempt=1, worker_id="host:2:2", lease_seconds=60)
    assert transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id="host:2:2", output="", max_chars=MAX
    )
    # The first worker comes back and tries to finish: fenced out, nothing counted.
    assert not transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id=WORKER, output="", max_chars=MAX
    )
    assert not transitions.execution_cancel(execution_id=execution.pk, actor="user").won
    totals = RunRollup.objects.aggregate(s=Sum("succeeded"), f=Sum("failed"), c=Sum("cancelled"), r=Sum("retried"))
    assert totals == {"s": 1, "f": 0, "c": 0, "r": 0}
    assert TaskRollup.objects.get(task=task).attempts == 1


def test_a_minute_s_shards_are_folded_once_the_minute_is_past(staff_user):
    task = TaskFactory(misfire_grace=GRACE)
    ledger = Ledger()
    # The 16 finishes in one minute: on a loaded machine they once straddled its end (two rows).
    second = db_now().second
    if second >= 50:
        time.sleep(60.2 - second)
    for _ in range(16):
        ledger.succeed(ledger.start(task))
    rows = RunRollup.objects.filter(team_id=task.team_id)
    # One transaction's finishes share its shard's row (executions.triggers); the other shards
    # are other transactions' (written here as concurrent workers' ends would write them).
    (written,) = rows
    assert written.succeeded == 16
    for shard in sorted(set(range(ROLLUP_SHARDS)) - {written.shard}):
        RunRollup.objects.create(
            minute=written.minute, team_id=task.team_id, runner=written.runner, shard=shard, succeeded=1
        )
    assert rows.values("shard").distinct().count() == ROLLUP_SHARDS
    before = dashboard_snapshot(user=staff_user)
    totals = rows.aggregate(**{c: Sum(c) for c in COUNTER_COLUMNS})

    assert rollup_compact() == 0  # the minute is current: left alone
    unfolded = rows.filter(shard__gt=0).count()
    assert unfolded == 7
    assert rollup_compact(older_than=-120) == unfolded
    assert list(rows.values_list("shard", flat=True).distinct()) == [0]
    assert rows.aggregate(**{c: Sum(c) for c in COUNTER_COLUMNS}) == totals
    after = dashboard_snapshot(user=staff_user, now=before.now)
    assert after == before
    assert periodic_jobs()["tms: fold the dashboard rollup's shards"] == ("tms.rollup_compact", 60.0)


def _table_extremes(runner: str) -> dict[str, float]:
    """The smallest and largest lateness and duration of ``runner``'s finished runs, from the rows."""
    from django.db.models import F, Max, Min

    rows = Execution.objects.filter(task__runner=runner, status=S.SUCCEEDED)
    late, took = F("started_at") - F("due_at"), F("finished_at") - F("started_at")
    found = rows.aggregate(late_min=Min(late), late_max=Max(late), took_min=Min(took), took_max=Max(took))
    return {name: value.total_seconds() for name, value in found.items()}


def test_percentiles_never_exceed_the_longest_run_nor_the_latest_start(staff_user):
    """Issue 44 item 2: noops of 27 ms all fall in the 25-50 ms bucket, whose interpolated p99
    read 49.7 ms; sleeps of 60-102 s in the 100-250 s and 50-100 s buckets read a p99 of about
    4 minutes. Each rollup row keeps its extremes: a percentile never passes the longest run
    (or the latest start), through the trigger, the fold of shards and a rebuild."""
    ledger = Ledger()
    noop = TaskFactory(runner="noop", name="quick", misfire_grace=GRACE)
    sleep = TaskFactory(runner="sleep", name="slow", misfire_grace=GRACE)
    for _ in range(5):
        ledger.succeed(ledger.start(noop, late=30, ran_for=0.027))
    for ran_for in (60, 70, 102):
        ledger.succeed(ledger.start(sleep, late=26, ran_for=ran_for))
    quick, slow = _table_extremes("noop"), _table_extremes("sleep")
    # The interpolation alone overshoots: the figures below would be the buckets' upper part.
    noop_counts = [0] * BUCKETS
    noop_counts[bucket_of(quick["took_max"])] = 5
    assert percentile(noop_counts, 0.99) > quick["took_max"] + 0.005

    def check(snap) -> None:
        durations = {d.runner: d for d in snap.duration_by_runner}
        assert durations["noop"].count == 5 and durations["sleep"].count == 3
        for runner, extremes in (("noop", quick), ("sleep", slow)):
            for p in (durations[runner].p50, durations[runner].p99):
                assert extremes["took_min"] - 1e-6 <= p <= extremes["took_max"] + 1e-6
        assert durations["noop"].p99 == pytest.approx(quick["took_max"], abs=1e-6)
        assert durations["sleep"].p99 == pytest.approx(slow["took_max"], abs=1e-6)
        (point,) = [p for p in snap.lateness_per_minute if p.count]
        assert point.count == 8
        latest = max(quick["late_max"], slow["late_max"])
        assert point.p99 == pytest.approx(latest, abs=1e-6) and point.p99 < 31
        assert min(quick["late_min"], slow["late_min"]) - 1e-6 <= point.p50 <= latest + 1e-6

    before = dashboard_snapshot(user=staff_user)
    check(before)
    row = RunRollup.objects.filter(runner="sleep").aggregate(m=Sum("duration_00"))  # rows were written
    assert row["m"] == 0
    assert rollup_compact(older_than=-120) >= 0
    assert RunRollup.objects.filter(shard__gt=0).count() == 0
    check(dashboard_snapshot(user=staff_user, now=before.now))
    assert rollup_rebuild(since=timezone.now() - timedelta(hours=1)) == 8
    check(dashboard_snapshot(user=staff_user, now=before.now))


def test_bucket_bounds_in_sql_are_the_pythons():
    """The trigger's width_bucket over the frozen bounds agrees with histogram.bucket_of."""
    from django.db import connection

    values = [-1.0, 0.0, 0.004, *EDGES, *(e * 0.999 for e in EDGES), *(e * 1.001 for e in EDGES), 1e9]
    array = "{" + ",".join(repr(e) for e in EDGES) + "}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT width_bucket(v, %s::float8[]) FROM unnest(%s::float8[]) v", [array, values])
        assert [row[0] for row in cursor.fetchall()] == [bucket_of(v) for v in values]


def test_prune_keeps_the_retention_and_beat_runs_it(settings):
    settings.TMS = {**settings.TMS, "ROLLUP_RETENTION": 3600.0, "TASK_ROLLUP_RETENTION": 7200.0}
    task = TaskFactory(misfire_grace=GRACE)
    now = timezone.now().replace(second=0, microsecond=0)
    for age in (0, 59, 61, 121):
        RunRollup.objects.create(
            minute=now - timedelta(minutes=age), team_id=task.team_id, runner="noop", shard=0, succeeded=age + 1
        )
        TaskRollup.objects.create(hour=now - timedelta(minutes=age), task=task, team_id=task.team_id)
    assert rollup_prune(now=now) == (2, 1)
    assert RunRollup.objects.exclude(minute=CARRY_MINUTE).count() == 2
    # The pruned minutes live on in one carry row, so all-time totals (/metrics) never go back.
    carry = RunRollup.objects.get(minute=CARRY_MINUTE)
    assert (carry.runner, carry.succeeded) == ("noop", 62 + 122)
    assert RunRollup.objects.aggregate(s=Sum("succeeded"))["s"] == 1 + 60 + 62 + 122
    rollup_prune(now=now)  # again: nothing more to fold, the carry unchanged
    assert RunRollup.objects.get(minute=CARRY_MINUTE).succeeded == 62 + 122
    assert TaskRollup.objects.count() == 3
    assert periodic_jobs()["tms: prune the dashboard rollup"] == ("tms.rollup_prune", 3600.0)


def test_rebuild_recounts_what_the_trigger_counted(scene):
    outcomes = ["succeeded", "failed", "cancelled", "retried"]
    before = RunRollup.objects.aggregate(**{c: Sum(c) for c in COUNTER_COLUMNS})
    tasks_before = TaskRollup.objects.aggregate(a=Sum("attempts"), f=Sum("failures"))
    counted = rollup_rebuild(since=timezone.now() - timedelta(hours=1))
    after = RunRollup.objects.aggregate(**{c: Sum(c) for c in COUNTER_COLUMNS})
    assert counted == 10
    assert {c: after[c] for c in outcomes} == {c: before[c] for c in outcomes}
    # Attempts that were retried left no row: their histogram entries (they all ran) are gone.
    for prefix in ("lateness", "duration"):
        total = [sum(row[c] or 0 for c in COUNTER_COLUMNS if c.startswith(prefix)) for row in (before, after)]
        assert total[1] == total[0] - 3
    for column in COUNTER_COLUMNS[4:]:
        assert after[column] is None or after[column] <= before[column]
    # A task's hours count final outcomes only after a rebuild: the 3 retried attempts are gone.
    assert TaskRollup.objects.aggregate(a=Sum("attempts"), f=Sum("failures")) == {
        "a": tasks_before["a"] - 3,
        "f": tasks_before["f"] - 3,
    }


# --- settled hours kept between renders (executions.rollup.rollup_series_settled) ----------------


def _history(user, *, hours_ago: float, runs: int, runner: str = "noop") -> RunRollup:
    """Rollup rows of ``user``'s personal team as the trigger left them for runs that ended
    ``hours_ago`` (a settled hour)."""
    minute = floor_minute(timezone.now() - timedelta(hours=hours_ago))
    return RunRollup.objects.create(
        minute=minute,
        team_id=personal_team_of(user).pk,
        runner=runner,
        shard=0,
        succeeded=runs,
        lateness_03=runs,
        duration_05=runs,
    )


def _figures(snap) -> tuple:
    return snap.by_minute, snap.duration_by_runner, snap.runs_last_hour, snap.success_rate


def _uncached(user, snap):
    """The same snapshot read whole from the database (a ``now`` given bypasses the cache)."""
    return dashboard_snapshot(user=user, now=snap.now)


def test_a_cached_render_after_new_runs_finish_equals_an_uncached_one(staff_user):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    for hours_ago, runs in ((3, 4), (10.5, 7), (22, 2)):
        _history(alice, hours_ago=hours_ago, runs=runs)
        _history(bob, hours_ago=hours_ago, runs=runs + 1, runner="http")
    first = {user: dashboard_snapshot(user=user) for user in (staff_user, alice, bob)}  # fills the cache
    assert sum(p.total for p in first[staff_user].runs_per_minute) == 13 + 16
    # New runs finish (the live tail) after the settled hours were kept.
    ledger = Ledger()
    task = TaskFactory(owner=alice, runner="sleep", misfire_grace=GRACE)
    ledger.succeed(ledger.start(task, late=0.2, ran_for=1.5))
    ledger.fail(ledger.start(task, late=3, ran_for=30))
    ledger.fail(ledger.start(task, ran_for=2), retry=True, claim=False)
    for user in (staff_user, alice, bob):
        cached = dashboard_snapshot(user=user)
        assert _figures(cached) == _figures(_uncached(user, cached))
    cached = dashboard_snapshot(user=alice)
    assert cached.runs_last_hour == {"SUCCEEDED": 1, "FAILED": 1, "CANCELLED": 0, "RETRIED": 1}
    assert sum(p.total for p in cached.runs_per_minute) == 13 + 3
    assert [d.runner for d in cached.duration_by_runner] == ["noop", "sleep"]
    assert dashboard_snapshot(user=bob).duration_by_runner == first[bob].duration_by_runner


def test_the_settled_hours_are_read_once_then_kept(staff_user):
    """The cache is used: a settled row changed behind the rollup's back (no process does that:
    this is only to see where the figure comes from) is not read again, whereas an uncached read
    sees it."""
    row = _history(staff_user, hours_ago=5, runs=3)
    assert dashboard_snapshot(user=staff_user).runs_last_hour["SUCCEEDED"] == 0
    RunRollup.objects.filter(pk=row.pk).update(succeeded=30)
    cached = dashboard_snapshot(user=staff_user)
    assert sum(p.counts["SUCCEEDED"] for p in cached.runs_per_minute) == 3
    assert sum(p.counts["SUCCEEDED"] for p in _uncached(staff_user, cached).runs_per_minute) == 30


def test_a_rebuild_is_seen_by_the_next_cached_render(staff_user):
    """A rebuild recounts settled minutes: the rollup's epoch moves in its transaction, so no
    render serves what was kept from before it."""
    _history(staff_user, hours_ago=3, runs=5)  # counted by no execution: a rebuild drops it
    ledger = Ledger()
    ledger.succeed(ledger.start(TaskFactory(owner=staff_user, misfire_grace=GRACE), ran_for=1))
    before = dashboard_snapshot(user=staff_user)
    assert sum(p.total for p in before.runs_per_minute) == 6
    rollup_rebuild(since=timezone.now() - timedelta(hours=4))
    after = dashboard_snapshot(user=staff_user)
    assert _figures(after) == _figures(_uncached(staff_user, after))
    assert sum(p.total for p in after.runs_per_minute) == 1


def test_a_prune_is_seen_by_the_next_cached_render(staff_user, settings):
    settings.TMS = {**settings.TMS, "ROLLUP_RETENTION": 2 * 3600.0}
    _history(staff_user, hours_ago=3, runs=5)  # inside the day's window, past the retention
    _history(staff_user, hours_ago=1.5, runs=2)
    assert sum(p.total for p in dashboard_snapshot(user=staff_user).runs_per_minute) == 7
    assert rollup_prune() == (1, 0)
    after = dashboard_snapshot(user=staff_user)
    assert _figures(after) == _figures(_uncached(staff_user, after))
    assert sum(p.total for p in after.runs_per_minute) == 2
