"""Channel and rule writes, and "send a test". The API, the admin and the back office call these.

Business rules live here: a target fit for the channel's kind (an http(s) URL the private-address
guard lets through, or an e-mail address), a rule only over a channel and a task of the rule's
own team, at least one event per rule. Channels and rules belong to teams: a create needs the
editor role in the team it names (default: the creator's personal team; for a rule, its
channel's team). Bad input raises :class:`tms_core.errors.InvalidInput`.
"""

from __future__ import annotations

import copy
import ipaddress
import math
import secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator, validate_email
from django.db import connection, transaction
from django.db.models import F

from notifications import dispatch, senders
from notifications.models import (
    DEFAULT_FAILING_AFTER,
    MAX_FAILING_AFTER,
    Channel,
    ChannelKind,
    ChannelState,
    Delivery,
    Rule,
)
from runners.netguard import literal_ip, normalise_host
from tasks_app.audit import audit_diff, audit_record
from tasks_app.masking import MASK
from tasks_app.models import Task, TaskStatus, Team
from tasks_app.quotas import rate_take
from tasks_app.schedules import ScheduleError, validate_timezone
from tasks_app.secrets import SecretsUnavailable, text_rotate
from tasks_app.teams.services import team_for_new
from tms_core.errors import InvalidInput, QuotaExceeded

CHANNEL_FIELDS = ("name", "kind", "target", "quiet_from", "quiet_to", "timezone", "failing_after")
RULE_FIELDS = (
    "task",
    "channel",
    "enabled",
    "on_failure",
    "on_retry",
    "on_recovery",
    "on_skip",
    "late_after",
    "running_longer_than",
    "no_success_within",
    "digest_every",
)
EVENT_FLAGS = ("on_failure", "on_retry", "on_recovery", "on_skip")
EVENT_DURATIONS = ("late_after", "running_longer_than", "no_success_within")
#: Test messages one owner may ask for: (count, seconds), over all their channels. A test sends
#: at once on the owner's word, to a target of their choice: never a relay (e-mails also count
#: against the e-mail runner's per-owner rate when they are sent).
TEST_RATE = (10, 60.0)
TEST_RATE_KIND = "notify-test"
#: The shortest and longest digest window a rule may ask for.
DIGEST_MIN, DIGEST_MAX = timedelta(seconds=10), timedelta(days=7)


def _channel_snapshot(channel: Channel) -> dict[str, Any]:
    """A channel's audited fields as people see them: never its signing secret, its target
    masked as everywhere (a Slack URL is the credential)."""
    values = {name: getattr(channel, name) for name in CHANNEL_FIELDS}
    values["target"] = channel.shown_target()
    return values


def _channel_diff(before: Channel, before_values: dict[str, Any], after: Channel) -> dict[str, Any]:
    """The audited change of a channel; a masked target that changed reads "******** (changed)"."""
    changes = audit_diff(before_values, _channel_snapshot(after))
    if before.target != after.target and "target" not in changes:
        changes["target"] = {"from": before_values["target"], "to": f"{MASK} (changed)"}
    return changes


def _rule_snapshot(rule: Rule) -> dict[str, Any]:
    values = {name: getattr(rule, name) for name in RULE_FIELDS if name not in ("task", "channel")}
    return {**values, "task": str(rule.task_id) if rule.task_id else None, "channel": rule.channel_id}


def _audit(action: str, obj: Channel | Rule, changes: dict[str, Any], detail: str = "") -> None:
    task_id = obj.task_id if isinstance(obj, Rule) else None
    object_type = "rule" if isinstance(obj, Rule) else "channel"
    audit_record(
        action=f"{object_type}.{action}",
        object_type=object_type,
        object_id=obj.pk,
        owner=obj.owner_id,
        task_id=task_id,
        changes=changes,
        detail=detail,
    )


def _target_errors(kind: str, target: str) -> list[str]:
    if kind == ChannelKind.EMAIL:
        try:
            validate_email(target)
        except DjangoValidationError:
            return ["Enter a valid e-mail address."]
        refusal = senders.recipient_refusal(target)
        return [refusal] if refusal else []
    try:
        URLValidator(schemes=["http", "https"])(target)
    except DjangoValidationError:
        return ["Enter a valid http(s) URL."]
    host = urlsplit(target).hostname or ""
    ip = literal_ip(host)
    if ip is None and normalise_host(host) == "localhost":
        ip = ipaddress.IPv4Address("127.0.0.1")
    # The same guard as the http runner (host names are checked again when connecting).
    if ip is not None and (reason := senders.address_policy().refusal(host, ip)) is not None:
        return [f"This address is not reachable from TMS: {reason}."]
    return []


def _check_channel(values: Mapping[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    if not str(values.get("name") or "").strip():
        errors["name"] = ["This field may not be blank."]
    kind = values.get("kind")
    if kind not in ChannelKind.values:
        errors["kind"] = [f"Unknown channel kind {kind!r}; choose one of: {', '.join(ChannelKind.values)}."]
    elif problems := _target_errors(kind, str(values.get("target") or "")):
        errors["target"] = problems
    try:
        validate_timezone(values.get("timezone") or "UTC")
    except ScheduleError as exc:
        errors["timezone"] = [str(exc)]
    failing_after = values.get("failing_after", DEFAULT_FAILING_AFTER)
    if (
        isinstance(failing_after, bool)
        or not isinstance(failing_after, int)
        or not 1 <= failing_after <= MAX_FAILING_AFTER
    ):
        errors["failing_after"] = [f"Must be a whole number from 1 to {MAX_FAILING_AFTER} (failed attempts in a row)."]
    if (values.get("quiet_from") is None) != (values.get("quiet_to") is None):
        errors["quiet_to" if values.get("quiet_to") is None else "quiet_from"] = [
            "Give both ends of the quiet hours, or neither."
        ]
    if errors:
        raise InvalidInput(errors)


def channel_create(*, owner: User, data: Mapping[str, Any], team: Team | None = None) -> Channel:
    """Create a channel of ``team`` (default: ``owner``'s personal team; ``owner`` needs the
    editor role in it, else PermissionDenied), recorded as created by ``owner``. A webhook
    channel gets a fresh signing secret (the caller hands it out once; it is stored encrypted
    and shown masked from then on)."""
    team = team_for_new(owner, team, permission="notifications.add_channel", what="this team's notification channels")
    values = {
        "timezone": "UTC",
        "failing_after": DEFAULT_FAILING_AFTER,
        **{k: data[k] for k in CHANNEL_FIELDS if k in data},
    }
    _check_channel(values)
    secret = secrets.token_hex(32) if values["kind"] == ChannelKind.WEBHOOK else ""
    with transaction.atomic():
        channel = Channel.objects.create(owner=owner, team=team, secret=secret, **values)
        _audit("create", channel, _channel_snapshot(channel))
    return channel


def channel_update(*, channel: Channel, data: Mapping[str, Any]) -> Channel:
    """Change a channel's fields (the kind included: a webhook gains a secret if it had none).

    A ``target`` equal to the masked one people are shown (:meth:`Channel.shown_target`) keeps
    the stored target: a form or client sending back what it read changes nothing."""
    values = {k: getattr(channel, k) for k in CHANNEL_FIELDS} | {k: data[k] for k in CHANNEL_FIELDS if k in data}
    kept = "target" not in data
    if values["target"] == channel.shown_target() and MASK in values["target"]:
        values["target"] = channel.target
        kept = True
    if kept and values["kind"] != channel.kind and MASK in channel.shown_target():
        # Another kind would show what this one hides (a Slack URL is the credential): a stored
        # secret is never shown again, to anyone, so the target must come with the change.
        raise InvalidInput.on(
            "target",
            "Send the target again to change the kind: the stored one holds a secret, which is never shown again.",
        )
    _check_channel(values)
    before, before_values = copy.copy(channel), _channel_snapshot(channel)
    for key, value in values.items():
        setattr(channel, key, value)
    if channel.kind == ChannelKind.WEBHOOK and not channel.secret:
        channel.secret = secrets.token_hex(32)
    with transaction.atomic():
        # Only what was edited: the state and failure counts are the senders' (a full save from
        # this copy would put back counts that senders changed meanwhile).
        channel.save(update_fields=[*CHANNEL_FIELDS, "secret"])
        # A rule made stricter applies at once to the failures already counted.
        Channel.objects.filter(
            pk=channel.pk, state=ChannelState.OK, failed_attempts__gte=F("failing_after"), failed_attempts__gt=0
        ).update(state=ChannelState.FAILING, failing_since=F("failures_since"))
        _audit("update", channel, _channel_diff(before, before_values, channel))
    channel.refresh_from_db()
    return channel


def channel_rotate_secret(*, channel: Channel) -> Channel:
    """A new webhook signing secret (the old one stops verifying at once); the caller hands it
    to the owner once, as at creation."""
    if channel.kind != ChannelKind.WEBHOOK:
        raise InvalidInput({"kind": ["Only webhook channels have a signing secret."]})
    channel.secret = secrets.token_hex(32)
    with transaction.atomic():
        channel.save(update_fields=["secret"])
        _audit("rotate_secret", channel, {}, detail="new webhook signing secret")
    return channel


def channel_delete(*, channel: Channel) -> None:
    """Delete a channel, its rules and its delivery log."""
    with transaction.atomic():
        _audit("delete", channel, _channel_snapshot(channel))
        channel.delete()


def channel_send_test(*, channel: Channel) -> Delivery:
    """Queue a test message through ``channel`` and return its delivery, still pending: a sender
    on the notification queue (TMS_NOTIFY_QUEUE) sends it within TMS_NOTIFY_TIMEOUT, and the
    delivery log says how it went (delivered, or retried and failed like any other delivery).
    Never sent in the caller's process: a target that answers slowly would hold a web worker."""
    from notifications.tasks import notify_deliver  # the Celery task module imports dispatch

    wait = rate_take(owner_id=channel.owner_id, kind=TEST_RATE_KIND, limit=TEST_RATE[0], window=TEST_RATE[1])
    if wait:
        raise QuotaExceeded(
            f"quota: at most {TEST_RATE[0]} test messages per minute. Try again in {math.ceil(wait)} s.",
            retry_after=math.ceil(wait),
        )
    with transaction.atomic():
        delivery, token = dispatch.queue_test(channel)
        transaction.on_commit(lambda: notify_deliver.delay(delivery.pk, token))
    return delivery


def _check_rule(team_id: int, values: dict[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    channel = values.get("channel")
    if not isinstance(channel, Channel) or channel.team_id != team_id:
        errors["channel"] = ["No such channel in the rule's team."]
    task = values.get("task")
    foreign = not isinstance(task, Task) or task.team_id != team_id or task.status == TaskStatus.DELETED
    if task is not None and foreign:
        errors["task"] = ["No such task in the rule's team."]
    for name in EVENT_DURATIONS:
        value = values.get(name)
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            errors[name] = ["Must be a positive duration."]
    digest = values.get("digest_every")
    if digest is not None and (not isinstance(digest, timedelta) or not DIGEST_MIN <= digest <= DIGEST_MAX):
        errors["digest_every"] = ["Must be a duration from 10s to 7d (or null: send each notification at once)."]
    if not any(values.get(flag) for flag in EVENT_FLAGS) and all(values.get(d) is None for d in EVENT_DURATIONS):
        errors["non_field_errors"] = [
            "Choose at least one event: on_failure, on_retry, on_recovery, on_skip, late_after, "
            "running_longer_than or no_success_within."
        ]
    if errors:
        raise InvalidInput(errors)


def rule_create(*, owner: User, data: Mapping[str, Any], team: Team | None = None) -> Rule:
    """Create a rule of ``team`` for one of the team's tasks, or (no task) a default for every task
    of the team without rules of its own; recorded as created by ``owner``, who needs the editor
    role in the team (else PermissionDenied). ``team`` defaults to the channel's team (the
    creator's personal team without a channel); the channel and the task must be of the team."""
    values = {k: data[k] for k in RULE_FIELDS if k in data}
    channel = values.get("channel")
    if team is None and isinstance(channel, Channel):
        team = channel.team
    team = team_for_new(owner, team, permission="notifications.add_rule", what="this team's notification rules")
    _check_rule(team.pk, values)
    with transaction.atomic():
        rule = Rule.objects.create(owner=owner, team=team, **values)
        _audit("create", rule, _rule_snapshot(rule))
    return rule


def rule_update(*, rule: Rule, data: Mapping[str, Any]) -> Rule:
    """Change a rule. Its storm state is kept (a failing task stays known as failing)."""
    values = {k: getattr(rule, k) for k in RULE_FIELDS} | {k: data[k] for k in RULE_FIELDS if k in data}
    _check_rule(rule.team_id, values)
    before = _rule_snapshot(rule)
    with transaction.atomic():
        for key, value in values.items():
            setattr(rule, key, value)
        rule.save()
        _audit("update", rule, audit_diff(before, _rule_snapshot(rule)))
    return rule


def rule_delete(*, rule: Rule) -> None:
    """Delete a rule (its deliveries stay in the log)."""
    with transaction.atomic():
        _audit("delete", rule, _rule_snapshot(rule))
        rule.delete()


def rotate_channel_secrets(batch: int) -> tuple[int, int, list[str]]:
    """Re-encrypt every channel's target and signing secret with the first key of
    ``TMS_SECRET_KEYS`` (``manage.py tms_rotate_keys`` calls this): (channels, values, ids of
    channels no key opens). Reads and writes the stored tokens as they are, in batches of locked
    rows; nothing is decrypted outside :func:`tasks_app.secrets.text_rotate`."""
    table = connection.ops.quote_name(Channel._meta.db_table)
    rows = values = 0
    failed: list[str] = []
    last = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
            cursor.execute(
                f"SELECT id, target, secret FROM {table} WHERE id > %s ORDER BY id LIMIT %s{lock}",  # noqa: S608
                [last, batch],
            )
            found = cursor.fetchall()
            for pk, target, secret in found:
                try:
                    new = [text_rotate(target), text_rotate(secret)]
                except SecretsUnavailable:
                    failed.append(str(pk))
                    continue
                cursor.execute(f"UPDATE {table} SET target = %s, secret = %s WHERE id = %s", [*new, pk])  # noqa: S608
                rows += 1
                values += sum(1 for value in (target, secret) if value)
        if len(found) < batch:
            break
        last = found[-1][0]
    return rows, values, failed
