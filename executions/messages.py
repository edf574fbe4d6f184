"""How due runs are put into messages: one run per ``run_execution`` message, or several in one
``run_executions`` message (a herd's, a chunk's workflow steps), each with its row's message id,
priority and, for a run taken ahead of its due time, an ETA. Used by the monitor, and by a worker
that publishes the workflow steps its ends created (:func:`executions.tasks.publish_steps`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from kombu import Producer

from executions import transitions
from tms_core.conf import tms_settings

#: Sends one taken row as a message of a Celery task through a producer; raises a broker error
#: if it could not be sent (confirmed).
Publish = Callable[[Any, transitions.Dispatch, Producer], None]


#: Sends several taken rows as one message (see :func:`send_many`).
PublishMany = Callable[[Any, list[transitions.Dispatch], Producer], None]


def eta_of(items: list[transitions.Dispatch]) -> datetime | None:
    """The ETA of a message holding ``items``: the latest due time among them when it is still to
    come (a run taken within the monitor's lookahead), else None (start at once). The worker
    holds a message with an ETA until then; its claim is made on time, and PostgreSQL, not the
    message, still says whether the run may start. None always on quorum queues
    (TMS_QUEUE_TYPE): a worker consuming one has no global QoS, and Celery's holding of an ETA
    message is unsafe there (it warns per message); the monitor takes no run early there."""
    if tms_settings().QUEUE_TYPE == "quorum":
        return None
    due = max((item.due_at for item in items if item.due_at is not None), default=None)
    return due if due is not None and due > timezone.now() else None


def send(task: Any, item: transitions.Dispatch, producer: Producer | None) -> None:
    """The monitor's :data:`Publish`: one message per row, with the row's message id and priority,
    through ``producer`` (None: the app's pool). No kombu retry: a failure undoes the rest of the
    batch and the monitor's loop backs off."""
    task.apply_async(
        args=(item.execution_id, item.attempt),
        task_id=item.message_id,
        priority=item.priority,
        eta=eta_of([item]),
        producer=producer,
        retry=False,
    )


def send_many(task: Any, items: list[transitions.Dispatch], producer: Producer | None) -> None:
    """The monitor's :data:`PublishMany`: one ``run_executions`` message for several rows of one
    priority. Each row keeps its own message id (an undo finds its rows by them); the message's
    own id is the first row's with the count of the others, so Flower shows which runs it holds."""
    task.apply_async(
        args=([[item.execution_id, item.attempt] for item in items],),
        task_id=f"{items[0].message_id}+{len(items) - 1}",
        priority=items[0].priority,
        eta=eta_of(items),
        producer=producer,
        retry=False,
    )


def group_runs(
    taken: list[transitions.Dispatch], *, most: int, spread: int, window: float = 0.0
) -> list[list[transitions.Dispatch]]:
    """Consecutive rows of one priority in messages of at most ``most`` rows, and at least
    ``spread`` messages when there are that many rows (each pool process gets work at once).
    The order of ``taken`` is kept: a message's rows are a slice of it. A row taken ahead of its
    due time shares a message only with rows also taken ahead whose due times lie within
    ``window`` seconds of all the others' (0: the same instant, a herd's): the message's ETA is
    its latest row's, so none starts before its due time and none more than ``window`` after.
    A row already due never waits for one that is not."""
    size = max(1, min(most, len(taken) // max(1, spread)))
    now = timezone.now()
    span = timedelta(seconds=window)

    def ahead_of(item: transitions.Dispatch) -> datetime | None:
        return item.due_at if item.due_at is not None and item.due_at > now else None

    groups: list[list[transitions.Dispatch]] = []
    # The earliest and latest due time of the last group's rows taken ahead (None: due now).
    bounds: tuple[datetime, datetime] | None = None
    for item in taken:
        last = groups[-1] if groups else None
        due = ahead_of(item)
        joined = bounds if due is None else (due, due) if bounds is None else (min(bounds[0], due), max(bounds[1], due))
        if (
            last is not None
            and len(last) < size
            and last[0].priority == item.priority
            and (due is None) == (bounds is None)
            and (joined is None or joined[1] - joined[0] <= span)
        ):
            last.append(item)
            bounds = joined
        else:
            groups.append([item])
            bounds = None if due is None else (due, due)
    return groups
