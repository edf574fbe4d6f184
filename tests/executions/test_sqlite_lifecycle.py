"""The embedded SQLite default (``make run`` without DATABASE_URL) runs the same transitions: the
lifecycle, the start rules and the events, through the package's non-PostgreSQL path (UPDATE …
RETURNING, then the events in the same transaction). A fresh SQLite file, in a subprocess: the
suite itself runs on PostgreSQL."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.embedded import run_on_embedded_sqlite

SCRIPT = textwrap.dedent(
    """
    from datetime import timedelta
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from executions import transitions
    from executions.models import Execution, ExecutionEvent, SkippedOccurrence
    from tasks_app.models import Task

    user = get_user_model().objects.create_user("solo")
    now = timezone.now()

    def task(**fields):
        return Task.objects.create(
            owner=user, team=user.personal_team, name=f"t{Task.objects.count()}", runner="noop", start_at=now, **fields
        )

    def status(pk):
        return Execution.objects.get(pk=pk).status

    def events(pk):
        return [(e.from_status, e.to_status, e.attempt) for e in ExecutionEvent.objects.filter(execution_id=pk)]

    def new(t, ago):
        (pk,) = transitions.executions_create(rows=[transitions.NewExecution(t.pk, now - ago, 5)], actor="t")
        return pk

    def claim(pk, attempt=1, worker="w"):
        return transitions.execution_claim_loaded(execution_id=pk, attempt=attempt, worker_id=worker, lease_seconds=60)

    plain = task()
    # Create (twice: once only), take due, claim, succeed.
    row = transitions.NewExecution(plain.pk, now - timedelta(seconds=0.5), 5)
    (ok,) = transitions.executions_create(rows=[row], actor="t")
    assert transitions.executions_create(rows=[row, row], actor="t") == []
    assert [d.execution_id for d in transitions.executions_take_due(limit=10, actor="m")] == [ok]
    claimed = claim(ok)
    assert claimed is not None and claimed.task.pk == plain.pk
    assert claim(ok, worker="w2") is None
    assert transitions.execution_succeed(execution_id=ok, attempt=1, worker_id="w", output="o", max_chars=10)
    assert not transitions.execution_succeed(execution_id=ok, attempt=1, worker_id="w", output="o", max_chars=10)
    print("ok", status(ok), events(ok))

    # Fail with a retry, then for good; the event's attempt is the new one.
    bad = new(plain, timedelta(seconds=0.4))
    transitions.executions_take_due(limit=10, actor="m")
    assert claim(bad)
    assert transitions.execution_fail(execution_id=bad, attempt=1, worker_id="w", error="e", output="",
                                      retry_in=0, max_chars=10) == "SCHEDULED"
    transitions.executions_take_due(limit=10, actor="m")
    assert claim(bad, attempt=2)
    assert transitions.execution_fail(execution_id=bad, attempt=2, worker_id="w", error="e", output="",
                                      retry_in=None, max_chars=10) == "FAILED"
    print("bad", status(bad), events(bad))

    # Retry by request and trigger: new rows with their events; cancel one, untake the other.
    again = transitions.execution_retry(execution_id=bad, actor="u")
    assert transitions.execution_retry(execution_id=bad, actor="u") is None
    assert transitions.execution_cancel(execution_id=again, actor="u").won
    assert not transitions.execution_cancel(execution_id=again, actor="u").won
    now_run = transitions.execution_trigger(task_id=plain.pk, actor="u")
    taken = transitions.executions_take_due(limit=10, actor="m")
    assert transitions.executions_untake(dispatches=taken, actor="m", reason="broker down") == 1
    print("again", status(again), events(again))
    print("trigger", status(now_run), events(now_run))
    transitions.execution_cancel(execution_id=now_run, actor="u")

    # A handed-back lease, resumed by another worker.
    lease = new(plain, timedelta(seconds=0.3))
    transitions.executions_take_due(limit=10, actor="m")
    assert claim(lease, worker="dead")
    Execution.objects.filter(pk=lease).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    assert [d.execution_id for d in transitions.executions_take_polls(limit=10, in_flight_for=30, actor="m")] == [lease]
    assert transitions.execution_acquire(execution_id=lease, attempt=1, worker_id="w", lease_seconds=60)
    assert transitions.execution_extend_lease(execution_id=lease, attempt=1, worker_id="w", lease_seconds=60)
    assert not transitions.execution_extend_lease(execution_id=lease, attempt=1, worker_id="dead", lease_seconds=60)
    print("lease", status(lease), [e.actor for e in ExecutionEvent.objects.filter(execution_id=lease)][-2:])

    # Overlap queue_one and max_concurrency: a run that may not start yet waits.
    for fields in ({"overlap_policy": "queue_one"}, {"max_concurrency": 1}):
        t = task(**fields)
        first, second = transitions.executions_create(rows=[
            transitions.NewExecution(t.pk, now - timedelta(seconds=0.2), 5, exclusive=True),
            transitions.NewExecution(t.pk, now - timedelta(seconds=0.1), 5, exclusive=True),
        ], actor="t")
        transitions.executions_take_due(limit=10, actor="m")
        assert claim(first) is None  # exclusive: not on the fast path
        one = transitions.execution_claim_exclusive(execution_id=first, attempt=1, worker_id="w", lease_seconds=60)
        two = transitions.execution_claim_exclusive(execution_id=second, attempt=1, worker_id="w", lease_seconds=60)
        waiting = repr(Execution.objects.get(pk=second).waiting)
        print("wait:" + next(iter(fields)), one.outcome, two.outcome, status(second), waiting)

    # Misfire skip: an hour late, dropped where it is taken, recorded as a skipped occurrence.
    late = task(misfire_policy="skip", misfire_grace=timedelta(seconds=1))
    stale = new(late, timedelta(hours=1))
    assert stale not in [d.execution_id for d in transitions.executions_take_due(limit=10, actor="m")]
    print("misfire", status(stale), list(SkippedOccurrence.objects.values_list("reason", flat=True)), events(stale))
    print("times", all(e.at is not None for e in ExecutionEvent.objects.all()))

    # The monitor's fair pick (the portable form): the team is copied onto every row, and two
    # teams' due runs alternate however far behind one of them is.
    from executions import fairness
    other = get_user_model().objects.create_user("other")
    herd = Task.objects.create(owner=user, team=user.personal_team, name="herd", runner="noop", start_at=now)
    few = Task.objects.create(owner=other, team=other.personal_team, name="few", runner="noop", start_at=now)
    Execution.objects.filter(status="SCHEDULED").update(status="CANCELLED")
    mine = [new(herd, timedelta(seconds=30 - i)) for i in range(4)]
    theirs = [new(few, timedelta(seconds=5 - i)) for i in range(2)]
    teams = dict(Execution.objects.filter(pk__in=mine + theirs).values_list("pk", "team_id"))
    print(
        "owner",
        {teams[pk] for pk in mine} == {user.personal_team.pk},
        {teams[pk] for pk in theirs} == {other.personal_team.pk},
    )
    print("fair", "".join("A" if pk in mine else "B" for pk in fairness.pick_fair(limit=5)))

    # The monitor's outlook (its idle pass): the next due run's wait, and what is in flight.
    Execution.objects.exclude(status__in=["SUCCEEDED", "FAILED", "CANCELLED"]).update(status="CANCELLED")
    idle = transitions.dispatch_outlook()
    ahead = new(plain, -timedelta(seconds=40))
    later = transitions.dispatch_outlook()
    Execution.objects.filter(pk=ahead).update(status="PENDING")
    pending = transitions.dispatch_outlook()
    print("outlook", idle, 38 < later.runs_in <= 40, later.idle, pending.pending, pending.idle)

    # Workflows on the portable path: a diamond (b and c after a, d after both); each end creates
    # the steps it completes, once, named by its upstream(s), with the upstream's output as input.
    from tasks_api.services import task_create
    Execution.objects.exclude(status__in=["SUCCEEDED", "FAILED", "CANCELLED"]).update(status="CANCELLED")
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b", after=[{"task": str(a.pk)}])
    c = task_create(owner=user, runner="noop", name="c", after=[{"task": str(a.pk)}])
    d = task_create(owner=user, runner="noop", name="d", after=[{"task": str(b.pk)}, {"task": str(c.pk)}])

    def finish(pk, output):
        transitions.executions_take_due(limit=10, actor="m")
        assert claim(pk)
        assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output=output, max_chars=99)
        assert not transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output=output,
                                                 max_chars=99)

    def steps(t):
        return list(Execution.objects.filter(task=t).values_list("pk", "workflow_run", "upstream", "input"))

    root = transitions.execution_trigger(task_id=a.pk, actor="u")
    finish(root, '{"rows": 3}')
    (b_run,), (c_run,) = steps(b), steps(c)
    finish(b_run[0], "b done")
    assert steps(d) == []  # d waits for c
    finish(c_run[0], "c done")
    (d_run,) = steps(d)
    joined = d_run[1:3] == (root, sorted([b_run[0], c_run[0]]))
    inputs = sorted(d_run[3].values(), key=str) == [{"output": "b done"}, {"output": "c done"}]
    print("flow", b_run[1:] == (root, [root], {"rows": 3}), c_run[1] == root, joined, inputs)
    """
)


def test_the_embedded_sqlite_default_runs_the_same_lifecycle(tmp_path: Path):
    stdout = run_on_embedded_sqlite(tmp_path, SCRIPT)
    lines = dict(line.split(" ", 1) for line in stdout.strip().splitlines())
    S, P, R = "SCHEDULED", "PENDING", "RUNNING"
    assert lines["ok"] == f"SUCCEEDED [('', '{S}', 1), ('{S}', '{P}', 1), ('{P}', '{R}', 1), ('{R}', 'SUCCEEDED', 1)]"
    assert lines["bad"] == (
        f"FAILED [('', '{S}', 1), ('{S}', '{P}', 1), ('{P}', '{R}', 1), ('{R}', '{S}', 2),"
        f" ('{S}', '{P}', 2), ('{P}', '{R}', 2), ('{R}', 'FAILED', 2)]"
    )
    assert lines["again"] == f"CANCELLED [('', '{S}', 3), ('{S}', 'CANCELLED', 3)]"
    assert lines["trigger"] == f"{S} [('', '{S}', 1), ('{S}', '{P}', 1), ('{P}', '{S}', 1)]"
    assert lines["lease"] == f"{R} ['m', 'w']"  # handed back by the monitor, resumed by w
    assert lines["wait:overlap_policy"] == f"claimed queued {S} ''"
    assert lines["wait:max_concurrency"] == f"claimed waiting {S} 'max_concurrency 1'"
    assert lines["misfire"] == f"CANCELLED ['missed'] [('', '{S}', 1), ('{S}', 'CANCELLED', 1)]"
    assert lines["outlook"] == "Outlook(runs_in=None, pending=False, polls=False) True True True False"
    assert lines["times"] == "True"
    assert lines["owner"] == "True True"
    assert lines["fair"] == "ABABA"
    assert lines["flow"] == "True True True True"
