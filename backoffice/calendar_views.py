"""The back office's business calendars: the list with a new calendar's form, and each calendar's
page (what it closes, its next closed days, the tasks using it, its edit form and deletion).

Every write validates with the API's serializer (:class:`tasks_api.calendars_api.CalendarSerializer`,
the rules and messages of ``/api/v1/calendars``) and calls the API's service
(:mod:`tasks_api.calendars`: a change of what a calendar closes re-plans the tasks using it);
errors land on the form's fields. Members of a team see its calendars, its editors create,
change and delete them (or the model permission, :func:`tasks_app.teams.may`); the buttons show
what the role allows and each POST checks it again (403).
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from backoffice.team_objects import TeamObjectForm, editor_may, editor_required, list_context, parsed_field
from tasks_api.calendars import CALENDAR_FIELDS, calendar_closed_days, calendar_create, calendar_delete, calendar_update
from tasks_api.calendars_api import CalendarSerializer
from tasks_api.selectors import task_preview
from tasks_app.calendars import WEEKDAY_NAMES, supported_countries
from tasks_app.models import Calendar, Task, TaskStatus
from tasks_app.teams import scope_to_teams, with_role
from tms_core.auth import request_user
from tms_core.form_errors import SERVICE_ERRORS, flash_outcome, save_validated

#: Rows the list shows (teams hold a handful; a page never renders without bound).
LIST_MOST = 500
#: Days ahead the calendar's page lists closed days for.
PREVIEW_DAYS = 90
#: Tasks using a calendar that its page lists.
TASKS_SHOWN = 20
#: Tasks whose next fire times the page shows placed by the calendar, and how many of each.
PREVIEW_TASKS, PREVIEW_FIRE_TIMES = 5, 20
_EXTRA = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:\s*(?:\.\.|to)\s*(\d{4}-\d{2}-\d{2}))?(?:\s+(.*))?$")


def extra_text(extra: Any) -> str:
    """Extra closed dates as the form shows them, a line each: ``2027-12-24..2027-12-31 shutdown``."""
    lines = []
    for item in extra or ():
        span = item["start"] if item["end"] == item["start"] else f"{item['start']}..{item['end']}"
        lines.append(f"{span} {item.get('label', '')}".rstrip())
    return "\n".join(lines)


def parse_extra(text: str) -> list[dict[str, str]]:
    """The form's lines as the API's ``extra_dates``; ValueError in words for a line that does not
    start with a date (or a range ``start..end``)."""
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _EXTRA.match(line.strip())
        try:
            if not match:
                raise ValueError
            start = date.fromisoformat(match.group(1))
            end = date.fromisoformat(match.group(2)) if match.group(2) else start
        except ValueError:
            raise ValueError(
                f"Line {number}: start with a date (YYYY-MM-DD) or a range (2027-12-24..2027-12-31), then a label."
            ) from None
        items.append({"start": start.isoformat(), "end": end.isoformat(), "label": (match.group(3) or "").strip()})
    return items


class CalendarForm(TeamObjectForm):
    """A business calendar: the fields of ``POST /api/v1/calendars`` (the team only on a new one)."""

    plural = "calendars"

    team = forms.ChoiceField(help_text="Its tasks may use it; its editors change it. A calendar stays in its team.")
    name = forms.CharField(max_length=100, help_text="What tasks name it by, e.g. Berlin office.")
    country = forms.CharField(
        required=False,
        max_length=3,
        help_text="Its public holidays close, e.g. DE or US (ISO 3166). Empty: none.",
        widget=forms.TextInput(attrs={"list": "country-codes", "autocomplete": "off"}),
    )
    subdivision = forms.CharField(
        required=False, max_length=10, help_text="A region with holidays of its own, e.g. BY (Bavaria) for DE."
    )
    weekends_closed = forms.BooleanField(required=False, label="Weekends closed")
    weekend_days = forms.MultipleChoiceField(
        required=False,
        choices=[(str(number), name) for number, name in WEEKDAY_NAMES.items()],
        initial=["6", "7"],
        label="Weekend days",
        widget=forms.SelectMultiple(attrs={"size": 7}),
        help_text="Closed when weekends are closed (Ctrl for several).",
    )
    extra_dates = forms.CharField(
        required=False,
        label="Extra closed dates",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text="One a line: a date or a range, then a label, e.g. 2027-12-24..2027-12-31 winter shutdown.",
    )

    def clean_extra_dates(self) -> list[dict[str, str]]:
        return parsed_field(parse_extra, self.cleaned_data.get("extra_dates"))

    @classmethod
    def initial_for(cls, calendar: Calendar) -> dict[str, Any]:
        return {
            "name": calendar.name,
            "country": calendar.country,
            "subdivision": calendar.subdivision,
            "weekends_closed": calendar.weekends_closed,
            "weekend_days": [str(day) for day in calendar.weekend_days or ()],
            "extra_dates": extra_text(calendar.extra_dates),
        }

    def api_input(self) -> dict[str, Any]:
        data = self.cleaned_data
        result = {
            "name": data["name"],
            "country": (data.get("country") or "").strip().upper(),
            "subdivision": (data.get("subdivision") or "").strip(),
            "weekends_closed": bool(data.get("weekends_closed")),
            "weekend_days": sorted(int(day) for day in data.get("weekend_days") or ()) or [6, 7],
            "extra_dates": data.get("extra_dates") or [],
        }
        if "team" in self.fields:
            result["team"] = data.get("team")
        return result


def visible_calendars(user: Any) -> QuerySet[Calendar]:
    """The calendars of ``user``'s teams (all for staff), each with the user's role in its team
    and how many tasks (not deleted) use it, in the one query."""
    using = Count("tasks", filter=~Q(tasks__status=TaskStatus.DELETED))
    calendars = with_role(scope_to_teams(Calendar.objects.all(), user), user)
    return calendars.select_related("team").annotate(task_count=using)


def may_change(user: Any, calendar: Calendar, verb: str = "change") -> bool:
    return editor_may(user, calendar, f"tasks_app.{verb}_calendar")


def _calendar_to_change(request: HttpRequest, pk: int, verb: str = "change") -> Calendar:
    calendar = get_object_or_404(visible_calendars(request.user), pk=pk)
    if not may_change(request.user, calendar, verb):
        raise editor_required(calendar, "calendar", "calendars")
    return calendar


def _closes(calendar: Calendar) -> str:
    """What the calendar closes, in words."""
    parts = []
    if calendar.country:
        region = f" ({calendar.subdivision})" if calendar.subdivision else ""
        parts.append(f"public holidays of {calendar.country}{region}")
    if calendar.weekends_closed:
        parts.append("weekends (" + ", ".join(WEEKDAY_NAMES[day] for day in calendar.weekend_days or ()) + ")")
    if calendar.extra_dates:
        parts.append(f"{len(calendar.extra_dates)} extra date(s)")
    return ", ".join(parts) or "nothing"


def _list_context(request: HttpRequest, form: CalendarForm) -> dict[str, Any]:
    context = list_context(
        visible_calendars(request.user),
        form,
        LIST_MOST,
        lambda calendars: [{"calendar": calendar, "closes": _closes(calendar)} for calendar in calendars],
    )
    return {**context, "countries": sorted(supported_countries())}


@login_required
@require_GET
def calendars_page(request: HttpRequest) -> HttpResponse:
    form = CalendarForm(user=request.user)
    return render(request, "backoffice/calendars.html", _list_context(request, form))


@login_required
@require_POST
def calendar_create_view(request: HttpRequest) -> HttpResponse:
    form = CalendarForm(request.POST, user=request.user)
    form.require_team()
    if form.is_valid():
        serializer = CalendarSerializer(data=form.api_input(), context={"request": request})
        calendar = save_validated(
            form, serializer, lambda data: calendar_create(owner=request_user(request), **dict(data))
        )
        if calendar is not None:
            messages.success(
                request, f"Calendar {calendar.name} created in team {calendar.team.name}: tasks may use it now."
            )
            return redirect("backoffice:calendar", pk=calendar.pk)
    return render(request, "backoffice/calendars.html", _list_context(request, form), status=400)


def _page_context(request: HttpRequest, calendar: Calendar, form: CalendarForm | None) -> dict[str, Any]:
    today = date.today()
    can_change = may_change(request.user, calendar)
    tasks = (
        Task.objects.filter(calendar=calendar)
        .exclude(status=TaskStatus.DELETED)
        .order_by("name", "id")
        .only("id", "name", "calendar_policy")[:TASKS_SHOWN]
    )
    effects = []
    # What it does to the next runs of the first tasks using it: the fire times it skips or moves,
    # as the task pages and GET /tasks/{id}/preview say (a bounded number of tasks, not all).
    for task in (
        Task.objects.filter(calendar=calendar).exclude(status=TaskStatus.DELETED).order_by("name", "id")[:PREVIEW_TASKS]
    ):
        try:
            times = task_preview(task=task, count=PREVIEW_FIRE_TIMES)
        except SERVICE_ERRORS:
            times = []
        effects.append({"task": task, "changed": [time for time in times if time.calendar], "looked": len(times)})
    return {
        "calendar": calendar,
        "closes": _closes(calendar),
        "effects": effects,
        "closed_days": calendar_closed_days(calendar=calendar, start=today, end=today + timedelta(days=PREVIEW_DAYS)),
        "preview_days": PREVIEW_DAYS,
        "tasks": tasks,
        "form": form
        if form is not None
        else (CalendarForm(initial=CalendarForm.initial_for(calendar), editing=True) if can_change else None),
        "can_change": can_change,
        "can_delete": may_change(request.user, calendar, "delete"),
        "countries": sorted(supported_countries()),
    }


@login_required
@require_http_methods(["GET", "POST"])
def calendar_page(request: HttpRequest, pk: int) -> HttpResponse:
    """The calendar's page; a POST saves its form (only the fields changed are sent)."""
    if request.method == "GET":
        calendar = get_object_or_404(visible_calendars(request.user), pk=pk)
        return render(request, "backoffice/calendar.html", _page_context(request, calendar, None))
    calendar = _calendar_to_change(request, pk)
    form = CalendarForm(request.POST, initial=CalendarForm.initial_for(calendar), editing=True)
    if form.is_valid():
        stored = {name: getattr(calendar, name) for name in CALENDAR_FIELDS}
        changes = {name: value for name, value in form.api_input().items() if value != stored.get(name)}
        if not changes:
            messages.info(request, f"Calendar {calendar.name}: nothing changed.")
            return redirect("backoffice:calendar", pk=calendar.pk)
        serializer = CalendarSerializer(calendar, data=changes, partial=True, context={"request": request})

        def update(validated: Any) -> Calendar:
            data = dict(validated)
            if "extra_dates" in data:  # ISO text, as the API's view hands them to the service
                data["extra_dates"] = changes["extra_dates"]
            return calendar_update(calendar=calendar, changes=data, actor=request_user(request).get_username())

        saved = save_validated(form, serializer, update)
        if saved is not None:
            replanned = set(changes) - {"name"}
            note = " The waiting runs of the tasks using it were planned again." if replanned else ""
            messages.success(request, f"Calendar {saved.name} saved ({', '.join(sorted(changes))}).{note}")
            return redirect("backoffice:calendar", pk=calendar.pk)
    return render(request, "backoffice/calendar.html", _page_context(request, calendar, form), status=400)


@login_required
@require_POST
def calendar_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    calendar = _calendar_to_change(request, pk, "delete")
    if not flash_outcome(
        request, lambda: calendar_delete(calendar=calendar), lambda _: f"Calendar {calendar.name} deleted."
    ):
        return redirect("backoffice:calendar", pk=calendar.pk)
    return redirect("backoffice:calendars")
