"""The back office's notifications page: channels (state, "send test") and the delivery log.

Channels and rules are created through the API or the admin (both through
:mod:`notifications.services`); this page shows them and sends tests through the same service.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from notifications.models import Channel, Delivery, DeliveryStatus, Rule
from notifications.services import channel_send_test
from tasks_app.roles import may_act_for
from tms_core.form_errors import SERVICE_ERRORS, exception_messages

#: Rows of the delivery log per page (keyset on id: ``?before=<id>``).
LOG_PAGE = 50


def visible_channels(user: Any) -> QuerySet[Channel]:
    """The owner's channels (all for staff), as in the API."""
    return Channel.objects.all() if user.is_staff else Channel.objects.filter(owner=user)


def task_rules(task: Any) -> tuple[list[Rule], bool]:
    """The rules that speak for ``task`` and whether they are its owner's defaults."""
    own = list(Rule.objects.filter(task=task).select_related("channel"))
    if own:
        return own, False
    return list(Rule.objects.filter(owner_id=task.owner_id, task__isnull=True).select_related("channel")), True


@login_required
def notifications_page(request: HttpRequest) -> HttpResponse:
    channels = visible_channels(request.user).order_by("name", "id")
    log = Delivery.objects.filter(channel__in=channels).select_related("channel", "task").order_by("-id")
    channel = request.GET.get("channel")
    if channel and channel.isdigit():
        log = log.filter(channel_id=int(channel))
    status = request.GET.get("status")
    if status in DeliveryStatus.values:
        log = log.filter(status=status)
    before = request.GET.get("before")
    if before and before.isdigit():
        log = log.filter(id__lt=int(before))
    rows = list(log[: LOG_PAGE + 1])
    more = len(rows) > LOG_PAGE
    rows = rows[:LOG_PAGE]
    context = {
        "channels": channels,
        "deliveries": rows,
        "next_before": rows[-1].pk if more and rows else None,
        "statuses": DeliveryStatus.values,
        "status": status or "",
        "channel": channel or "",
    }
    return render(request, "backoffice/notifications.html", context)


@login_required
@require_POST
def channel_test_view(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(visible_channels(request.user), pk=pk)
    if not may_act_for(request.user, channel.owner_id, "notifications.change_channel"):
        # Staff read every channel but send on another owner's behalf only with the permission (as the API).
        raise PermissionDenied("You may read another owner's channels but not send through them.")
    try:
        delivery = channel_send_test(channel=channel)
    except SERVICE_ERRORS as exc:
        for message in exception_messages(exc):
            messages.error(request, message)
    else:
        messages.success(
            request, f"Test queued for {channel.name} (delivery {delivery.pk}): the log below shows how it went."
        )
    return redirect("backoffice:notifications")
