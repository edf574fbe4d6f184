"""The only package that writes an execution's status.

Every transition is one conditional UPDATE (``WHERE id = … AND status IN (its edge's sources)``,
plus the attempt number and the lease owner for a worker's writes) that reports whether it won,
and writes its :class:`~executions.models.ExecutionEvent` in the same statement. A caller that
loses changes nothing and must stop working on that execution. Time always comes from the
database clock, never from the host.

* :mod:`.states`: the state map (:data:`ALLOWED_SOURCES`) and each transition's edge;
* :mod:`.sql`: the one way to write a transition with its event, and the SQL helpers;
* :mod:`.create`: the materialiser's executions; :mod:`.dispatch`: the monitor's takes;
  :mod:`.worker`: claim, lease and outcome; :mod:`.overlap`: claims under the overlap policy
  and the concurrency cap; :mod:`.misfire`: the misfire policy and skips;
  :mod:`.actions`: cancel, trigger and retry; :mod:`.follow`: the runs that follow a run's end
  (workflows), created in the transaction that records it; :mod:`.hold`: a workflow run's pause
  and cancel, read by those ends; :mod:`.resume`: a paused workflow run's resume, a failed one's
  retry; :mod:`.events`: a debounced event run's due time, the wait-for-event steps' nudge.

Callers import the package (``from executions import transitions``) and use the names below.
"""

from executions.transitions.actions import (
    RETRYABLE_STATUSES,
    CancelOutcome,
    Replay,
    execution_cancel,
    execution_join_trigger,
    execution_retry,
    execution_trigger,
    executions_replay,
)
from executions.transitions.create import NewExecution, executions_create, executions_create_arrays
from executions.transitions.dispatch import (
    POLL_PRIORITY,
    STEPS_PUBLISHED,
    Dispatch,
    Outlook,
    dispatch_outlook,
    executions_expire_leases,
    executions_take_due,
    executions_take_polls,
    executions_take_stale_pending,
    executions_untake,
    next_due_in,
)
from executions.transitions.events import (
    WAIT_EVENT_HANDLE_KEY,
    execution_debounce_event,
    executions_nudge_event_waits,
)
from executions.transitions.follow import INPUT_MAX_CHARS, WORKFLOW_ACTOR, input_from, publishing_steps
from executions.transitions.hold import halted_runs, workflow_run_hold_set, workflow_run_retry_bump
from executions.transitions.misfire import Misfire, execution_skip_misfire, misfire_decision
from executions.transitions.overlap import (
    QUEUE_RETRY_SECONDS,
    WAIT_RECHECK_SECONDS,
    ExclusiveClaim,
    execution_claim_exclusive,
    execution_wait_for_limit,
    executions_release_limit_waiters,
    executions_release_waiting,
)
from executions.transitions.resume import workflow_run_resume, workflow_run_retry
from executions.transitions.sql import pg_array
from executions.transitions.states import ALLOWED_SOURCES
from executions.transitions.worker import (
    CALLBACK_ACTOR,
    Success,
    execution_acquire,
    execution_claim_loaded,
    execution_extend_lease,
    execution_fail,
    execution_record_run,
    execution_release,
    execution_report_progress,
    execution_succeed,
    execution_take_back,
    executions_claim_loaded,
    executions_succeed,
)

__all__ = [
    "ALLOWED_SOURCES",
    "CALLBACK_ACTOR",
    "INPUT_MAX_CHARS",
    "POLL_PRIORITY",
    "QUEUE_RETRY_SECONDS",
    "RETRYABLE_STATUSES",
    "STEPS_PUBLISHED",
    "WAIT_EVENT_HANDLE_KEY",
    "WAIT_RECHECK_SECONDS",
    "WORKFLOW_ACTOR",
    "CancelOutcome",
    "Dispatch",
    "ExclusiveClaim",
    "Misfire",
    "NewExecution",
    "Outlook",
    "Replay",
    "Success",
    "dispatch_outlook",
    "execution_acquire",
    "execution_cancel",
    "execution_claim_exclusive",
    "execution_claim_loaded",
    "execution_debounce_event",
    "execution_extend_lease",
    "execution_fail",
    "execution_join_trigger",
    "execution_record_run",
    "execution_release",
    "execution_report_progress",
    "execution_retry",
    "execution_skip_misfire",
    "execution_succeed",
    "execution_take_back",
    "execution_trigger",
    "execution_wait_for_limit",
    "executions_claim_loaded",
    "executions_create",
    "executions_create_arrays",
    "executions_expire_leases",
    "executions_nudge_event_waits",
    "executions_release_limit_waiters",
    "executions_release_waiting",
    "executions_replay",
    "executions_succeed",
    "executions_take_due",
    "executions_take_polls",
    "executions_take_stale_pending",
    "executions_untake",
    "halted_runs",
    "input_from",
    "misfire_decision",
    "next_due_in",
    "pg_array",
    "publishing_steps",
    "workflow_run_hold_set",
    "workflow_run_resume",
    "workflow_run_retry",
    "workflow_run_retry_bump",
]
