"""``GET /api/v1/audit``: the audit log, newest first, cursor-paginated."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets

from executions.api import UtcDateTimeFilter
from tasks_app.audit_scope import audit_visible
from tasks_app.models import AuditEntry, Task
from teams_api.scope import TEAM_FILTER_HELP, filter_by_team
from tms_core.api.base import OwnerScopedMixin, StrictFilterSet
from tms_core.api.keyset import KeysetPagination, Segment


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="Who acted (username, or the command's user).")
    owner: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Owner of the object acted on."
    )
    source = serializers.CharField(  # type: ignore[assignment]  # the model field, not DRF's Field.source
        help_text="api, admin, backoffice, command:<name> or system."
    )
    changes = serializers.JSONField(
        help_text='What changed: {"field": {"from": ..., "to": ...}} for an update (secrets masked); '
        "the values given for other actions."
    )

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "source",
            "remote_addr",
            "action",
            "object_type",
            "object_id",
            "task_id",
            "owner",
            "changes",
            "detail",
        ]
        read_only_fields = fields


class AuditFilter(StrictFilterSet):
    task = filters.UUIDFilter(field_name="task_id", help_text="Only entries about this task (and its executions).")
    user = filters.CharFilter(field_name="actor_name", help_text="Only entries of this actor (username).")
    action = filters.CharFilter(help_text="Only this action: create, update, delete, pause, resume, trigger, ...")
    object_type = filters.CharFilter(help_text="Only entries about this kind of object: task, execution, ...")
    since = UtcDateTimeFilter(field_name="at", lookup_expr="gte", help_text="Only entries at or after this.")
    until = UtcDateTimeFilter(field_name="at", lookup_expr="lt", help_text="Only entries before this.")
    team = filters.CharFilter(
        method="filter_team", help_text="Only entries about tasks of this team. " + TEAM_FILTER_HELP
    )

    def filter_team(self, queryset: QuerySet[AuditEntry], name: str, value: str) -> QuerySet[AuditEntry]:
        tasks = filter_by_team(Task.objects.all(), self.request, value)
        return queryset.filter(task_id__in=tasks.values("pk"))

    class Meta:
        model = AuditEntry
        fields = ["task", "user", "action", "object_type", "since", "until", "team"]


@extend_schema_view(
    list=extend_schema(
        summary="The audit log",
        description=(
            "Every user action on the tasks, runs, limits, calendars and channels of your teams as they are now "
            "(a member who left, or whose task moved away, no longer reads them), whoever acted, and on your own "
            "tokens (staff: everyone's): create, update (with a diff, secrets "
            "masked), delete, pause, resume, trigger, backfill, materialise, cancel, retry; who, when, from where "
            "(`api`, `admin`, `backoffice`, `command:<name>`) and the client address. Newest first; follow "
            "`next` to page."
        ),
    ),
    retrieve=extend_schema(summary="An audit entry"),
)
class AuditEntryViewSet(OwnerScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The audit log (read-only)."""

    queryset = AuditEntry.objects.select_related("owner")
    serializer_class = AuditEntrySerializer
    # The log only grows: keyset pages newest first by id (a page costs the same at any depth, no
    # count), the one paging of every list that grows (tms_core.api.keyset).
    pagination_class = KeysetPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = AuditFilter
    lookup_value_regex = r"[0-9]{1,18}"

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        """The entries about the tasks (and runs, limits, calendars, channels) of the caller's teams
        as they are now, whoever acted or created them, and about the caller's own account's
        objects (tokens): the history follows the team, not the creator (tasks_app.audit_scope)."""
        return audit_visible(queryset, self.request.user)

    def keyset_segments(self, queryset: QuerySet[AuditEntry], state: dict[str, Any]) -> list[Segment]:
        """The entries, newest first by id (KeysetPagination)."""
        return [Segment(sources=[queryset], column=None, descending=True)]
