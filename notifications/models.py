"""Notification channels, rules, the outbox the database fills, deliveries and storm state.

The outbox is written by database triggers (migration 0001) in the same transaction as the
execution transition or skipped occurrence that causes it; :mod:`notifications.dispatch` turns
outbox rows into deliveries and sends them. See docs/architecture.md, "Notifications".
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from notifications.fields import SealedTextField
from tasks_app.masking import MASK, mask_url


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook"  #: JSON POST signed with HMAC-SHA256 (X-TMS-Signature)
    SLACK = "slack"  #: Slack-compatible incoming webhook: {"text": ...}
    EMAIL = "email"  #: an e-mail through Django's e-mail backend


class ChannelState(models.TextChoices):
    OK = "ok"  #: fewer than ``failing_after`` attempts in a row failed, and none for good
    #: ``failing_after`` attempts in a row failed (retries included), or a delivery failed for
    #: good; ``failing_since`` is the first failure of that run, ``last_error`` says why.
    FAILING = "failing"


#: A channel's own rule, by default: failing after this many failed attempts in a row.
DEFAULT_FAILING_AFTER = 3
MAX_FAILING_AFTER = 100


class Channel(models.Model):
    """Where a team's notifications go, defined once and used by any number of its rules."""

    #: Who created it (its e-mails and test messages count against this user's rates).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_channels")
    #: The team it belongs to: its members see it, its editors change it, its rules use it.
    team = models.ForeignKey("tasks_app.Team", on_delete=models.PROTECT, related_name="notification_channels")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    #: The URL (webhook, slack) or e-mail address (email) messages go to. Encrypted at rest: a
    #: Slack (or any incoming-webhook) URL is itself the credential. Shown masked (:func:`shown_target`).
    target = SealedTextField(max_length=500)
    #: HMAC-SHA256 key of webhook signatures: generated, encrypted at rest, shown to the owner
    #: once (in the answer that created or regenerated it), masked everywhere else.
    secret = SealedTextField(max_length=64, blank=True)
    #: Quiet hours, in ``timezone``: deliveries due inside [quiet_from, quiet_to) wait until quiet_to.
    quiet_from = models.TimeField(null=True, blank=True)
    quiet_to = models.TimeField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    state = models.CharField(max_length=16, choices=ChannelState.choices, default=ChannelState.OK)
    #: The channel's rule: it turns failing after this many delivery attempts in a row failed
    #: (a delivery that failed for good turns it failing at once).
    failing_after = models.PositiveSmallIntegerField(
        default=DEFAULT_FAILING_AFTER,
        help_text="Failing after this many failed delivery attempts in a row (retries count).",
    )
    #: Failed delivery attempts since the last one that went through, and when the first of them was.
    failed_attempts = models.PositiveIntegerField(default=0)
    failures_since = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def shown_target(self) -> str:
        """The target as people see it: a Slack URL as its host only (the rest is the
        credential), a webhook URL without its password or secret-named query values, an
        e-mail address as it is."""
        if self.kind == ChannelKind.SLACK and self.target:
            parts = urlsplit(self.target)
            return f"{parts.scheme}://{parts.hostname or ''}/{MASK}"
        if self.kind == ChannelKind.WEBHOOK:
            return mask_url(self.target)
        return self.target

    def shown_secret(self) -> str:
        """The signing secret as people see it after it was handed out: masked (empty if none)."""
        return MASK if self.secret else ""


class Rule(models.Model):
    """What to notify about, for one task of the team or (``task`` null) as the team's default
    for every task of the team that has no rule of its own."""

    #: Who created it.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_rules")
    #: The team it belongs to: it speaks for this team's tasks, through this team's channels. No
    #: index of its own: rule_team_default_idx serves the outbox triggers' look-up.
    team = models.ForeignKey(
        "tasks_app.Team", on_delete=models.PROTECT, related_name="notification_rules", db_index=False
    )
    task = models.ForeignKey(
        "tasks_app.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="notification_rules"
    )
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="rules")
    enabled = models.BooleanField(default=True)
    #: Final failure (attempts exhausted): one "failing" when the task starts failing.
    on_failure = models.BooleanField(default=False)
    #: A failed attempt that will be retried (not while the task is already failing).
    on_retry = models.BooleanField(default=False)
    #: First success after failures ("recovered", with the count of failures in between), and
    #: the first success after a dead man's switch fired.
    on_recovery = models.BooleanField(default=False)
    #: An occurrence skipped or missed (misfire, paused, overlap), with its reason.
    on_skip = models.BooleanField(default=False)
    #: Started more than this after its due time.
    late_after = models.DurationField(null=True, blank=True)
    #: Still running this long after it started (one notification per execution).
    running_longer_than = models.DurationField(null=True, blank=True)
    #: Dead man's switch: no successful run within this long.
    no_success_within = models.DurationField(null=True, blank=True)
    #: Digest mode: null sends each notification at once; a duration collects them (a window
    #: opens at the first one) and sends one summary message when the window has lasted this long.
    digest_every = models.DurationField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        indexes = [
            # The outbox triggers' look-ups: a task's rules, and a team's defaults.
            models.Index(fields=["task"], condition=Q(enabled=True), name="rule_task_idx"),
            models.Index(fields=["team"], condition=Q(enabled=True, task__isnull=True), name="rule_team_default_idx"),
        ]

    def __str__(self) -> str:
        return f"rule {self.pk} -> {self.channel_id}"


class OutboxKind(models.TextChoices):
    FAILED = "failed"  #: an execution reached FAILED
    RETRY = "retry"  #: a failed attempt went back to SCHEDULED
    SUCCEEDED = "succeeded"  #: an execution reached SUCCEEDED
    LATE = "late"  #: an execution started later than a late rule allows
    SKIPPED = "skipped"  #: an occurrence was skipped or missed
    #: A step of a workflow run ended (SUCCEEDED or FAILED, in ``detail``): a row for the rules of
    #: the workflow's root task, which the dispatcher reads as "workflow run failed" / "recovered".
    WORKFLOW = "workflow"


class Outbox(models.Model):
    """An event waiting for the dispatcher. Inserted by triggers only; deleted once dispatched."""

    kind = models.CharField(max_length=16, choices=OutboxKind.choices)
    # No foreign keys: the trigger's insert must cost nothing more than the row.
    task_id = models.UUIDField()
    execution_id = models.BigIntegerField(null=True)
    attempt = models.IntegerField(null=True)
    #: The occurrence a skipped event is about.
    scheduled_for = models.DateTimeField(null=True)
    detail = models.TextField(blank=True)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} of task {self.task_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  #: to be sent (again) at next_attempt_at
    DELIVERED = "delivered"
    FAILED = "failed"  #: failed for good (permanent error or attempts exhausted)


class Delivery(models.Model):
    """One message to one channel, sent at least once with the same idempotency key."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    rule = models.ForeignKey(Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    task = models.ForeignKey(
        "tasks_app.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    execution_id = models.BigIntegerField(null=True, blank=True)
    #: failing, recovered, retry, late, running_long, skipped, overdue, test.
    event = models.CharField(max_length=32)
    payload = models.JSONField(default=dict)
    #: sha256 of (channel, event source, rule): the same event never makes two deliveries, and
    #: the receiver sees the same key on every attempt (Idempotency-Key header / Message-ID).
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    #: A claim: the sender holding ``lease_token`` may send until ``lease_until``; after it, the
    #: dispatcher hands the delivery to another sender (a killed worker loses nothing).
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=32, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=Q(status="pending"), name="delivery_due_idx"),
            models.Index(fields=["channel", "-id"], name="delivery_channel_idx"),
            models.Index(fields=["task", "-id"], name="delivery_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event} -> {self.channel_id} ({self.status})"


class DigestItem(models.Model):
    """A notification of a digest rule, waiting for its window to end (``delivery`` null) or
    sent in the digest ``delivery``. Kept after sending: its unique key stops the same event
    (a periodic check seeing the same long run again) from being collected twice."""

    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="digest_items")
    #: The key the notification would have been delivered under (:func:`dispatch.delivery_key`).
    key = models.CharField(max_length=64, unique=True)
    task = models.ForeignKey(
        "tasks_app.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    event = models.CharField(max_length=32)
    payload = models.JSONField(default=dict)
    at = models.DateTimeField(db_default=Now())
    #: When its window ends: the digest is sent at (or, in quiet hours, after) this instant.
    due_at = models.DateTimeField()
    delivery = models.ForeignKey(Delivery, null=True, blank=True, on_delete=models.CASCADE, related_name="items")

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["due_at"], condition=Q(delivery__isnull=True), name="digestitem_open_idx"),
            models.Index(fields=["rule", "due_at"], condition=Q(delivery__isnull=True), name="digestitem_rule_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event} for rule {self.rule_id} (due {self.due_at})"


class RuleState(models.Model):
    """Storm suppression: what a rule last said about a task, so it speaks on changes only."""

    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="states")
    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="+", db_index=False)
    failing = models.BooleanField(default=False)
    #: Final failures since the task started failing (reported with "recovered").
    failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    #: The dead man's switch fired and no success came since.
    overdue = models.BooleanField(default=False)
    #: Workflow runs of this (root) task: one failed and none succeeded since ("workflow_failed"
    #: told once, "workflow_recovered" when one succeeds); the failed runs counted meanwhile, and
    #: the latest of them (a run's several step ends count it once).
    workflow_failing = models.BooleanField(default=False)
    workflow_failures = models.PositiveIntegerField(default=0)
    workflow_failed_run = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "rule"], name="rulestate_unique")]

    def __str__(self) -> str:
        return f"rule {self.rule_id} on task {self.task_id}: {'failing' if self.failing else 'ok'}"
