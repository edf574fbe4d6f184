"""API shapes of channels, rules and deliveries."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from notifications.models import Channel, ChannelKind, Delivery, Rule
from tasks_app.models import Task, TaskStatus
from tasks_app.teams import member_team_ids
from teams_api.scope import TeamRefField, team_field
from tms_core.api.base import ClockTimeField, StrictInputMixin
from tms_core.durations import DurationField


class NoReadOnlyInput(StrictInputMixin):
    """Refuses values for read-only fields too (DRF ignores them silently: a request setting
    ``secret`` or ``state`` would "succeed" and change nothing)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            fixed = {
                key: ["This field cannot be changed."]
                for key in data
                if getattr(self.fields.get(key), "read_only", False)
            }
            if fixed:
                raise serializers.ValidationError(fixed)
        return super().to_internal_value(data)


class ChannelSerializer(NoReadOnlyInput, serializers.ModelSerializer):
    """A channel. ``secret`` (webhooks) is the key of the X-TMS-Signature header's HMAC: shown in
    the answer that created (or regenerated) it, masked in every other answer, to everyone.
    ``target`` is shown masked (a Slack URL as its host; a webhook URL without its password or
    secret-named query values); sending the masked value back keeps the stored one."""

    team = team_field("the channel")
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    target = serializers.CharField(max_length=500)
    quiet_from = ClockTimeField(
        required=False, allow_null=True, help_text='Start of the quiet hours in `timezone`, e.g. "22:00".'
    )
    quiet_to = ClockTimeField(required=False, allow_null=True, help_text='End of the quiet hours, e.g. "06:30".')

    def to_representation(self, instance: Channel) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["target"] = instance.shown_target()
        # The view sets ``reveal_secret`` in the one answer that hands the secret out.
        data["secret"] = instance.secret if self.context.get("reveal_secret") else instance.shown_secret()
        return data

    class Meta:
        model = Channel
        fields = [
            "id", "team", "name", "kind", "target", "secret", "quiet_from", "quiet_to", "timezone", "failing_after",
            "state", "failed_attempts", "failures_since", "last_error", "failing_since", "created_at",
        ]  # fmt: skip
        read_only_fields = [
            "id", "secret", "state", "failed_attempts", "failures_since", "last_error", "failing_since", "created_at",
        ]  # fmt: skip
        # Business validation (target for the kind, private addresses) is the service's.


class OwnPrimaryKeyField(serializers.PrimaryKeyRelatedField):
    """A related object of one of the requesting user's teams only (another team's id reads as
    unknown; any with the permission to change rules); that it is of the rule's own team is the
    service's check."""

    def get_queryset(self) -> Any:
        request = self.context.get("request")
        queryset = super().get_queryset()
        assert queryset is not None
        if request is None:
            return queryset.none()
        if request.user.has_perm("notifications.change_rule"):
            # Staff granted the permission edit any team's rule (the admin's rule); the service
            # still holds the channel and the task to the rule's team.
            return queryset
        return queryset.filter(team_id__in=member_team_ids(request.user))


class RuleSerializer(NoReadOnlyInput, serializers.ModelSerializer):
    """A rule: ``task`` null makes it the team's default for every task of the team without rules
    of its own."""

    team = TeamRefField(
        required=False,
        help_text="The team it belongs to, by slug or id (default: its channel's team; you need the editor role "
        "there). Its channel and task must be of the team; it speaks for the team's tasks only.",
    )
    task = OwnPrimaryKeyField(
        queryset=Task.objects.exclude(status=TaskStatus.DELETED), allow_null=True, required=False, default=None
    )
    channel = OwnPrimaryKeyField(queryset=Channel.objects.all())
    late_after = DurationField(required=False, allow_null=True, default=None)
    running_longer_than = DurationField(required=False, allow_null=True, default=None)
    no_success_within = DurationField(required=False, allow_null=True, default=None)
    #: Digest mode: one summary message per window of this length instead of one per event.
    digest_every = DurationField(required=False, allow_null=True, default=None)

    class Meta:
        model = Rule
        fields = [
            "id", "team", "task", "channel", "enabled", "on_failure", "on_retry", "on_recovery", "on_skip",
            "late_after", "running_longer_than", "no_success_within", "digest_every", "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = Delivery
        fields = [
            "id", "channel", "rule", "task", "execution_id", "event", "payload", "idempotency_key", "status",
            "attempts", "next_attempt_at", "last_error", "created_at", "delivered_at",
        ]  # fmt: skip
        read_only_fields = fields
