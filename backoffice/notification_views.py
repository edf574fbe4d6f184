"""The back office's notifications: channels and rules created, edited, tested and deleted from
the notifications page (rules from a task's page too), and the delivery log.

Every write validates with the API's serializer (the same rules and messages as
``/api/v1/notification-channels`` and ``/notification-rules``) and calls the same service
(:mod:`notifications.services`); errors land on the form's fields. Who may act follows the API:
channels and rules belong to teams; a member sees their teams' (staff see all), an editor of the
team creates, changes, tests and deletes them; staff change another team's only with the model
permission (:func:`tasks_app.teams.may`). The buttons show what the role allows, and each POST
checks it again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from backoffice.forms import ChannelForm, RuleForm
from backoffice.keyset import BadCursor, keyset_page
from backoffice.rules import may_act_on, rule_rows, rule_words
from backoffice.scope import task_or_404
from backoffice.views import task_context, team_switch
from notifications import services
from notifications.models import Channel, ChannelKind, Delivery, DeliveryStatus, Rule
from notifications.serializers import ChannelSerializer, RuleSerializer
from notifications.services import channel_send_test
from tasks_app import teams
from tasks_app.models import TeamRole
from tms_core.auth import request_user
from tms_core.errors import RoleRequired
from tms_core.form_errors import flash_outcome, save_validated

#: Rows of the delivery log per page (keyset pages on the id, newest first: backoffice.keyset).
LOG_PAGE = 50


def visible_channels(user: Any) -> QuerySet[Channel]:
    """The channels of the user's teams (all for staff), as in the API, each with the user's role
    in its team (``caller_role``)."""
    return teams.with_role(teams.scope_to_teams(Channel.objects.all(), user), user)


def visible_rules(user: Any) -> QuerySet[Rule]:
    """The rules of the user's teams (all for staff), each with ``caller_role``."""
    return teams.with_role(teams.scope_to_teams(Rule.objects.all(), user), user)


def _to_change(user: Any, queryset: QuerySet, pk: int, verb: str = "change") -> Any:
    """The channel or rule ``user`` acts on: 404 if they may not see it, 403 if their role in its
    team is below editor (and they lack the model permission)."""
    obj = get_object_or_404(queryset, pk=pk)
    if not may_act_on(user, obj, verb):
        held = getattr(obj, "caller_role", None)
        if held is None:
            raise RoleRequired("You may look at this but not change it.", role=TeamRole.EDITOR, held=None)
        raise RoleRequired(
            f"Your role in this team is {held}: to change its notification channels and rules you need editor "
            "or higher.",
            role=TeamRole.EDITOR,
            held=held,
        )
    return obj


def _context(request: HttpRequest) -> dict[str, Any]:
    return {"request": request}


def _editor_team_ids(user: Any) -> Any:
    return teams.teams_with_role(user, TeamRole.EDITOR).values("pk")


def page_context(request: HttpRequest, **forms: Any) -> dict[str, Any]:
    channels, team, _ = team_switch(request, visible_channels(request.user))
    channels = channels.select_related("owner", "team").order_by("name", "id")
    log = Delivery.objects.filter(channel__in=channels).select_related("channel", "task").order_by("-id")
    channel = request.GET.get("channel")
    if channel and channel.isdigit():
        log = log.filter(channel_id=int(channel))
    status = request.GET.get("status")
    if status in DeliveryStatus.values:
        log = log.filter(status=status)
    try:
        page = keyset_page(log, column=None, descending=True, cursor=request.GET.get("cursor"), size=LOG_PAGE)
    except BadCursor as exc:
        messages.error(request, str(exc))
        page = keyset_page(log, column=None, descending=True, cursor=None, size=LOG_PAGE)
    rules = visible_rules(request.user)
    if team:
        rules = rules.filter(team__slug=team)
    rules = rules.select_related("channel", "task", "owner", "team").order_by("task_id", "id")
    user = request_user(request)
    editor_teams = teams.teams_with_role(user, TeamRole.EDITOR).order_by("slug")
    return {
        "channels": [
            {
                "channel": c,
                "can_change": may_act_on(request.user, c, "change"),
                "can_delete": may_act_on(request.user, c, "delete"),
            }
            for c in channels
        ],
        "rules": rule_rows(rules[:500], request.user),
        "channel_form": forms.get("channel_form") or ChannelForm(initial={"timezone": "UTC"}, teams=editor_teams),
        "rule_form": forms.get("rule_form") or RuleForm(team_ids=_editor_team_ids(user), initial={"enabled": True}),
        "has_own_channels": Channel.objects.filter(team__in=editor_teams).exists(),
        "team": team,
        "teams": teams.visible_teams(request.user),
        "deliveries": page.rows,
        "page": page,
        "descending": True,
        "keep": urlencode(
            {key: value for key, value in (("status", status), ("channel", channel), ("team", team)) if value}
        ),
        "statuses": DeliveryStatus.values,
        "status": status or "",
        "channel": channel or "",
    }


def _edit_page(request: HttpRequest, form: ChannelForm | RuleForm, what: str, obj: Any, **more: Any) -> HttpResponse:
    """The edit page of a channel or a rule (``what``): 400 when it shows a refused POST."""
    context = {what: obj, "form": form, "what": what, **more}
    return render(request, "backoffice/notification_edit.html", context, status=400 if form.is_bound else 200)


@login_required
def notifications_page(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/notifications.html", page_context(request))


def _save_channel(request: HttpRequest, form: ChannelForm, channel: Channel | None) -> Channel | None:
    """Validate ``form`` with the API's serializer and save through the service; None (errors on
    the form) when refused."""
    if not form.is_valid():
        return None
    user = request_user(request)
    serializer = ChannelSerializer(
        channel, data=form.api_input(), partial=channel is not None, context=_context(request)
    )
    if channel is None:

        def create(data: dict[str, Any]) -> Channel:
            data = dict(data)
            team = data.pop("team", None)
            return services.channel_create(owner=user, data=data, team=team)

        return save_validated(form, serializer, create)
    return save_validated(form, serializer, lambda data: services.channel_update(channel=channel, data=data))


@login_required
@require_POST
def channel_create_view(request: HttpRequest) -> HttpResponse:
    form = ChannelForm(request.POST, teams=teams.teams_with_role(request_user(request), TeamRole.EDITOR))
    channel = _save_channel(request, form, None)
    if channel is None:
        return render(request, "backoffice/notifications.html", page_context(request, channel_form=form), status=400)
    messages.success(request, f"Channel {channel.name} created.")
    if channel.kind == ChannelKind.WEBHOOK:
        # Handed out once, as by the API: stored encrypted, masked from now on.
        messages.info(request, f"Signing secret of {channel.name} (shown this once; X-TMS-Signature): {channel.secret}")
    return redirect("backoffice:notifications")


@login_required
@require_http_methods(["GET", "POST"])
def channel_edit_view(request: HttpRequest, pk: int) -> HttpResponse:
    channel = _to_change(request.user, visible_channels(request.user), pk)
    form = ChannelForm(request.POST or None, initial=ChannelForm.initial_for(channel))
    if request.method == "POST" and _save_channel(request, form, channel) is not None:
        messages.success(request, f"Channel {channel.name} saved.")
        return redirect("backoffice:notifications")
    return _edit_page(request, form, "channel", channel)


@login_required
@require_POST
def channel_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    channel = _to_change(request.user, visible_channels(request.user), pk, "delete")
    services.channel_delete(channel=channel)
    messages.success(request, f"Channel {channel.name} deleted, with its rules.")
    return redirect("backoffice:notifications")


def _save_rule(request: HttpRequest, form: RuleForm, rule: Rule | None) -> Rule | None:
    """As :func:`_save_channel`, for a rule (a new one goes in its channel's team)."""
    if not form.is_valid():
        return None
    serializer = RuleSerializer(rule, data=form.api_input(), context=_context(request))
    user = request_user(request)
    if rule is None:
        return save_validated(form, serializer, lambda data: services.rule_create(owner=user, data=data))
    return save_validated(form, serializer, lambda data: services.rule_update(rule=rule, data=data))


def _back(request: HttpRequest) -> HttpResponse:
    """Back where the person was: the task's page when they came from it, else the notifications page."""
    task = request.POST.get("from_task")
    if task:
        return redirect("backoffice:task", pk=task)
    return redirect("backoffice:notifications")


@login_required
@require_POST
def rule_create_view(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    fixed = task_or_404(request.user, request.POST["from_task"]) if request.POST.get("from_task") else None
    if fixed is not None:
        teams.require(user, fixed.team_id, TeamRole.EDITOR, "notifications.add_rule", what="this task's rules")
    team_ids = [fixed.team_id] if fixed is not None else _editor_team_ids(user)
    form = RuleForm(request.POST, team_ids=team_ids, fixed_task=fixed)
    rule = _save_rule(request, form, None)
    if rule is None:
        if fixed is not None:
            context = task_context(request, fixed, rule_form=form)
            return render(request, "backoffice/task_detail.html", context, status=400)
        return render(request, "backoffice/notifications.html", page_context(request, rule_form=form), status=400)
    messages.success(request, f"Rule added: to {rule.channel.name} when {rule_words(rule)}.")
    return _back(request)


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit_view(request: HttpRequest, pk: int) -> HttpResponse:
    rule = _to_change(request.user, visible_rules(request.user).select_related("owner"), pk)
    form = RuleForm(request.POST or None, team_ids=[rule.team_id], initial=RuleForm.initial_for(rule), rule=rule)
    if request.method == "POST" and _save_rule(request, form, rule) is not None:
        messages.success(request, f"Rule saved: to {rule.channel.name} when {rule_words(rule)}.")
        return _back(request)
    from_task = request.POST.get("from_task") or request.GET.get("from_task", "")
    return _edit_page(request, form, "rule", rule, from_task=from_task)


@login_required
@require_POST
def rule_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    rule = _to_change(request.user, visible_rules(request.user), pk, "delete")
    services.rule_delete(rule=rule)
    messages.success(request, "Rule deleted.")
    return _back(request)


@login_required
@require_POST
def channel_test_view(request: HttpRequest, pk: int) -> HttpResponse:
    # A test sends through the channel: its team's editors (staff only with the permission, as the API).
    channel = _to_change(request.user, visible_channels(request.user), pk)
    flash_outcome(
        request,
        lambda: channel_send_test(channel=channel),
        lambda delivery: f"Test queued for {channel.name} (delivery {delivery.pk}): the log below shows how it went.",
    )
    return redirect("backoffice:notifications")
