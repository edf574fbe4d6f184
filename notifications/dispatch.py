"""From outbox rows to deliveries to the wire.

1. :func:`dispatch_outbox` takes outbox rows (``FOR UPDATE SKIP LOCKED``), applies each task's
   rules and their storm state, creates deliveries (unique idempotency key) and deletes the rows,
   all in one transaction: an event makes its deliveries exactly once.
2. :func:`lease_due` leases due deliveries to senders (a token and an expiry) and
   :func:`deliver` sends one under its lease, recording delivered / retry with backoff / failed.
   A sender killed mid-send loses nothing: its lease runs out and the next dispatch hands the
   delivery to another sender, which sends it again with the same idempotency key.
3. :func:`check_long_runs` and :func:`check_dead_mans_switch` are the periodic checks.
4. Digest rules (``Rule.digest_every``): :func:`notify` collects their notifications as
   :class:`~notifications.models.DigestItem` rows instead of deliveries; :func:`flush_digests`
   turns a rule's items whose window ended into one "digest" delivery (items and delivery in one
   transaction, so each item is in exactly one digest), sent like any other delivery.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
import zoneinfo
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.core.mail import BadHeaderError
from django.db import connection, transaction
from django.db.models import F, Min, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from executions import traces
from executions.models import Execution, ExecutionStatus
from executions.workflow_runs import RunState, WorkflowRun, workflow_run_read
from notifications import senders
from notifications.models import (
    Channel,
    ChannelKind,
    ChannelState,
    Delivery,
    DeliveryStatus,
    DigestItem,
    Outbox,
    OutboxKind,
    Rule,
    RuleState,
)
from tasks_app.models import Task, TaskStatus
from tasks_app.quotas import rate_take
from tasks_app.secrets import redact
from tms_core import metrics, tracing
from tms_core.clock import db_now
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

#: pg_try_advisory_xact_lock key of the outbox evaluation: one evaluator at a time, so a task's
#: events are applied to its storm state in the order they happened (sending stays parallel).
OUTBOX_LOCK = 0x746D_736E  # "tmsn"
#: A digest message lists its latest items up to this many (the counts cover all of them) ...
DIGEST_ITEMS = 50
#: ... and its counts per task and event up to this many groups (the largest first).
DIGEST_GROUPS = 100
#: An item's ``detail`` (an error text) is cut to this many characters in a digest.
DIGEST_DETAIL = 500


def delivery_key(channel_id: int, source: str, rule_id: int | None) -> str:
    """The deterministic idempotency key of the delivery of event ``source`` through a rule."""
    return hashlib.sha256(f"{channel_id}|{source}|{rule_id or '-'}".encode()).hexdigest()


def effective_rules(task: Task) -> list[Rule]:
    """The enabled rules of ``task``: its own if it has any, else its team's defaults. Only rules
    of the task's team count (a rule left from before a move would speak to the old team)."""
    own = list(Rule.objects.filter(enabled=True, task=task, team_id=task.team_id).select_related("channel"))
    if own:
        return own
    return list(Rule.objects.filter(enabled=True, task__isnull=True, team_id=task.team_id).select_related("channel"))


def quiet_until(channel: Channel, now: datetime) -> datetime | None:
    """The end of the channel's quiet hours if ``now`` falls inside them, else None."""
    if channel.quiet_from is None or channel.quiet_to is None or channel.quiet_from == channel.quiet_to:
        return None
    local = now.astimezone(zoneinfo.ZoneInfo(channel.timezone))
    start, end, at = channel.quiet_from, channel.quiet_to, local.time()
    inside = start <= at < end if start < end else (at >= start or at < end)  # a window over midnight
    if not inside:
        return None
    day = local.date() if at < end else local.date() + timedelta(days=1)
    return datetime.combine(day, end, tzinfo=local.tzinfo).astimezone(now.tzinfo)


def notify(
    rule: Rule,
    task: Task,
    event: str,
    source: str,
    *,
    execution_id: int | None = None,
    attempt: int | None = None,
    at: datetime | None = None,
    **extra: Any,
) -> Delivery | DigestItem | None:
    """Create the delivery of ``event`` (caused by ``source``) through ``rule``, or for a digest
    rule the item its next digest will carry; None if it exists already."""
    now = timezone.now()
    key = delivery_key(rule.channel_id, source, rule.pk)
    payload = {
        "id": key,
        "event": event,
        "task": {"id": str(task.pk), "name": task.name},
        "execution": {"id": execution_id, "attempt": attempt} if execution_id else None,
        "at": (at or now).isoformat(),
        **extra,
    }
    if rule.digest_every is not None:
        return _collect(rule, task, key, event, payload)
    delivery, created = Delivery.objects.get_or_create(
        idempotency_key=key,
        defaults={
            "channel": rule.channel,
            "rule": rule,
            "task": task,
            "execution_id": execution_id,
            "event": event,
            "payload": payload,
            "next_attempt_at": quiet_until(rule.channel, now) or now,
        },
    )
    return delivery if created else None


def _collect(rule: Rule, task: Task, key: str, event: str, payload: dict[str, Any]) -> DigestItem | None:
    """Add a notification to ``rule``'s open digest window (the one its waiting items are in),
    or open a window that ends ``digest_every`` from now; None if this event is in already."""
    assert rule.digest_every is not None
    if isinstance(payload.get("detail"), str):
        payload["detail"] = payload["detail"][:DIGEST_DETAIL]
    waiting = DigestItem.objects.filter(rule=rule, delivery__isnull=True).aggregate(due=Min("due_at"))["due"]
    item, created = DigestItem.objects.get_or_create(
        key=key,
        defaults={
            "rule": rule,
            "task": task,
            "event": event,
            "payload": payload,
            "due_at": waiting or db_now() + rule.digest_every,
        },
    )
    return item if created else None


def digest_payload(rule: Rule, key: str, items: list[DigestItem], now: datetime) -> dict[str, Any]:
    """The message of one digest: counts per task and event over all ``items``, and the latest
    :data:`DIGEST_ITEMS` items themselves (bounded, whatever the number of items)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for item in items:
        task = item.payload.get("task") or {}
        group = groups.setdefault(
            (str(task.get("id")), item.event), {"task": task or None, "event": item.event, "count": 0}
        )
        group["count"] += 1
    counts = sorted(groups.values(), key=lambda g: (-g["count"], str((g["task"] or {}).get("name")), g["event"]))
    latest = items[-DIGEST_ITEMS:]
    task = {"id": str(rule.task_id), "name": rule.task.name} if rule.task_id and rule.task else None
    return {
        "id": key,
        "event": "digest",
        "task": task,
        "execution": None,
        "at": now.isoformat(),
        "window": {"from": min(item.at for item in items).isoformat(), "to": now.isoformat()},
        "total": len(items),
        "counts": counts[:DIGEST_GROUPS],
        "counts_omitted": max(0, len(counts) - DIGEST_GROUPS),
        "items": [item.payload for item in latest],
        "items_omitted": len(items) - len(latest),
    }


def flush_digests(*, limit: int = 200) -> int:
    """One "digest" delivery per digest rule whose window ended, unless its channel is in quiet
    hours (then its items wait, and the first pass after the quiet hours sends them all as one
    digest). The items and their delivery are written in one transaction under row locks, so
    each item is in exactly one digest; the key is per window (its first item). Answers how many
    digests were made."""
    made = 0
    now = db_now()
    rule_ids = list(
        DigestItem.objects.filter(delivery__isnull=True, due_at__lte=now)
        .order_by()
        .values_list("rule_id", flat=True)
        .distinct()[:limit]
    )
    for rule in Rule.objects.filter(pk__in=rule_ids).select_related("channel", "task"):
        if quiet_until(rule.channel, now) is not None:
            continue
        with transaction.atomic():
            # FOR UPDATE: a concurrent flush waits, then finds these rows taken (delivery set).
            items = list(
                DigestItem.objects.select_for_update()
                .filter(rule=rule, delivery__isnull=True, due_at__lte=now)
                .order_by("at", "id")
            )
            if not items:
                continue
            key = delivery_key(rule.channel_id, f"digest:{rule.pk}:{min(item.pk for item in items)}", rule.pk)
            delivery = Delivery.objects.create(
                channel=rule.channel,
                rule=rule,
                task_id=rule.task_id,
                event="digest",
                payload=digest_payload(rule, key, items, now),
                idempotency_key=key,
                next_attempt_at=now,
            )
            DigestItem.objects.filter(pk__in=[item.pk for item in items]).update(delivery=delivery)
            made += 1
    return made


def _state(rule: Rule, task: Task) -> RuleState:
    RuleState.objects.get_or_create(rule=rule, task=task)
    return RuleState.objects.select_for_update().get(rule=rule, task=task)


def workflow_of(row: Outbox) -> WorkflowRun | None:
    """The workflow run a "workflow" outbox row's step belongs to, as it stands now (None: gone)."""
    if row.execution_id is None:
        return None
    step = Execution.objects.filter(pk=row.execution_id).values_list("workflow_run", flat=True).first()
    root = Execution.objects.filter(pk=step).select_related("task").first() if step is not None else None
    return workflow_run_read(root) if root is not None else None


def _apply_workflow(row: Outbox, task: Task, rule: Rule, run: WorkflowRun) -> None:
    """A step of a workflow run of ``task`` (its root task) ended; ``run`` is that run now.

    The run *failed* once a step failed for good with nothing to follow its failure (it cannot
    complete), even while other branches still run; it *succeeded* once every step ended and none
    failed unhandled. As "failing" and "recovered" for a task: "workflow_failed" once when the
    task's workflow runs start failing (later failed runs are counted, each once however many of
    its steps end), "workflow_recovered" when one succeeds after. The delivery key is the run's,
    so no run is told twice."""
    common: dict[str, Any] = {"execution_id": row.execution_id, "attempt": row.attempt, "at": row.at}
    state = _state(rule, task)
    if run.unhandled:
        if state.workflow_failed_run == run.id:
            return  # this run is counted already (another of its steps ended)
        state.workflow_failed_run = run.id
        if state.workflow_failing:
            state.workflow_failures += 1
        else:
            state.workflow_failing, state.workflow_failures = True, 1
            if rule.on_failure:
                failed = run.unhandled[0]
                notify(
                    rule,
                    task,
                    "workflow_failed",
                    f"workflow:{run.id}:failed",
                    workflow_run=run.id,
                    failed_steps=[{"execution": e.pk, "task": str(e.task_id)} for e in run.unhandled],
                    detail=f"Step {failed.pk} ({failed.task}) failed: {failed.error[:900]}",
                    **common,
                )
        state.save()
    elif run.state == RunState.SUCCEEDED and state.workflow_failing:
        if rule.on_recovery:
            notify(
                rule,
                task,
                "workflow_recovered",
                f"workflow:{run.id}:recovered",
                workflow_run=run.id,
                failures=state.workflow_failures,
                **common,
            )
        state.workflow_failing, state.workflow_failures = False, 0
        state.save()


def _apply(row: Outbox, task: Task, rule: Rule, run: WorkflowRun | None = None) -> None:
    """One outbox event through one rule: storm state first, then at most one delivery."""
    common: dict[str, Any] = {"execution_id": row.execution_id, "attempt": row.attempt, "at": row.at}
    source = f"outbox:{row.pk}"
    if row.kind == OutboxKind.WORKFLOW:
        if run is not None and (rule.on_failure or rule.on_recovery):
            _apply_workflow(row, task, rule, run)
        return
    if row.kind == OutboxKind.LATE:
        if rule.late_after is not None and row.execution_id is not None:
            execution = Execution.objects.filter(pk=row.execution_id).values("due_at", "started_at").first()
            if (
                execution
                and execution["started_at"]
                and execution["started_at"] - execution["due_at"] > rule.late_after
            ):
                lateness = (execution["started_at"] - execution["due_at"]).total_seconds()
                notify(rule, task, "late", source, lateness_seconds=round(lateness, 3), **common)
        return
    if row.kind == OutboxKind.SKIPPED:
        if rule.on_skip:
            when = row.scheduled_for.isoformat() if row.scheduled_for else None
            notify(rule, task, "skipped", source, detail=row.detail, scheduled_for=when, **common)
        return
    if row.kind == OutboxKind.RETRY:
        if rule.on_retry and not _state(rule, task).failing:
            notify(rule, task, "retry", source, detail=row.detail, **common)
        return
    state = _state(rule, task)
    if row.kind == OutboxKind.FAILED and (rule.on_failure or rule.on_recovery):
        if state.failing:
            state.failures += 1  # still failing: counted, not told
        else:
            state.failing, state.failures, state.failing_since = True, 1, row.at
            if rule.on_failure:
                notify(rule, task, "failing", source, detail=row.detail, **common)
        state.save()
    elif row.kind == OutboxKind.SUCCEEDED and (state.failing or state.overdue):
        was_failing = state.failing
        failures, since = state.failures, state.failing_since
        if (was_failing and rule.on_recovery) or state.overdue:
            notify(
                rule,
                task,
                "recovered",
                source,
                failures=failures if was_failing else 0,
                failing_since=since.isoformat() if was_failing and since else None,
                **common,
            )
        state.failing, state.failures, state.failing_since, state.overdue = False, 0, None, False
        state.save()


def dispatch_outbox(*, batch: int = 500) -> int:
    """Turn up to ``batch`` outbox rows into deliveries and delete them; the number of rows taken."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [OUTBOX_LOCK])
            if not cursor.fetchone()[0]:
                return 0  # another dispatcher is evaluating; it takes these rows too
        rows = list(Outbox.objects.select_for_update(skip_locked=True).order_by("id")[:batch])
        tasks = {task.pk: task for task in Task.objects.filter(pk__in={row.task_id for row in rows})}
        rules: dict[Any, list[Rule]] = {}
        for row in rows:
            task = tasks.get(row.task_id)
            if task is None:
                continue  # deleted meanwhile: nobody to tell about it
            if task.pk not in rules:
                rules[task.pk] = effective_rules(task)
            # A workflow step's end: its run read once, for every rule.
            run = workflow_of(row) if row.kind == OutboxKind.WORKFLOW else None
            for rule in rules[task.pk]:
                _apply(row, task, rule, run)
        Outbox.objects.filter(pk__in=[row.pk for row in rows]).delete()
    return len(rows)


@dataclass(frozen=True)
class Lease:
    delivery_ids: list[int]
    token: str


def lease_due(*, limit: int = 100) -> Lease:
    """Lease up to ``limit`` due deliveries (never leased, or whose lease ran out) to one token."""
    token = uuid.uuid4().hex
    with transaction.atomic():
        due = (
            Delivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=db_now())
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=db_now()))
            .order_by("next_attempt_at")
        )
        ids = list(due.values_list("id", flat=True)[:limit])
        until = db_now() + timedelta(seconds=tms_settings().NOTIFY_LEASE)
        Delivery.objects.filter(pk__in=ids).update(lease_until=until, lease_token=token)
    return Lease(ids, token)


def _mine(delivery_id: int, token: str) -> QuerySet:
    return Delivery.objects.filter(pk=delivery_id, lease_token=token, status=DeliveryStatus.PENDING)


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: doubling, capped."""
    conf = tms_settings()
    return float(min(conf.NOTIFY_BACKOFF * 2 ** max(attempts - 1, 0), conf.NOTIFY_BACKOFF_MAX))


def deliver(delivery_id: int, token: str) -> str:
    """Send one leased delivery and record the outcome; a delivery no longer leased to ``token``
    (another sender took it over, or it is done) is left alone."""
    conf = tms_settings()
    lease = db_now() + timedelta(seconds=conf.NOTIFY_LEASE)
    if (
        not _mine(delivery_id, token)
        .filter(lease_until__gt=db_now())
        .update(attempts=F("attempts") + 1, lease_until=lease)
    ):
        return "not leased"
    delivery = Delivery.objects.select_related("channel").get(pk=delivery_id)
    channel = delivery.channel
    if channel.kind == ChannelKind.EMAIL and (wait := _email_rate_wait(channel)):
        # The e-mail runner's per-owner rate, shared with the owner's e-mail tasks: the send
        # waits (its attempt given back), it is not lost.
        retry_at = db_now() + timedelta(seconds=wait)
        _mine(delivery_id, token).update(
            attempts=F("attempts") - 1, lease_until=None, lease_token="", next_attempt_at=retry_at
        )
        return "deferred"
    try:
        with _delivery_span(delivery, channel):
            senders.send(
                kind=channel.kind,
                target=channel.target,
                secret=channel.secret,
                key=delivery.idempotency_key,
                payload=delivery.payload,
                timeout=conf.NOTIFY_TIMEOUT,
            )
    except Exception as exc:  # noqa: BLE001 - every error is a counted attempt with its reason
        error = exc if isinstance(exc, senders.SendError) else _unexpected(exc)
        # An error text may quote the URL (a Slack URL is the credential) or, never expected,
        # the secret: neither reaches the log, the channel or the API.
        error.message = redact(error.message, _channel_secrets(channel))
        return _record_failure(delivery, token, error)
    _mine(delivery_id, token).update(
        status=DeliveryStatus.DELIVERED, delivered_at=db_now(), lease_until=None, last_error=""
    )
    # One attempt through ends the channel's run of failures, and its failing state.
    Channel.objects.filter(pk=channel.pk).filter(Q(state=ChannelState.FAILING) | Q(failed_attempts__gt=0)).update(
        state=ChannelState.OK, failing_since=None, failed_attempts=0, failures_since=None
    )
    metrics.NOTIFICATIONS_DELIVERED.labels(channel.kind).inc()
    return "delivered"


def _delivery_span(delivery: Delivery, channel: Channel) -> AbstractContextManager[object]:
    """With tracing on, the send in a span of its own trace (``tms.notification.deliver``),
    linked to the run it is about."""
    if not tracing.ON:
        return nullcontext()
    attributes = {
        "tms.delivery_id": delivery.pk,
        "tms.channel_kind": channel.kind,
        "tms.event": delivery.event,
        "tms.execution_id": delivery.execution_id,
        "tms.attempt": delivery.attempts + 1,
    }
    span = tracing.pass_span("tms.notification.deliver", attributes)
    if delivery.execution_id is None:
        return span
    run = traces.traces_of([delivery.execution_id]).get(delivery.execution_id)

    @contextmanager
    def linked() -> Iterator[object]:
        with span as opened:
            tracing.add_links(opened, [run])
            yield opened

    return linked()


def _unexpected(exc: Exception) -> senders.SendError:
    """A sending error that is not a :class:`~notifications.senders.SendError` (a header that a
    backend refuses, a bug): a failed attempt like any other, final when sending again cannot
    help (BadHeaderError: the message itself is bad)."""
    if not isinstance(exc, BadHeaderError):
        logger.exception("notification sender raised")
    return senders.SendError(f"{type(exc).__name__}: {exc}"[:1000], permanent=isinstance(exc, BadHeaderError))


def _email_rate_wait(channel: Channel) -> float:
    """Seconds an e-mail of ``channel`` must wait for its owner's e-mail rate (0: send now)."""
    runner = senders.email_runner()
    rate = runner.launch_rate() if runner is not None else None
    if runner is None or rate is None:
        return 0.0
    return rate_take(owner_id=channel.owner_id, kind=f"send:{runner.alias}", limit=rate[0], window=rate[1])


def _channel_secrets(channel: Channel) -> list[str]:
    """The texts of a channel never to be shown, longest first (for :func:`redact`)."""
    values = {channel.secret, channel.target}
    if channel.kind == "slack":
        path = urlsplit(channel.target).path
        values |= {path, path.lstrip("/")}
    return sorted((value for value in values if len(value) >= 8), key=len, reverse=True)


def _channel_failed(channel_id: int, error: str, *, final: bool) -> None:
    """Count a failed attempt on its channel and apply the channel's rule: failing once
    ``failing_after`` attempts in a row failed, or at once when a delivery failed for good, since
    the first failure of the run. Conditional updates: concurrent senders each count theirs."""
    now = db_now()
    Channel.objects.filter(pk=channel_id).update(
        failed_attempts=F("failed_attempts") + 1, last_error=error, failures_since=Coalesce("failures_since", now)
    )
    due = Q(failed_attempts__gte=F("failing_after"))
    if final:
        due |= Q(pk=channel_id)
    Channel.objects.filter(due, pk=channel_id, state=ChannelState.OK).update(
        state=ChannelState.FAILING, failing_since=Coalesce("failures_since", now)
    )


def _record_failure(delivery: Delivery, token: str, exc: senders.SendError) -> str:
    conf = tms_settings()
    final = exc.permanent or delivery.attempts >= conf.NOTIFY_MAX_ATTEMPTS
    logger.warning("notification %s to channel %s failed (%s): %s", delivery.pk, delivery.channel_id,
                   "final" if final else "will retry", exc.message)  # fmt: skip
    _channel_failed(delivery.channel_id, exc.message, final=final)
    if final:
        _mine(delivery.pk, token).update(status=DeliveryStatus.FAILED, lease_until=None, last_error=exc.message)
        metrics.NOTIFICATIONS_FAILED.labels(delivery.channel.kind, "final").inc()
        return "failed"
    retry_at = db_now() + timedelta(seconds=backoff(delivery.attempts))
    _mine(delivery.pk, token).update(lease_until=None, lease_token="", next_attempt_at=retry_at, last_error=exc.message)
    metrics.NOTIFICATIONS_FAILED.labels(delivery.channel.kind, "retry").inc()
    return "retry"


def queue_test(channel: Channel) -> tuple[Delivery, str]:
    """Create a test delivery for ``channel``, leased to a new token, and return both: the caller
    hands ``(delivery id, token)`` to a sender on the notification queue once this commits (never
    sending in its own process: a slow target would hold a web worker). If that message is lost,
    the lease runs out and the next dispatch pass sends the delivery like any other."""
    key = delivery_key(channel.pk, f"test:{uuid.uuid4().hex}", None)
    token = uuid.uuid4().hex
    now = timezone.now()
    delivery = Delivery.objects.create(
        channel=channel,
        event="test",
        idempotency_key=key,
        payload={"id": key, "event": "test", "task": None, "execution": None, "at": now.isoformat()},
        next_attempt_at=now,
        lease_token=token,
        lease_until=now + timedelta(seconds=tms_settings().NOTIFY_LEASE),
    )
    return delivery, token


def _default_scope(rule: Rule) -> QuerySet:
    """The tasks a team-wide rule speaks for: the team's tasks without enabled rules of their own."""
    return Task.objects.filter(team_id=rule.team_id).exclude(notification_rules__enabled=True)


def check_long_runs() -> int:
    """One "running_long" per execution running longer than a rule's ``running_longer_than``."""
    created = 0
    now = db_now()
    for rule in Rule.objects.filter(enabled=True, running_longer_than__isnull=False).select_related("channel"):
        assert rule.running_longer_than is not None
        running = Execution.objects.filter(
            status=ExecutionStatus.RUNNING, started_at__lt=now - rule.running_longer_than
        )
        if rule.task_id is not None:
            running = running.filter(task_id=rule.task_id)
        else:
            running = running.filter(task__in=_default_scope(rule))
        for execution in running.select_related("task")[:1000]:
            seconds = (now - execution.started_at).total_seconds() if execution.started_at else 0
            with transaction.atomic():
                if notify(
                    rule,
                    execution.task,
                    "running_long",
                    f"long:{execution.pk}",
                    execution_id=execution.pk,
                    attempt=execution.attempt,
                    running_seconds=round(seconds, 1),
                ):
                    created += 1
    return created


def check_dead_mans_switch() -> int:
    """One "overdue" per recurring task with no success within a rule's ``no_success_within``
    (counted from its last success, or from when the rule or task was created); the next
    success sends "recovered" (see :func:`_apply`)."""
    created = 0
    now = db_now()
    for rule in Rule.objects.filter(enabled=True, no_success_within__isnull=False).select_related("channel"):
        assert rule.no_success_within is not None
        tasks = Task.objects.filter(pk=rule.task_id) if rule.task_id else _default_scope(rule)
        recurring = tasks.filter(status=TaskStatus.ACTIVE).filter(Q(interval__isnull=False) | ~Q(cron=""))
        for task in recurring[:1000]:
            last = (
                Execution.objects.filter(task=task, status=ExecutionStatus.SUCCEEDED)
                .order_by("-scheduled_for")
                .values_list("finished_at", flat=True)
                .first()
            )
            since = max(filter(None, [last, rule.created_at, task.created_at]))
            if now - since <= rule.no_success_within:
                continue
            with transaction.atomic():
                state = _state(rule, task)
                if state.overdue:
                    continue
                state.overdue = True
                state.save(update_fields=["overdue"])
                notify(
                    rule,
                    task,
                    "overdue",
                    f"overdue:{task.pk}:{since.isoformat()}",
                    within=_duration_text(rule.no_success_within),
                    last_success=last.isoformat() if last else None,
                )
                created += 1
    return created


def _duration_text(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h"


__all__ = [
    "Lease",
    "check_dead_mans_switch",
    "check_long_runs",
    "deliver",
    "digest_payload",
    "dispatch_outbox",
    "flush_digests",
    "lease_due",
    "queue_test",
    "quiet_until",
]
