"""The admin of notifications: channels and rules are edited through the services (the same
validation as the API); the delivery log is read-only; "send test" is an action on channels."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from executions.admin import ReadOnlyAdmin
from notifications import services
from notifications.models import Channel, Delivery, Rule
from tms_core.durations import DurationFormField
from tms_core.form_errors import SERVICE_ERRORS, exception_messages
from tms_core.service_forms import ServiceFormAdmin, ServiceModelForm


class ServiceForm(ServiceModelForm):
    """Validates and saves through the notification services while the form is validated, so a
    service's refusal becomes an error on the form's fields."""

    service_fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "team" in self.fields:
            self.fields["team"].required = False  # the services' default

    def service_data(self) -> dict[str, Any]:
        """The fields the services take, as the form has them."""
        return {name: self.cleaned_data[name] for name in self.service_fields if name in self.cleaned_data}

    def save_through_services(self) -> Any:
        data = self.service_data()
        if self.instance._state.adding:
            return self.service_create(owner=self.cleaned_data["owner"], data=data, team=self.cleaned_data.get("team"))
        return self.service_update(data)

    def service_create(self, *, owner: Any, data: dict[str, Any], team: Any) -> Any:
        """The service that makes a new row (``channel_create``, ``rule_create``)."""
        raise NotImplementedError

    def service_update(self, data: dict[str, Any]) -> Any:
        """The service that changes :attr:`instance`."""
        raise NotImplementedError


class ChannelForm(ServiceForm):
    service_fields = services.CHANNEL_FIELDS

    class Meta:
        model = Channel
        fields = ["owner", "team", *services.CHANNEL_FIELDS]
        help_texts = {
            "owner": "Who creates it (its e-mails count against this user's rate).",
            "team": "Its team (default: the owner's personal team); the owner must be an editor there.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            # Staff see the target masked, as in the API; sending the mask back keeps it.
            self.initial["target"] = self.instance.shown_target()

    def service_create(self, *, owner: Any, data: dict[str, Any], team: Any) -> Channel:
        return services.channel_create(owner=owner, data=data, team=team)

    def service_update(self, data: dict[str, Any]) -> Channel:
        return services.channel_update(channel=self.instance, data=data)


class RuleForm(ServiceForm):
    service_fields = services.RULE_FIELDS

    class Meta:
        model = Rule
        fields = ["owner", "team", *services.RULE_FIELDS]
        help_texts = {
            "team": "Its team (default: its channel's team); the owner must be an editor there, and the channel and "
            "the task must be of the team.",
        }

    def service_create(self, *, owner: Any, data: dict[str, Any], team: Any) -> Rule:
        return services.rule_create(owner=owner, data=data, team=team)

    def service_update(self, data: dict[str, Any]) -> Rule:
        return services.rule_update(rule=self.instance, data=data)


class ServiceDeleteAdmin(ServiceFormAdmin):
    """Deletes a row, or each row of a selection, through its service (which also removes what
    depends on it), never the ORM's delete."""

    def service_delete(self, obj: Any) -> None:
        raise NotImplementedError

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.service_delete(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for obj in queryset:
            self.service_delete(obj)


@admin.register(Channel)
class ChannelAdmin(ServiceDeleteAdmin):
    form = ChannelForm
    list_display = ["name", "kind", "shown_target", "team", "owner", "state", "failing_since", "failed_attempts"]
    list_filter = ["kind", "state", ("team", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["team", "owner"]
    # Not the target: it is encrypted at rest (and a Slack URL is a credential staff never see).
    search_fields = ["name", "owner__username", "team__slug"]
    # Pick the owner by name (a raw id box asked for a number).
    autocomplete_fields = ["owner"]
    actions = ["send_test"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Not on the add form: a row not yet saved has no state, and created_at is the database's
        # default (it read "<django.db.models.expressions.DatabaseDefault object at 0x...>").
        if obj is None:
            return []
        # A channel stays in its team (its rules and the team's tasks use it).
        return ["team", "state", "failed_attempts", "failures_since", "last_error", "failing_since", "created_at"]

    @admin.display(description="target")
    def shown_target(self, obj: Channel) -> str:
        return obj.shown_target()

    def service_delete(self, obj: Channel) -> None:
        services.channel_delete(channel=obj)

    # A test sends on the owner's behalf: for those who may change channels, not for viewers.
    @admin.action(description="Send a test message", permissions=["change"])
    def send_test(self, request: HttpRequest, queryset: QuerySet) -> None:
        for channel in queryset[:50]:
            try:
                delivery = services.channel_send_test(channel=channel)
            except SERVICE_ERRORS as exc:
                self.message_user(request, f"{channel}: {' '.join(exception_messages(exc))}", messages.WARNING)
                continue
            self.message_user(
                request, f"{channel}: test queued (delivery {delivery.pk}; the delivery log says how it went)"
            )


@admin.register(Rule)
class RuleAdmin(ServiceDeleteAdmin):
    form = RuleForm
    list_display = [
        "id", "team", "owner", "task", "channel", "enabled", "on_failure", "on_recovery", "on_retry", "on_skip",
        "digest_every",
    ]  # fmt: skip
    list_filter = ["enabled", ("team", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["team", "owner", "channel"]
    # Picked by name; the services refuse a task or channel of another team than the rule's, on its field.
    autocomplete_fields = ["owner", "task", "channel"]
    # Durations in the API's syntax ("1h", "2m"): Django's own field wanted "01:00:00".
    formfield_overrides = {models.DurationField: {"form_class": DurationFormField}}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["team", "created_at"]

    def service_delete(self, obj: Rule) -> None:
        services.rule_delete(rule=obj)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: written by the dispatcher only."""

    list_display = ["id", "event", "channel", "task", "status", "attempts", "next_attempt_at", "created_at"]
    list_filter = ["status", "event"]
    search_fields = ["=idempotency_key", "channel__name"]
    show_full_result_count = False
