"""Fair share between teams (executions.fairness): the selection order, the pacing of the
monitor, the team weight setting, and on the running system a herd that does not starve
another team's runs. Each user works in their personal team unless a test makes a shared one, so
"an owner" below is a personal team."""

from __future__ import annotations

import dataclasses
import itertools
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from executions import fairness, transitions
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from tasks_api.creation import task_bulk_create
from tasks_app.models import Membership, TeamQuota, TeamRole
from tasks_app.quotas import owner_limits, owner_quota_set, team_limits, team_quota_set
from tasks_app.teams.services import personal_team_of, team_create
from tests.executions.test_monitor import FlakyPublisher
from tests.factories import ExecutionFactory, TaskFactory, UserFactory
from tests.processes import running, start_monitor, start_worker, wait_worker_ready
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput


def _due(owner, count: int, *, priority: int = 5, late: float = 60.0, team=None) -> list[int]:
    """``count`` due SCHEDULED executions of one task of ``owner`` (in ``team``, by default the
    owner's personal team), oldest first."""
    team = team if team is not None else personal_team_of(owner)
    task = TaskFactory(owner=owner, team=team, misfire_grace=timedelta(hours=1), priority=priority)
    now = timezone.now()
    return [
        ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=late - index / 10)).pk
        for index in range(count)
    ]


def _owners_of(ids: list[int], a: list[int]) -> str:
    return "".join("A" if execution_id in a else "B" for execution_id in ids)


# --- the selection -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_equal_weights_alternate_owners_whatever_the_due_order():
    herd_owner, other = UserFactory(), UserFactory()
    a = _due(herd_owner, 8, late=120)  # all due before any of B's
    b = _due(other, 3, late=30)
    picked = fairness.pick_fair(limit=8)
    assert _owners_of(picked, a) == "ABABABAA"
    # Within an owner, due order.
    assert [i for i in picked if i in a] == a[:5] and [i for i in picked if i in b] == b


@pytest.mark.django_db
def test_weights_three_to_one_give_three_runs_for_one():
    heavy, light = UserFactory(), UserFactory()
    owner_quota_set(owner=heavy, fair_weight=3)
    a = _due(heavy, 12)
    _due(light, 12)
    assert _owners_of(fairness.pick_fair(limit=12), a) == "AAABAAABAAAB"
    # The default weight is a setting: with a default of 3 the other owner weighs as much.
    assert _owners_of(fairness.pick_fair(limit=6, default_weight=3), a) == "ABABAB"


@pytest.mark.django_db
def test_priority_orders_an_owners_runs_and_does_not_take_turns_from_other_owners():
    owner, other = UserFactory(), UserFactory()
    low = _due(owner, 3, priority=1, late=120)
    high = _due(owner, 2, priority=9, late=10)  # due later, but higher priority
    b = _due(other, 3, priority=5, late=60)
    picked = fairness.pick_fair(limit=8)
    # The owner's turns go to priority 9 first; a tie between owners goes to the higher priority.
    assert picked == [high[0], b[0], high[1], b[1], b[2], low[0], low[1], low[2]]


@pytest.mark.django_db
def test_only_due_scheduled_rows_are_picked():
    owner = UserFactory()
    due = _due(owner, 2)
    task = TaskFactory(owner=owner)
    ExecutionFactory(task=task, scheduled_for=timezone.now() + timedelta(hours=1))  # not due
    ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(seconds=5), status=S.PENDING)
    assert fairness.pick_fair(limit=10) == due
    assert fairness.pick_fair(limit=0) == []


def _fair_reference(*, limit: int, default_weight: int) -> list[int]:
    """The fair order computed in Python from every row: the definition ``pick_fair``'s index
    reads (only each team's first turns) must agree with."""
    now = db_now()
    weights = dict(TeamQuota.objects.filter(fair_weight__isnull=False).values_list("team_id", "fair_weight"))
    rows = Execution.objects.filter(status=S.SCHEDULED, due_at__lte=now).values_list(
        "id", "team_id", "priority", "due_at"
    )
    by_owner: dict[int, list[tuple[int, int, object]]] = {}
    for pk, owner_id, priority, due_at in rows:
        by_owner.setdefault(owner_id, []).append((pk, priority, due_at))
    keyed = []
    for owner_id, runs in by_owner.items():
        weight = weights.get(owner_id, default_weight)
        for turn, (pk, priority, due_at) in enumerate(sorted(runs, key=lambda r: (-r[1], r[2], r[0])), start=1):
            keyed.append(((turn / weight, -weight, -priority, due_at, pk), pk))
    return [pk for _, pk in sorted(keyed)[:limit]]


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(4))
def test_the_pick_agrees_with_the_order_computed_from_every_row(seed):
    # Owners with different weights and backlogs, every priority, rows due and not yet due, and
    # rows in other statuses: the index-driven pick reads a few rows per owner and level, and must
    # give exactly the order that numbering every due row gives.
    import random

    rng = random.Random(seed)
    owners = [UserFactory() for _ in range(5)]
    for owner in owners[:3]:
        owner_quota_set(owner=owner, fair_weight=rng.choice([1, 2, 3, 7]))
    now = timezone.now()
    for owner in owners:
        task = TaskFactory(owner=owner, misfire_grace=timedelta(hours=1))
        for index in range(rng.choice([0, 1, 4, 30, 80])):
            execution = ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=index + 1))
            Execution.objects.filter(pk=execution.pk).update(
                priority=rng.randint(0, 9),
                due_at=now + timedelta(seconds=rng.uniform(-300, 60)),
                status=rng.choice([S.SCHEDULED] * 4 + [S.PENDING, S.SUCCEEDED]),
            )
    for limit in (1, 7, 40, 500):
        for weight in (1, 2):
            assert fairness.pick_fair(limit=limit, default_weight=weight) == _fair_reference(
                limit=limit, default_weight=weight
            )


# --- teams share the workers, not users -----------------------------------------------------------


def _shared_team(*users, name: str):
    """A shared team of ``users`` (the first its admin, the others editors)."""
    team = team_create(creator=users[0], name=name)
    for user in users[1:]:
        Membership.objects.create(team=team, user=user, role=TeamRole.EDITOR)
    return team


def _herd(owner, team, count: int) -> list[int]:
    """``count`` runs of one task of ``owner`` in ``team``, due a minute ago (one INSERT)."""
    task = TaskFactory(owner=owner, team=team, misfire_grace=timedelta(hours=1))
    start = timezone.now() - timedelta(seconds=60)
    return transitions.executions_create(
        rows=[
            transitions.NewExecution(task.pk, start + timedelta(milliseconds=index), task.priority)
            for index in range(count)
        ],
        actor="test",
    )


@pytest.mark.django_db
def test_another_team_s_single_run_goes_out_in_the_first_pick_beside_a_herd_of_2000():
    ann, ben = UserFactory(), UserFactory()
    herd_team = _shared_team(ann, name="Herd")
    herd = _herd(ann, herd_team, 2_000)
    (single,) = _due(ben, 1, late=1)  # due after every run of the herd
    assert Execution.objects.filter(status=S.SCHEDULED).count() == 2_001
    # The monitor's first look after an idle spell: its floor of messages, fairly.
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=4, DISPATCH_BATCH=1)
    publisher = FlakyPublisher()
    monitor = Monitor(conf=conf, batch=100, publish=publisher)
    sent, _ = monitor.dispatch_once(housekeeping=False)
    assert sent == 4 and publisher.ids == [herd[0], single, herd[1], herd[2]]
    assert Execution.objects.get(pk=single).status == S.PENDING


@pytest.mark.django_db
def test_the_pick_of_a_herd_reads_the_team_index_a_few_rows_per_level():
    ann, ben = UserFactory(), UserFactory()
    _herd(ann, _shared_team(ann, name="Herd"), 2_000)
    _due(ben, 3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE executions_execution")
        sql = fairness._FAIR_SQL.format(
            execution="executions_execution", quota="tasks_app_teamquota", due_by="statement_timestamp()"
        )
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, {"limit": 8, "weight": 1})
        ((plan,),) = cursor.fetchone()

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [node for node in nodes(plan["Plan"]) if node.get("Relation Name") == "executions_execution"]
    # "Is anything due at all" stops at its first row, whichever way the planner reads it (here
    # every row is due); every other read is of the team index.
    probe = [node for node in scans if node.get("Subplan Name", "").startswith("InitPlan")]
    assert all(node["Actual Rows"] <= 1 for node in probe), probe
    levels = [node for node in scans if node not in probe]
    # The levels come from the team index. Each level's runs are read by an index too: the team
    # index alone, but in a full suite's run (not alone) the planner has read them by the due index
    # (noted in docs/when-a-run-may-start.md), so which one is not asserted.
    names = {node.get("Index Name") for node in levels}
    assert levels and "execution_team_fair_idx" in names, levels
    assert names <= {"execution_team_fair_idx", "execution_due_idx"}, levels
    # Each level's runs: at most the pick's limit read, not the herd.
    assert max(node["Actual Rows"] for node in levels) <= 8


@pytest.mark.django_db
def test_team_weights_three_to_one_give_three_to_one_shares():
    ann, ben, cat, dan = (UserFactory() for _ in range(4))
    heavy, light = _shared_team(ann, ben, name="Heavy"), _shared_team(cat, dan, name="Light")
    team_quota_set(team=heavy, fair_weight=3)
    a = _due(ann, 30, team=heavy) + _due(ben, 30, team=heavy)
    _due(cat, 30, team=light)
    _due(dan, 30, team=light)
    picked = fairness.pick_fair(limit=40)
    assert sum(1 for pk in picked if pk in a) == 30  # 30 : 10
    assert _owners_of(picked[:8], a) == "AAABAAAB"
    # A user's own weight (their personal team's) does not weigh in the shared team.
    owner_quota_set(owner=cat, fair_weight=1000)
    assert sum(1 for pk in fairness.pick_fair(limit=40) if pk in a) == 30


@pytest.mark.django_db
def test_two_users_of_one_team_share_one_share():
    ann, ben, cat = UserFactory(), UserFactory(), UserFactory()
    team = _shared_team(ann, ben, name="Together")
    together = _due(ann, 10, team=team, late=120) + _due(ben, 10, team=team, late=119)
    alone = _due(cat, 10, late=60)
    picked = fairness.pick_fair(limit=12)
    # Six each: the team's two users alternate with cat, they do not get a turn each.
    assert sum(1 for pk in picked if pk in together) == 6 and sum(1 for pk in picked if pk in alone) == 6
    assert _owners_of(picked, together) == "ABABABABABAB"
    # Within the team, one order: priority, then due time, whoever created the run.
    assert [pk for pk in picked if pk in together] == together[:6]


# --- pacing in the monitor -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paced_monitor_publishes_up_to_the_floor_fairly_and_tops_up_as_runs_start():
    herd_owner, other = UserFactory(), UserFactory()
    a = _due(herd_owner, 30, late=120)
    _due(other, 2, late=10)
    # A queue of a hundredth of a second: the floor decides, however fast the test's "starts" look.
    # A message per run, so the first look's herd start is the floor too (6 messages of 1 run).
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.01, MONITOR_MIN_PENDING=6, DISPATCH_BATCH=1)
    publisher = FlakyPublisher()
    monitor = Monitor(conf=conf, batch=100, publish=publisher)

    sent, next_due = monitor.dispatch_once(housekeeping=False)
    assert (sent, next_due) == (6, conf.MONITOR_TOPUP_INTERVAL)  # held back: top up soon
    assert _owners_of(publisher.ids, a) == "ABABAA"
    assert monitor.stats.held_back == 1
    # Nothing started: the next pass publishes nothing more.
    assert monitor.dispatch_once(housekeeping=False)[0] == 0
    # Four runs start (claimed by workers): four more are published, the herd's next ones.
    Execution.objects.filter(pk__in=publisher.ids[:4]).update(status=S.RUNNING)
    assert monitor.dispatch_once(housekeeping=False)[0] == 4
    assert publisher.ids[6:] == a[4:8]
    assert Execution.objects.filter(status=S.PENDING).count() == 6


@pytest.mark.django_db
def test_a_run_that_comes_due_during_a_paced_pass_goes_out_at_once_not_after_a_top_up(monkeypatch):
    """Issue 33: a run due between the pass's take and its look at the next due time (each
    statement has its own time) was counted as held back by the pacer, and waited a top-up
    interval (100 ms) with the queue empty: at a steady load, most runs did."""
    owner = UserFactory()
    first = _due(owner, 1, late=1)
    later = _due(owner, 1, late=-60)  # due in a minute: not due when the pass takes
    look = transitions.next_due_in

    def comes_due_meanwhile() -> float | None:
        Execution.objects.filter(pk__in=later).update(due_at=Now())
        return look()

    monkeypatch.setattr(transitions, "next_due_in", comes_due_meanwhile)
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=8, DISPATCH_BATCH=1)
    publisher = FlakyPublisher()
    monitor = Monitor(conf=conf, batch=100, publish=publisher)
    assert monitor.pacer is not None

    # Room for 8, one run due: nothing was held back, and the loop goes again at once (0 s).
    assert monitor.dispatch_once(housekeeping=False) == (1, 0.0)
    assert monitor.stats.held_back == 0
    monkeypatch.setattr(transitions, "next_due_in", look)
    assert monitor.dispatch_once(housekeeping=False) == (1, None)
    assert publisher.ids == first + later


@pytest.mark.django_db
def test_without_pacing_the_monitor_publishes_everything_due_in_due_order():
    a = _due(UserFactory(), 5, late=120)
    b = _due(UserFactory(), 2, late=10)
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.0)
    publisher = FlakyPublisher()
    monitor = Monitor(conf=conf, batch=100, publish=publisher)
    assert monitor.pacer is None
    assert monitor.dispatch_once(housekeeping=False) == (7, None)
    assert publisher.ids == a + b


@pytest.mark.django_db
def test_rows_pending_longer_than_the_republish_delay_are_not_counted_as_queued():
    task = TaskFactory()
    fresh = ExecutionFactory(task=task, scheduled_for=timezone.now(), status=S.PENDING, enqueued_at=timezone.now())
    ExecutionFactory(
        task=task,
        scheduled_for=timezone.now() - timedelta(seconds=1),
        status=S.PENDING,
        enqueued_at=timezone.now() - timedelta(hours=1),
    )
    assert fresh.pk
    assert fairness.published_unstarted(cap=100, older_than=120) == 1
    assert fairness.published_unstarted(cap=100, older_than=7200) == 2
    assert fairness.published_unstarted(cap=1, older_than=7200) == 1


def test_the_pacer_target_follows_the_start_rate(monkeypatch):
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=4, DISPATCH_BATCH=1)
    now = [0.0]
    pacer = fairness.Pacer(conf, clock=lambda: now[0])
    pending = iter([0, 0, 50, 50])
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: next(pending))
    monkeypatch.setattr(fairness, "steps_published", lambda: 0)
    assert pacer.room() == 4  # no history: the floor (a herd's start: 4 messages of 1 run)
    pacer.published(100)
    now[0] = 0.5
    # 100 published, none queued: 100 started in 0.5 s, 200/s; half a second of it is 100.
    assert pacer.room() == 100
    pacer.published(100)
    now[0] = 1.0
    # 100 more published, 50 queued: 150 started over the second, 75 wanted, 50 queued.
    assert (pacer.room(), pacer.target) == (25, 75)
    now[0] = 10.0
    # Nothing started for long: the history is gone, back to the floor.
    assert (pacer.room(), pacer.target) == (0, 4)


def test_the_pacer_counts_the_workflow_steps_workers_published_beside_it(monkeypatch):
    # Steps a worker publishes itself are queued and started beside the monitor's runs: unseen,
    # a queue that stays as deep while they flow looked like workers that started nothing, and
    # the pacer held a herd of roots back (1,000 workflow runs took 13 s instead of 3).
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=4, DISPATCH_BATCH=1)
    now = [0.0]
    pacer = fairness.Pacer(conf, clock=lambda: now[0])
    steps = iter([1_000, 1_200, 1_400])
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: 50)
    monkeypatch.setattr(fairness, "steps_published", lambda: next(steps))
    pacer.room()
    now[0] = 0.5
    pacer.room()  # 200 steps published, the queue as deep as before: 200 started in 0.5 s
    now[0] = 1.0
    # 400 started over the second, 400/s: half a second of it is 200, 50 queued.
    assert (pacer.room(), pacer.target) == (150, 200)


# --- the team weight -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("weight", [0, -1, 1001])
def test_a_weight_out_of_bounds_is_refused_on_the_field(weight):
    user = UserFactory()
    with pytest.raises(InvalidInput) as refused:
        owner_quota_set(owner=user, fair_weight=weight)
    assert set(refused.value.errors) == {"fair_weight"}
    assert not TeamQuota.objects.filter(team__personal_of=user).exists()


@pytest.mark.django_db
def test_the_weight_defaults_to_the_setting_and_can_be_set_back_to_it(settings):
    user = UserFactory()
    assert owner_limits(user).fair_weight == 1
    owner_quota_set(owner=user, fair_weight=4)
    assert owner_limits(user).fair_weight == 4
    owner_quota_set(owner=user, fair_weight=None)
    settings.TMS = {**settings.TMS, "FAIR_WEIGHT": 2}
    assert owner_limits(user).fair_weight == 2


@pytest.mark.django_db
def test_a_team_s_weight_is_set_on_the_team_and_the_user_form_sets_the_personal_team_s():
    ann = UserFactory()
    team = _shared_team(ann, name="Ops")
    team_quota_set(team=team, fair_weight=5)
    assert team_limits(team.pk).fair_weight == 5
    assert owner_limits(ann).fair_weight == 1  # her personal team's, not the shared team's
    owner_quota_set(owner=ann, fair_weight=2)
    assert TeamQuota.objects.get(team=personal_team_of(ann)).fair_weight == 2
    assert team_limits(team.pk).fair_weight == 5


# --- the running system --------------------------------------------------------------------------

HERD, FEW = 300, 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_herd_does_not_starve_another_owners_runs_on_the_running_system():
    """Owner A's 300 runs and owner B's 5, due at one instant, one worker process: B's runs all
    start before half of A's have (order from the event log), each run starts exactly once."""
    herd_owner, other = UserFactory(), UserFactory()
    worker = start_worker(concurrency=1)
    monitor = start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        due = db_now() + timedelta(seconds=3)
        task_bulk_create(
            owner=herd_owner, specs=[{"runner": "noop", "start_at": due, "name": f"herd {i}"} for i in range(HERD)]
        )
        task_bulk_create(
            owner=other, specs=[{"runner": "noop", "start_at": due, "name": f"few {i}"} for i in range(FEW)]
        )
        rows = Execution.objects.filter(task__owner__in=[herd_owner, other])
        assert rows.count() == HERD + FEW
        deadline = time.monotonic() + 300
        while rows.exclude(status=S.SUCCEEDED).exists():
            assert time.monotonic() < deadline, list(rows.values_list("status").distinct())
            time.sleep(0.5)
    owner_of = dict(rows.values_list("id", "task__owner_id"))
    starts = list(
        ExecutionEvent.objects.filter(execution_id__in=owner_of, to_status=S.RUNNING)
        .order_by("id")
        .values_list("execution_id", flat=True)
    )
    assert len(starts) == len(set(starts)) == HERD + FEW  # none lost, none started twice
    last_b = max(index for index, execution_id in enumerate(starts) if owner_of[execution_id] == other.pk)
    herd_before = sum(1 for execution_id in starts[:last_b] if owner_of[execution_id] == herd_owner.pk)
    assert herd_before < HERD / 2, (herd_before, last_b)


@pytest.mark.parametrize("batch", [1, 16])
def test_a_herd_after_an_idle_spell_is_not_paced_by_the_idle_history(monkeypatch, batch):
    """Idle looks (nothing queued or published) leave no history and offer MONITOR_MIN_PENDING
    full messages; a drained queue at least doubles the target: a herd reaches the workers' pace
    within a few top-ups, not seconds."""
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=8, DISPATCH_BATCH=batch)
    now = [0.0]
    pacer = fairness.Pacer(conf, clock=lambda: now[0])
    queued = [0]
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: queued[0])
    monkeypatch.setattr(fairness, "steps_published", lambda: 0)
    for second in range(5):  # the monitor's idle passes before the herd is due
        now[0] = float(second)
        assert pacer.room() == 8 * batch
    # The herd: each top-up (0.1 s apart) finds everything it published started.
    targets = []
    for _ in range(5):
        room = pacer.room()
        targets.append(pacer.target)
        pacer.published(room)
        now[0] += 0.1
    # Without the idle history the first measured rate is what went out in 0.1 s (8 runs: 80/s,
    # 40 wanted; 8 messages of 16: 1,280/s, 640 wanted); with it, a tenth of that rate.
    assert targets[:2] == [8 * batch, 40 * batch]
    assert all(later >= 2 * earlier for earlier, later in itertools.pairwise(targets))
    # A queue that is not drained is paced by the measured rate alone: about half a second's worth.
    queued[0] = 100
    pacer.room()
    assert pacer.target < 2 * targets[-1]


def test_a_look_that_finds_runs_queued_is_not_offered_a_herds_start(monkeypatch):
    """The herd's start (MONITOR_MIN_PENDING full messages) is for an empty queue only: runs
    published by another monitor keep the floor, whatever this monitor's own history."""
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=8, DISPATCH_BATCH=16)
    pacer = fairness.Pacer(conf, clock=lambda: 0.0)
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: 0)
    monkeypatch.setattr(fairness, "steps_published", lambda: 0)
    assert pacer.room() == 128
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: 5)
    assert pacer.room() == 3 and pacer.target == 8
