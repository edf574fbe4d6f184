"""Named events' writes to executions: a debounced event run's due time moved on by the next
event of its key, and the wait-for-event steps nudged to look at an event now. Neither changes a
status; each is one conditional UPDATE reporting what it changed."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import timedelta

from django.db.models import DateTimeField, Expression, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Least, Now

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.transitions import states
from executions.transitions.sql import write_quiet

#: The key a ``wait_event`` run's handle holds the event name under (runners.wait_event).
WAIT_EVENT_HANDLE_KEY = "wait_event"


def execution_debounce_event(
    *,
    execution_id: int,
    run_input: Mapping[str, object] | None,
    window: timedelta,
    max_wait: timedelta | None,
) -> bool:
    """Another event of the same debounce key joins a run it started that is still waiting: the
    run takes this event's payload as its input (the last one wins) and its due time restarts
    the window (now + ``window``, by the database clock), never later than ``max_wait`` after the
    run was created (the first event of its window).

    Conditional on the run being still SCHEDULED and not yet due: a monitor that took it meanwhile
    wins, and the caller starts a new run (a new window). Returns whether it won."""
    due: Expression = ExpressionWrapper(Now() + Value(window), output_field=DateTimeField())
    if max_wait is not None:
        due = Least(due, ExpressionWrapper(F("created_at") + Value(max_wait), output_field=DateTimeField()))
    return bool(
        Execution.objects.filter(pk=execution_id, status=S.SCHEDULED, due_at__gt=Now()).update(
            input=None if run_input is None else dict(run_input), due_at=due
        )
    )


def executions_nudge_event_waits(*, team_ids: Collection[int], name: str) -> int:
    """Make the next poll of every ``wait_event`` run waiting for ``name`` in these teams due now,
    so a matching event ends it promptly instead of at its next backed-off poll. Only runs that
    no worker holds and whose poll is not already due; returns how many were nudged."""
    condition = Q(
        team_id__in=list(team_ids),
        lease_owner="",
        next_poll_at__gt=Now(),
        **{f"run_handle__{WAIT_EVENT_HANDLE_KEY}": name},
    )
    return write_quiet(states.LEASE, condition, {"next_poll_at": Now()})
