"""Workflows (issue 31, dependencies): a run of a task that follows another (``after``) is created
by the transaction that records its upstream's end, exactly once, with its upstream and input.

These drive the transitions directly (no monitor, no worker): what the end's own transaction
wrote is all there is. The same on the running system: tests/executions/test_workflows_e2e.py.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.db import connection, connections, transaction

from executions import transitions
from executions.models import Execution, ExecutionEvent, ExecutionOrigin, WorkflowRunControl, WorkflowRunHold
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.lifecycle import task_pause

pytestmark = pytest.mark.django_db


def _after(*entries: tuple[object, str]) -> list[dict[str, object]]:
    return [{"task": str(task.pk), "on": on} for task, on in entries]  # type: ignore[attr-defined]


def _run(execution_id: int, worker: str = "w1") -> Execution:
    """Take and claim an execution as the monitor and a worker would."""
    Execution.objects.filter(pk=execution_id).update(status=S.PENDING)
    claimed = transitions.execution_claim_loaded(
        execution_id=execution_id, attempt=1, worker_id=worker, lease_seconds=60, checked=True
    )
    assert claimed is not None
    return claimed


def _succeed(execution_id: int, output: str = "", worker: str = "w1") -> bool:
    return transitions.execution_succeed(
        execution_id=execution_id, attempt=1, worker_id=worker, output=output, max_chars=10_000
    )


def _fail(execution_id: int, error: str = "boom", worker: str = "w1") -> str | None:
    return transitions.execution_fail(
        execution_id=execution_id, attempt=1, worker_id=worker, error=error, output="", retry_in=None, max_chars=10_000
    )


def _steps(task) -> list[Execution]:
    return list(Execution.objects.filter(task=task, origin=ExecutionOrigin.WORKFLOW).order_by("id"))


def test_a_task_with_after_and_no_schedule_does_not_run_on_its_own(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    assert b.status == "ACTIVE" and b.next_run_at is None and b.has_after
    assert not Execution.objects.filter(task=b).exists()


def test_the_follower_s_run_is_created_in_the_transaction_that_records_the_end(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    with transaction.atomic():
        assert _succeed(root, output=json.dumps({"rows": 3}))
        # Still inside the end's transaction: the step is there, SCHEDULED and due now.
        (step,) = _steps(b)
        assert step.status == S.SCHEDULED and step.due_at <= step.created_at
    step.refresh_from_db()
    assert step.workflow_run == root and step.upstream == [root] and step.input == {"rows": 3}
    assert Execution.objects.get(pk=root).workflow_run == root
    (event,) = ExecutionEvent.objects.filter(execution=step)
    assert event.actor == transitions.WORKFLOW_ACTOR and str(root) in event.detail


def test_an_end_recorded_twice_creates_the_follower_once(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root)
    assert not _succeed(root)  # a redelivered message: the write loses, nothing more is created
    assert len(_steps(b)) == 1


def test_failure_and_success_paths(user):
    a = task_create(owner=user, runner="noop")
    on_success = task_create(owner=user, runner="noop", after=_after((a, "success")))
    on_failure = task_create(owner=user, runner="noop", after=_after((a, "failure")))
    on_either = task_create(owner=user, runner="noop", after=_after((a, "completion")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _fail(root, error="disk full") == S.FAILED
    assert _steps(on_success) == []
    (handler,) = _steps(on_failure)
    assert handler.input == {"output": "", "error": "disk full"}
    assert len(_steps(on_either)) == 1


def test_a_diamond_runs_d_once_after_both_with_both_upstreams(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    c = task_create(owner=user, runner="noop", after=_after((a, "success")))
    d = task_create(owner=user, runner="noop", after=_after((b, "success"), (c, "success")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root, output="plain text")
    (step_b,), (step_c,) = _steps(b), _steps(c)
    assert step_b.input == {"output": "plain text"}
    _run(step_b.pk)
    assert _succeed(step_b.pk, output='{"from": "b"}')
    assert _steps(d) == []  # c has not ended yet
    _run(step_c.pk)
    assert _succeed(step_c.pk, output='{"from": "c"}')
    (step_d,) = _steps(d)
    assert step_d.workflow_run == root and sorted(step_d.upstream or []) == sorted([step_b.pk, step_c.pk])
    assert step_d.input == {str(b.pk): {"from": "b"}, str(c.pk): {"from": "c"}}


@pytest.mark.django_db(transaction=True)
def test_a_fan_in_whose_upstreams_end_at_once_runs_once(user):
    """Two upstreams' ends in concurrent transactions: the later one (after the fan-in's lock)
    sees the earlier one's end, so the follower is created exactly once, never zero times."""
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    c = task_create(owner=user, runner="noop", after=_after((a, "success")))
    d = task_create(owner=user, runner="noop", after=_after((b, "success"), (c, "success")))
    for attempt in range(5):
        root = transitions.execution_trigger(task_id=a.pk, actor="test")
        assert root is not None
        _run(root)
        assert _succeed(root)
        step_b = Execution.objects.get(task=b, workflow_run=root).pk
        step_c = Execution.objects.get(task=c, workflow_run=root).pk
        _run(step_b, worker=f"wb{attempt}")
        _run(step_c, worker=f"wc{attempt}")
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def end(execution_id: int, worker: str, barrier=barrier, errors=errors) -> None:
            try:
                barrier.wait()
                assert _succeed(execution_id, worker=worker)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=end, args=(step_b, f"wb{attempt}")),
            threading.Thread(target=end, args=(step_c, f"wc{attempt}")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert Execution.objects.filter(task=d, workflow_run=root).count() == 1


def test_a_paused_follower_does_not_run(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    task_pause(task=b, actor="test")
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root)
    assert _steps(b) == []


def test_a_long_or_non_object_output_is_given_as_text():
    ended = transitions.follow.Ended(1, uuid.uuid4(), S.SUCCEEDED, None, "[1, 2]", "")
    assert transitions.input_from(ended) == {"output": "[1, 2]"}
    big = json.dumps({"x": "y" * transitions.INPUT_MAX_CHARS})
    cut = transitions.input_from(transitions.follow.Ended(1, uuid.uuid4(), S.SUCCEEDED, None, big, ""))
    assert set(cut) == {"output"} and len(cut["output"]) == transitions.INPUT_MAX_CHARS


def test_an_on_failure_step_is_given_the_error_when_the_failed_output_was_json(user):
    """Issue 44, item 10: the error was left out when the failed run's output was a JSON object."""
    failed = transitions.follow.Ended(1, uuid.uuid4(), S.FAILED, None, '{"rows": 0, "error": "own"}', "disk full")
    assert transitions.input_from(failed) == {"rows": 0, "error": "disk full"}
    succeeded = transitions.follow.Ended(1, uuid.uuid4(), S.SUCCEEDED, None, '{"rows": 3}', "")
    assert transitions.input_from(succeeded) == {"rows": 3}
    a = task_create(owner=user, runner="noop")
    handler_task = task_create(owner=user, runner="noop", after=_after((a, "failure")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert transitions.execution_fail(
        execution_id=root, attempt=1, worker_id="w1", error="exit 3", output='{"rows": 0}', retry_in=None,
        max_chars=10_000,
    ) == S.FAILED  # fmt: skip
    (handler,) = _steps(handler_task)
    assert handler.input == {"rows": 0, "error": "exit 3"}


def test_the_batch_success_of_a_followed_run_creates_its_follower(user):
    a = task_create(owner=user, runner="noop")
    lone = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    followed, alone = Execution.objects.get(task=a).pk, Execution.objects.get(task=lone).pk
    _run(followed)
    _run(alone)
    won = transitions.executions_succeed(
        successes=[transitions.Success(followed, 1, "{}"), transitions.Success(alone, 1, "")],
        worker_id="w1",
        max_chars=1000,
    )
    assert won == {followed, alone}
    assert len(_steps(b)) == 1
    assert Execution.objects.get(pk=alone).workflow_run is None


def test_a_batch_of_followed_runs_ends_in_one_statement_and_creates_each_follower_once(user):
    """A worker's chunk of workflow steps (several followed runs) is ended by one statement in one
    transaction that creates their followers; a row whose write loses (its attempt moved on)
    creates nothing."""
    from django.test.utils import CaptureQueriesContext

    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    first = Execution.objects.get(task=a).pk
    second = transitions.execution_trigger(task_id=a.pk, actor="u")
    third = transitions.execution_trigger(task_id=a.pk, actor="u")
    for pk in (first, second, third):
        _run(pk)
    with CaptureQueriesContext(connection) as queries:
        won = transitions.executions_succeed(
            successes=[
                transitions.Success(first, 1, '{"n": 1}'),
                transitions.Success(second, 1, json.dumps({"n": 2, "s": 'say "hi", \\ é {} ,'})),
                transitions.Success(third, 2, "stale attempt"),
            ],
            worker_id="w1",
            max_chars=1000,
        )
    assert won == {first, second}
    # The ends alone, then those followed, then their followers (two runs of one task) together.
    assert sum("unnest(" in query["sql"] for query in queries.captured_queries) == 3
    steps = _steps(b)
    assert sorted((step.workflow_run, step.upstream, step.input) for step in steps) == [
        (first, [first], {"n": 1}),
        (second, [second], {"n": 2, "s": 'say "hi", \\ é {} ,'}),
    ]
    assert len({step.scheduled_for for step in steps}) == 2  # an occurrence is unique by its time
    assert sorted(
        ExecutionEvent.objects.filter(execution__in=steps, to_status=S.SCHEDULED).values_list("actor", "detail")
    ) == sorted(  # as text: execution 10 sorts before 9
        [
            ("workflow", f"after execution {first} (workflow run {first})"),
            ("workflow", f"after execution {second} (workflow run {second})"),
        ]
    )
    assert Execution.objects.get(pk=third).status == S.RUNNING
    # Recorded again (a redelivered message): nothing more.
    assert (
        transitions.executions_succeed(successes=[transitions.Success(first, 1, "{}")], worker_id="w1", max_chars=1000)
        == set()
    )
    assert len(_steps(b)) == 2


def test_after_can_be_changed(user):
    a = task_create(owner=user, runner="noop")
    c = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    b = task_update(task=b, actor="test", changes={"after": _after((c, "failure"))})
    assert b.has_after
    root = Execution.objects.get(task=c).pk
    _run(root)
    assert _fail(root) == S.FAILED
    assert len(_steps(b)) == 1
    b = task_update(task=b, actor="test", changes={"after": []})
    assert not b.has_after


def test_a_retried_step_runs_what_follows_it_and_nothing_before(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    c = task_create(owner=user, runner="noop", after=_after((b, "success")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root, output='{"batch": 7}')
    (step_b,) = _steps(b)
    _run(step_b.pk)
    assert _fail(step_b.pk) == S.FAILED
    assert _steps(c) == []
    retry = transitions.execution_retry(execution_id=step_b.pk, actor="test")
    assert retry is not None
    again = Execution.objects.get(pk=retry)
    assert (again.workflow_run, again.upstream, again.input) == (root, [root], {"batch": 7})
    Execution.objects.filter(pk=retry).update(status=S.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=retry, attempt=again.attempt, worker_id="w1", lease_seconds=60, checked=True
    )
    assert transitions.execution_succeed(
        execution_id=retry, attempt=again.attempt, worker_id="w1", output="", max_chars=100
    )
    (step_c,) = _steps(c)
    assert step_c.upstream == [retry] and step_c.workflow_run == root
    assert Execution.objects.filter(task=a).count() == 1, "the step that succeeded is not run again"


def test_cancelling_a_workflow_run_cancels_its_pending_steps_and_nothing_follows(user, api_client):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    c = task_create(owner=user, runner="noop", after=_after((a, "success")))
    d = task_create(owner=user, runner="noop", after=_after((b, "completion")))
    unrelated = task_create(owner=user, runner="noop")
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root)
    (step_b,), (step_c,) = _steps(b), _steps(c)
    _run(step_c.pk)  # one step running, one still scheduled
    response = api_client.post(f"/api/v1/executions/{root}/cancel-workflow")
    assert response.status_code == 200, response.json()
    assert response.json()["workflow_run"] == root
    assert sorted(report["execution"] for report in response.json()["executions"]) == sorted([step_b.pk, step_c.pk])
    assert set(Execution.objects.filter(pk__in=[step_b.pk, step_c.pk]).values_list("status", flat=True)) == {
        S.CANCELLED
    }
    assert _steps(d) == [], "a cancelled step starts nothing, not even on completion"
    assert Execution.objects.get(task=unrelated).status == S.SCHEDULED
    assert Execution.objects.get(pk=root).status == S.SUCCEEDED
    # Its hold says cancelled, as the workflow run's own cancel sets it: a step that ended while
    # the steps were being cancelled would have started nothing either.
    assert WorkflowRunControl.objects.get(workflow_run=root).hold == WorkflowRunHold.CANCELLED
    assert api_client.post(f"/api/v1/workflow-runs/{root}/resume").status_code == 409
    # Nothing left to cancel: 200 with none.
    again = api_client.post(f"/api/v1/executions/{step_b.pk}/cancel-workflow")
    assert again.status_code == 200 and again.json()["executions"] == []


def test_a_step_goes_through_its_task_s_start_rules(user):
    """A step is created like any run: a follower with max_concurrency or an overlap policy gets an
    exclusive run, which the worker claims through the checked claim (policies and limits)."""
    a = task_create(owner=user, runner="noop")
    capped = task_create(owner=user, runner="noop", max_concurrency=1, after=_after((a, "success")))
    free = task_create(owner=user, runner="noop", after=_after((a, "success")))
    root = Execution.objects.get(task=a).pk
    _run(root)
    assert _succeed(root)
    (step_capped,), (step_free,) = _steps(capped), _steps(free)
    assert step_capped.exclusive and not step_free.exclusive
    assert step_capped.status == step_free.status == S.SCHEDULED


# --- steps published by the worker that ended their upstream --------------------------------------


def _published_steps(user, *, upstreams: int = 1, team=None):
    """End ``upstreams`` runs of a followed task (of ``user``, in ``team``: by default their
    personal team) inside ``publishing_steps``; return the steps created and what the publisher
    was handed (after the end's commit)."""
    a = task_create(owner=user, runner="noop", team=team)
    b = task_create(owner=user, runner="noop", after=_after((a, "success")), team=team)
    roots = [Execution.objects.get(task=a).pk]
    roots += [transitions.execution_trigger(task_id=a.pk, actor="u") for _ in range(upstreams - 1)]
    for pk in roots:
        _run(pk)
    handed: list[list[transitions.Dispatch]] = []
    return a, b, roots, handed


def test_a_worker_publishes_the_steps_its_ends_create_once_committed(user, django_capture_on_commit_callbacks):
    _, b, roots, handed = _published_steps(user, upstreams=3)
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        won = transitions.executions_succeed(
            successes=[transitions.Success(pk, 1, "{}") for pk in roots], worker_id="w1", max_chars=1000
        )
        assert won == set(roots) and handed == []  # nothing is published before the commit
    steps = _steps(b)
    (published,) = handed
    assert sorted(item.execution_id for item in published) == [step.pk for step in steps] and len(steps) == 3
    for step, item in zip(steps, sorted(published, key=lambda item: item.execution_id), strict=True):
        assert step.status == S.PENDING and step.message_id == item.message_id and step.enqueued_at is not None
        events = ExecutionEvent.objects.filter(execution=step).order_by("id")
        assert list(events.values_list("from_status", "to_status", "actor")) == [
            ("", S.SCHEDULED, "workflow"),
            (S.SCHEDULED, S.PENDING, "workflow"),
        ]


def test_steps_wait_for_the_monitor_while_another_team_s_run_is_due(user, django_capture_on_commit_callbacks):
    from tests.factories import UserFactory

    _, b, roots, handed = _published_steps(user)
    other = task_create(owner=UserFactory(), runner="noop")  # due now, SCHEDULED: waiting for the monitor
    assert Execution.objects.get(task=other).status == S.SCHEDULED
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        assert _succeed(roots[0])
    (step,) = _steps(b)
    assert step.status == S.SCHEDULED and handed == []


def test_steps_go_out_while_a_run_of_another_user_of_their_team_is_due(user, django_capture_on_commit_callbacks):
    # Fair share is between teams: a teammate's run waiting is the team's own backlog.
    from tasks_app.models import Membership, TeamRole
    from tasks_app.teams.services import team_create
    from tests.factories import UserFactory

    team = team_create(creator=user, name="Pipelines")
    mate = UserFactory()
    Membership.objects.create(team=team, user=mate, role=TeamRole.EDITOR)
    _, b, roots, handed = _published_steps(user, team=team)
    waiting = task_create(owner=mate, runner="noop", team=team)  # due now, SCHEDULED
    assert Execution.objects.get(task=waiting).status == S.SCHEDULED
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        assert _succeed(roots[0])
    (step,) = _steps(b)
    assert step.status == S.PENDING and [item.execution_id for item in handed[0]] == [step.pk]


def test_steps_wait_for_the_monitor_while_their_user_s_run_in_another_team_is_due(
    user, django_capture_on_commit_callbacks
):
    # The same user, another team: that team's turn is the monitor's to give.
    from tasks_app.teams.services import team_create

    _, b, roots, handed = _published_steps(user)
    task_create(owner=user, runner="noop", team=team_create(creator=user, name="Elsewhere"))
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        assert _succeed(roots[0])
    assert _steps(b)[0].status == S.SCHEDULED and handed == []


def test_steps_wait_for_the_monitor_while_their_own_team_has_many_runs_due(
    user, monkeypatch, django_capture_on_commit_callbacks
):
    from executions.transitions import dispatch

    _, b, roots, handed = _published_steps(user)
    monkeypatch.setattr(dispatch, "STEPS_AHEAD_OF_AT_MOST", 1)
    task_create(owner=user, runner="noop")  # one of the owner's own, due and waiting
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        assert _succeed(roots[0])
    assert _steps(b)[0].status == S.SCHEDULED and handed == []


def test_steps_wait_for_the_monitor_while_the_queue_is_deep(user, monkeypatch, django_capture_on_commit_callbacks):
    from executions.transitions import dispatch

    _, b, roots, handed = _published_steps(user, upstreams=2)
    monkeypatch.setattr(dispatch, "STEPS_QUEUED_AT_MOST", 1)
    Execution.objects.filter(pk=roots[1]).update(status=S.PENDING, lease_owner="")  # published, not started
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(handed.append):
        assert _succeed(roots[0])
    assert _steps(b)[0].status == S.SCHEDULED and handed == []


def test_steps_a_worker_could_not_publish_go_back_to_the_monitor(user, monkeypatch, django_capture_on_commit_callbacks):
    from kombu.exceptions import OperationalError as KombuOperationalError

    from executions import tasks

    _, b, roots, _ = _published_steps(user)

    def refused(*args, **kwargs):
        raise KombuOperationalError("[Errno 111] Connection refused")

    monkeypatch.setattr(tasks.run_execution, "apply_async", refused)
    with django_capture_on_commit_callbacks(execute=True), transitions.publishing_steps(tasks.publish_steps):
        assert _succeed(roots[0])
    (step,) = _steps(b)
    assert step.status == S.SCHEDULED and step.message_id == ""
    assert ExecutionEvent.objects.filter(execution=step, to_status=S.SCHEDULED, from_status=S.PENDING).exists()


def _chain(user, length: int = 3):
    """Tasks each following the one before; the first one's run PENDING, as published."""
    tasks = [task_create(owner=user, runner="noop")]
    for _ in range(length - 1):
        tasks.append(task_create(owner=user, runner="noop", after=_after((tasks[-1], "success"))))
    root = Execution.objects.get(task=tasks[0])
    Execution.objects.filter(pk=root.pk).update(status=S.PENDING)
    return tasks, root


def _statuses(tasks) -> list[list[str]]:
    return [list(Execution.objects.filter(task=task).values_list("status", flat=True)) for task in tasks]


@pytest.mark.django_db(transaction=True)
def test_a_message_runs_the_steps_its_ends_create_without_sending_them(user, monkeypatch):
    from executions import tasks as celery_tasks

    chain, root = _chain(user)
    sent: list[object] = []
    monkeypatch.setattr(celery_tasks.run_execution, "apply_async", lambda *a, **k: sent.append(a))
    monkeypatch.setattr(celery_tasks.run_executions, "apply_async", lambda *a, **k: sent.append(a))

    outcome = celery_tasks.run_executions.apply(args=([[root.pk, 1]],)).get()

    assert outcome == {"finished": 3} and sent == []
    assert _statuses(chain) == [[S.SUCCEEDED]] * 3


@pytest.mark.django_db(transaction=True)
def test_steps_past_the_message_s_budget_are_handed_on_or_else_given_back(user, monkeypatch):
    from kombu.exceptions import OperationalError as KombuOperationalError

    from executions import tasks as celery_tasks
    from executions import worker_services

    monkeypatch.setattr(worker_services, "HAND_ON_AFTER", -1.0)  # every run after the first is late
    chain, root = _chain(user)
    sent: list[dict] = []
    monkeypatch.setattr(celery_tasks.run_executions, "apply_async", lambda *a, **k: sent.append(k))

    assert celery_tasks.run_execution.apply(args=(root.pk, 1)).get() == "finished"

    # The next step is the first of what it handles after its own run; the one after that is
    # past the budget, handed on in a message of its own.
    (message,) = sent
    (step,) = Execution.objects.filter(task=chain[2])
    assert message["args"] == ([(step.pk, 1)],) and step.status == S.PENDING
    assert _statuses(chain) == [[S.SUCCEEDED], [S.SUCCEEDED], [S.PENDING]]

    # The broker refuses: the step taken next runs here, and the one after goes to the monitor.
    def refused(*args, **kwargs):
        raise KombuOperationalError("[Errno 111] Connection refused")

    chain, root = _chain(user)
    monkeypatch.setattr(celery_tasks.run_executions, "apply_async", refused)
    assert celery_tasks.run_executions.apply(args=([[root.pk, 1]],)).get() == {"finished": 2}
    assert _statuses(chain) == [[S.SUCCEEDED], [S.SUCCEEDED], [S.SCHEDULED]]
    (last,) = Execution.objects.filter(task=chain[2])
    assert last.events.filter(from_status=S.PENDING, to_status=S.SCHEDULED, detail="left to the monitor").exists()


def test_the_batch_claim_tells_which_runs_are_followed_and_their_end_is_written_once(user):
    from django.test.utils import CaptureQueriesContext

    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=_after((a, "success")))
    lone = task_create(owner=user, runner="noop")
    runs = [Execution.objects.get(task=a).pk, Execution.objects.get(task=lone).pk]
    Execution.objects.filter(pk__in=runs).update(status=S.PENDING)
    claimed = transitions.executions_claim_loaded(items=[(pk, 1) for pk in runs], worker_id="w1", lease_seconds=60)
    assert {pk: claimed[pk].followed for pk in runs} == {runs[0]: True, runs[1]: False}
    with CaptureQueriesContext(connection) as queries:
        won = transitions.executions_succeed(
            successes=[transitions.Success(pk, 1, "{}", followed=claimed[pk].followed) for pk in runs],
            worker_id="w1",
            max_chars=1000,
        )
    assert won == set(runs)
    # One end for the run nothing follows, one with its follower for the other: none written twice.
    ends = [query for query in queries.captured_queries if "'RUNNING', 'SUCCEEDED'" in query["sql"]]
    assert len(ends) == 2
    assert len(_steps(b)) == 1 and not Execution.objects.filter(task=lone, origin=ExecutionOrigin.WORKFLOW).exists()
