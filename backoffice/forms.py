"""The back office's forms.

They collect what a person types and turn it into the API's input; the API's serializers then
validate it (the same rules and messages as ``POST /api/v1/tasks``) and the views call the same
services as the API. Times are typed as wall-clock times in the task's zone.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

from notifications.models import DEFAULT_FAILING_AFTER, MAX_FAILING_AFTER, Channel, ChannelKind, Rule
from runners.registry import runner_aliases
from tasks_api.task_config import task_config_masked
from tasks_app.models import (
    MAX_AFTER,
    CalendarPolicy,
    DependencyOn,
    DstFold,
    DstGap,
    JoinRule,
    Limit,
    MisfirePolicy,
    OverlapPolicy,
    Task,
    TaskStatus,
    Team,
    TeamRole,
)
from tasks_app.schedules import CRON_FIELDS_HELP
from tasks_app.teams import teams_with_role
from tms_core.durations import format_duration

#: Wall-clock input to the second (``<input type=datetime-local step=1>``).
LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"


class LocalDateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(format=LOCAL_FORMAT, attrs={"step": "1", **kwargs.pop("attrs", {})}, **kwargs)


def zone_or_utc(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def local_text(when: datetime | None, zone: str) -> str:
    """``when`` as the wall-clock text a datetime-local input shows, in ``zone``."""
    return when.astimezone(zone_or_utc(zone)).strftime(LOCAL_FORMAT) if when else ""


def parse_local(text: str, zone: str) -> datetime:
    """A wall-clock time typed in ``zone`` as an aware datetime; ValueError when unreadable."""
    value = datetime.fromisoformat(text.strip())
    return value if value.tzinfo else value.replace(tzinfo=zone_or_utc(zone))


class ApiInputForm(forms.Form):
    """A form whose fields become the API's input (:meth:`payload`) for a serializer to check."""

    #: Fields holding wall-clock times in the zone of the ``timezone`` field (or the task's).
    local_times: tuple[str, ...] = ()
    #: Fields holding JSON text.
    json_fields: tuple[str, ...] = ()
    #: The fields in the order the page lays them out on its grid (:meth:`grid`), and those folded
    #: under "more" (:meth:`more_grid`); ``wide_fields`` span two grid columns.
    layout: tuple[str, ...] = ()
    more_layout: tuple[str, ...] = ()
    wide_fields: tuple[str, ...] = ()
    #: Send wall-clock times to the API as typed (no offset) for its serializer to read in the
    #: task's zone, by the API's rule and with its error on the field (a skipped local time is
    #: refused, not moved), rather than reading them here.
    wall_times_to_api = False

    def __init__(self, *args: Any, zone: str = "UTC", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zone = zone

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        for name in self.json_fields:
            text = (data.get(name) or "").strip()
            if text:
                try:
                    data[name] = json.loads(text)
                except ValueError as exc:
                    self.add_error(name, f"Not valid JSON: {exc}.")
        zone = data.get("timezone") or self.zone
        for name in self.local_times:
            text = (data.get(name) or "").strip()
            if text:
                try:
                    if self.wall_times_to_api:
                        data[name] = datetime.fromisoformat(text).isoformat()
                    else:
                        data[name] = parse_local(text, zone).isoformat()
                except ValueError:
                    self.add_error(name, "Enter a date and time, e.g. 2026-11-20T09:30:00.")
        return data

    def grid(self) -> list[forms.BoundField]:
        """The bound fields of :attr:`layout`, for ``_grid_fields.html``."""
        return [self[name] for name in self.layout]

    def more_grid(self) -> list[forms.BoundField]:
        return [self[name] for name in self.more_layout]

    def payload(self, names: Any = None) -> dict[str, Any]:
        """The API input: every filled field (or only ``names``), as the JSON the API takes."""
        data = self.cleaned_data
        names = self.fields if names is None else names
        return {name: data[name] for name in names if name in data and data[name] not in ("", None)}


def runner_choices() -> list[tuple[str, str]]:
    return [(alias, alias) for alias in runner_aliases()]


#: Rows of a task form's "runs after" pickers beyond the task's own entries (a person adds more by
#: saving and editing again; the API takes up to MAX_AFTER).
AFTER_BLANK_ROWS = 2
#: ``on`` of an ``after`` entry in words.
AFTER_ON_WORDS = [
    (DependencyOn.SUCCESS, "succeeded"),
    (DependencyOn.FAILURE, "failed for good"),
    (DependencyOn.COMPLETION, "ended, either way"),
]
#: Task names offered as suggestions in the "runs after" pickers (newest first).
AFTER_SUGGESTIONS = 300


def team_label(team: Team) -> str:
    return f"{team.name} (personal)" if team.personal else team.name


class TaskForm(ApiInputForm):
    """Create or change a task: the fields of ``POST /api/v1/tasks`` an operator sets most.

    ``user`` decides the choices: the team menu offers the teams where they are an editor (the
    API's rule for a create and for a move, :func:`tasks_app.teams.teams_with_role`), the named
    limits those of these teams and the global ones. ``task`` (an edit) adds its own team and
    its ``after`` entries. The tasks it runs after are typed by name (suggested from the teams'
    tasks) or id, each with ``on``; :meth:`after_entries` turns them into the API's ``after``."""

    local_times = ("start_at", "end_at")
    json_fields = ("config", "input_schema", "on_events")
    wall_times_to_api = True
    layout = ("name", "team", "runner", "config", "start_at", "timezone", "interval", "cron", "end_at", "max_runs")
    more_layout = (
        "max_attempts",
        "retry_backoff",
        "timeout",
        "priority",
        "misfire_policy",
        "dst_gap",
        "dst_fold",
        "overlap_policy",
        "calendar",
        "calendar_policy",
        "trigger_debounce",
        "limits",
        "input_schema",
        "on_events",
    )
    wide_fields = ("config", "input_schema", "on_events")
    #: Fields whose changes an edit does not send as they are (the team moves the task; ``after``
    #: is built from its rows by :meth:`after_entries`).
    composed = ("team", "after")

    name = forms.CharField(
        required=False, max_length=200, label="Name (optional)", help_text="Empty: the task is shown by its id."
    )
    team = forms.ChoiceField(
        required=False,
        help_text="Its members see it and act by their role. Only teams where you are an editor are offered.",
    )
    runner = forms.ChoiceField(choices=runner_choices)
    config = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text='The runner\'s config as JSON, e.g. {"duration": "2s"} for sleep.',
    )
    start_at = forms.CharField(
        required=False, widget=LocalDateTimeInput(), help_text="In the task's time zone. Empty: now."
    )
    interval = forms.CharField(required=False, max_length=40, help_text='Repeat every: "90s", "5m", "1h30m".')
    cron = forms.CharField(
        required=False,
        max_length=120,
        help_text=f'Or a cron expression, {CRON_FIELDS_HELP}. Example: "*/5 * * * *".',
    )
    timezone = forms.CharField(max_length=64, initial="UTC", help_text="IANA zone, e.g. Europe/Berlin.")
    end_at = forms.CharField(required=False, widget=LocalDateTimeInput(), help_text="No runs after this.")
    max_runs = forms.IntegerField(required=False, min_value=1)
    max_attempts = forms.IntegerField(required=False, min_value=1, max_value=100, initial=3)
    retry_backoff = forms.CharField(required=False, max_length=40, initial="5s")
    timeout = forms.CharField(required=False, max_length=40, help_text="Default 20m.")
    priority = forms.IntegerField(required=False, min_value=0, max_value=9, initial=5)
    misfire_policy = forms.ChoiceField(choices=MisfirePolicy.choices, initial=MisfirePolicy.RUN_ONCE)
    overlap_policy = forms.ChoiceField(choices=OverlapPolicy.choices, initial=OverlapPolicy.ALLOW)
    join = forms.ChoiceField(
        choices=JoinRule.choices,
        initial=JoinRule.ALL_SUCCESS,
        required=False,
        label="Runs when (join)",
        help_text="With several tasks above: all_success every one ended as chosen (and its condition holds); "
        "one_success the first that does; one_failed the first that failed; all_done all ended or skipped; "
        "none_failed all ended or skipped, none failed.",
    )
    trigger_debounce = forms.CharField(
        required=False,
        max_length=40,
        label="Run now: debounce",
        help_text='e.g. "30s": run now waits this long and gathers the triggers meanwhile into one run. Empty: none.',
    )
    dst_gap = forms.ChoiceField(
        choices=DstGap.choices,
        required=False,
        label="Clock set forward",
        help_text="Cron: wall times the clock skips run once after the gap (shift) or not at all (skip).",
    )
    dst_fold = forms.ChoiceField(
        choices=DstFold.choices,
        required=False,
        label="Clock set back",
        help_text="Cron: wall times shown twice run at their first, second or both occurrences.",
    )
    calendar = forms.CharField(required=False, max_length=100, label="Business calendar")
    calendar_policy = forms.ChoiceField(
        choices=CalendarPolicy.choices,
        required=False,
        label="On a closed day",
        help_text="Skip the run, or move it to the next or previous business day (default skip).",
    )
    limits = forms.MultipleChoiceField(
        required=False,
        label="Named limits",
        widget=forms.SelectMultiple(attrs={"size": 4}),
    )
    input_schema = forms.CharField(
        required=False,
        label="Input schema",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text='A JSON Schema that a run\'s input must satisfy, e.g. {"type": "object", "required": ["date"]}. '
        "Empty: any JSON object.",
    )
    on_events = forms.CharField(
        required=False,
        label="Named events",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "class": "mono"}),
        help_text='JSON: the events that start a run, e.g. ["order.paid"] or [{"name": "cart.changed", '
        '"debounce": "60s", "debounce_key": "$.customer", "debounce_max_wait": "5m"}]. Empty: none.',
    )
    #: Where the errors of ``after`` as a whole land (the API's field); the rows are the pickers.
    after = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, user: Any, task: Task | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task = task
        editor_teams = list(teams_with_role(user, TeamRole.EDITOR).order_by("slug"))
        teams = sorted(editor_teams, key=lambda team: (not team.personal, team.name.lower()))
        if task is not None and task.team not in teams:
            teams.insert(0, task.team)  # staff acting by permission: the task's own team stays a choice
        self.team_choices = teams
        field = self.fields["team"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(team.slug, team_label(team)) for team in teams]
        if task is None and teams:
            field.initial = next((team.slug for team in teams if team.personal_of_id == user.pk), teams[0].slug)
        # Limits and task names of the teams offered (the task's own on an edit), and the global limits.
        team_ids = [task.team_id] if task is not None else [team.pk for team in teams]
        self._limit_choices(team_ids)
        self.calendar_help()
        self.after_suggestions = _task_names(team_ids, without=task)
        #: The edited task's entries: (text shown, upstream id, on, condition as JSON text or "").
        self.initial_after: list[tuple[str, str, str, str]] = []
        if task is not None and task.has_after:
            from tasks_api.workflows import task_links, task_neighbours

            upstream, _ = task_neighbours(task)
            conditions = {str(link.upstream_id): link.condition for link in task_links(task)}
            self.initial_after = [
                (str(n.task), str(n.task.pk), n.on, _condition_text(conditions.get(str(n.task.pk)))) for n in upstream
            ]
        rows = len(self.initial_after) + AFTER_BLANK_ROWS
        if self.is_bound:
            posted = [key for key in self.data if key.startswith("after_task_")]
            rows = max(rows, len(posted))
        self.after_rows = min(max(rows, 3), MAX_AFTER)
        for index in range(self.after_rows):
            text, on, condition = "", str(DependencyOn.SUCCESS), ""
            if index < len(self.initial_after):
                text, _, on, condition = self.initial_after[index]
            self.fields[f"after_task_{index}"] = forms.CharField(
                required=False,
                max_length=200,
                label=f"Runs after task {index + 1}",
                initial=text,
                widget=forms.TextInput(attrs={"list": "after-task-names", "autocomplete": "off"}),
            )
            self.fields[f"after_on_{index}"] = forms.ChoiceField(
                choices=AFTER_ON_WORDS, label=f"when task {index + 1} has", initial=on, required=False
            )
            self.fields[f"after_condition_{index}"] = forms.CharField(
                required=False,
                max_length=4096,
                label=f"and if its output (condition {index + 1})",
                initial=condition,
                widget=forms.TextInput(attrs={"class": "mono", "spellcheck": "false"}),
                help_text='JSON, e.g. {"path": "$.rows", "op": ">", "value": 0}. Empty: always.',
            )

    def _limit_choices(self, team_ids: list[int]) -> None:
        limits = (
            Limit.objects.filter(Q(team_id__in=team_ids) | Q(team__isnull=True))
            .select_related("team")
            .order_by("name", "team__slug")
        )
        where: dict[str, list[str]] = {}
        for limit in limits:
            where.setdefault(limit.name, []).append(limit.team.slug if limit.team is not None else "global")
        field = self.fields["limits"]
        assert isinstance(field, forms.MultipleChoiceField)
        initial = list(self.initial.get("limits") or [])
        for name in initial:  # a limit the task uses stays listed
            where.setdefault(name, ["in use"])
        field.choices = [(name, f"{name} ({', '.join(places)})") for name, places in where.items()]
        field.help_text = format_html(
            'Its runs wait while one is exhausted. Hold Ctrl to choose several. <a href="{}">Named limits</a>{}',
            reverse("backoffice:limits"),
            "" if where else ": none yet in these teams.",
        )

    def calendar_help(self) -> None:
        self.fields["calendar"].help_text = format_html(
            'Name of one of the team\'s <a href="{}">business calendars</a>. Empty: none.',
            reverse("backoffice:calendars"),
        )

    def after_grid(self) -> list[tuple[forms.BoundField, forms.BoundField, forms.BoundField]]:
        """The "runs after" pickers: (task, on, condition) per row."""
        return [
            (self[f"after_task_{i}"], self[f"after_on_{i}"], self[f"after_condition_{i}"])
            for i in range(self.after_rows)
        ]

    def after_entries(self, team_id: int) -> list[dict[str, Any]] | None:
        """The API's ``after`` from the rows: each typed name is the task of that name in the team
        ``team_id`` (or an id as it is, for the service to check); None, with the error on
        ``after``, when a name names no task or several. A row left as the edit showed it keeps
        its task, so two upstreams of one name stay apart."""
        entries: list[dict[str, Any]] = []
        named: dict[str, int] = {}
        problems = []
        for index in range(self.after_rows):
            text = (self.cleaned_data.get(f"after_task_{index}") or "").strip()
            on = self.cleaned_data.get(f"after_on_{index}") or DependencyOn.SUCCESS
            if not text:
                continue
            entry: dict[str, Any] = {"task": text, "on": on}
            condition = (self.cleaned_data.get(f"after_condition_{index}") or "").strip()
            if condition:
                try:
                    entry["condition"] = json.loads(condition)
                except json.JSONDecodeError as exc:
                    problems.append(f"The condition of task {index + 1} is not JSON: {exc.msg} (at {exc.pos}).")
            if index < len(self.initial_after) and text == self.initial_after[index][0]:
                entries.append({**entry, "task": self.initial_after[index][1]})
                continue
            named[text] = len(entries)
            entries.append(entry)
        if problems:
            self.add_error("after", problems)
            return None
        if not named:
            return entries
        found: dict[str, list[str]] = {}
        rows = (
            Task.objects.filter(team_id=team_id, name__in=list(named))
            .exclude(status=TaskStatus.DELETED)
            .values_list("name", "pk")
        )
        for name, pk in rows:
            found.setdefault(name, []).append(str(pk))
        for text, position in named.items():
            ids = found.get(text, [])
            if len(ids) == 1:
                entries[position]["task"] = ids[0]
            elif len(ids) > 1:
                problems.append(f"{len(ids)} tasks of the team are named {text!r}: type the id of the one you mean.")
            elif not _looks_like_id(text):
                problems.append(f"No task named {text!r} in the task's team.")
        if problems:
            self.add_error("after", problems)
            return None
        return entries

    def team_slug(self) -> str:
        return str(self.cleaned_data.get("team") or "")

    @classmethod
    def initial_for(cls, task: Task) -> dict[str, Any]:
        """The form's text for an existing task (what :meth:`changes` compares against)."""
        from tasks_api.limits import task_limit_names

        def seconds(value: Any) -> str:
            return "" if value is None else f"{value.total_seconds():g}s"

        return {
            "name": task.name,
            "team": task.team.slug,
            "runner": task.runner,
            # Secrets masked: sending the mask back keeps them (tasks_app.secrets).
            "config": json.dumps(task_config_masked(task), indent=2, sort_keys=True),
            "start_at": local_text(task.start_at, task.timezone),
            "interval": seconds(task.interval),
            "cron": task.cron,
            "timezone": task.timezone,
            "end_at": local_text(task.end_at, task.timezone),
            "max_runs": "" if task.max_runs is None else str(task.max_runs),
            "max_attempts": str(task.max_attempts),
            "retry_backoff": seconds(task.retry_backoff),
            "timeout": seconds(task.timeout),
            "priority": str(task.priority),
            "misfire_policy": task.misfire_policy,
            "overlap_policy": task.overlap_policy,
            "join": task.join,
            "dst_gap": task.dst_gap,
            "dst_fold": task.dst_fold,
            "calendar": task.calendar.name if task.calendar_id and task.calendar else "",
            "calendar_policy": task.calendar_policy,
            "trigger_debounce": seconds(task.trigger_debounce),
            "limits": task_limit_names(task) if task.has_limits else [],
            "input_schema": "" if task.input_schema is None else json.dumps(task.input_schema, indent=2),
            "on_events": json.dumps(task.on_events) if task.on_events else "",
        }

    def payload(self, names: Any = None) -> dict[str, Any]:
        """A create's API input: the fields filled, without the pickers' rows (``after`` is
        added by the view from :meth:`after_entries`)."""
        data = super().payload(names)
        for name in list(data):
            if name.startswith(("after_task_", "after_on_", "after_condition_")) or name == "after":
                del data[name]
        if not data.get("limits"):
            data.pop("limits", None)
        return data

    def changes(self) -> dict[str, Any]:
        """For an edit: the API input of the fields whose text the person changed, cleared ones as
        null. Untouched fields are not sent, so a time shown to the second is never cut to it.
        ``team`` and ``after`` are the view's (a move, and the rows' entries)."""
        changed: dict[str, Any] = {}
        for name in self.fields:
            if name in self.composed or name.startswith(("after_task_", "after_on_", "after_condition_")):
                continue
            if name == "limits":
                chosen = sorted(self.cleaned_data.get("limits") or [])
                if chosen != sorted(self.initial.get("limits") or []):
                    changed[name] = chosen
                continue
            before = str(self.initial.get(name, "") or "")
            after = str(self.data.get(name, "") or "")
            if name in self.json_fields:
                empty = {"config": "{}", "on_events": "[]"}.get(name, "null")
                try:
                    unchanged = json.loads(before or empty) == json.loads(after or empty)
                except ValueError:
                    unchanged = False
                if unchanged:
                    continue
            elif before.strip() == after.strip():
                continue
            value = self.cleaned_data.get(name)
            if value in ("", None):
                value = (
                    {}
                    if name == "config"
                    else []
                    if name == "on_events"
                    else ("" if name in ("cron", "name", "dst_gap", "dst_fold", "calendar_policy") else None)
                )
            changed[name] = value
        return changed

    def after_changed(self, entries: list[dict[str, Any]]) -> bool:
        """Whether ``entries`` differ from the edited task's ``after`` (order does not matter). A
        POST without the pickers (a form that did not show them) changes nothing."""
        if not any(key.startswith("after_task_") for key in self.data):
            return False
        before = {(pk, on, _condition_text(json.loads(text)) if text else "") for _, pk, on, text in self.initial_after}
        return before != {(entry["task"], entry["on"], _condition_text(entry.get("condition"))) for entry in entries}


def _condition_text(condition: Any) -> str:
    """A link's condition as the form shows it (compact JSON, keys sorted; "" for none)."""
    return "" if condition is None else json.dumps(condition, sort_keys=True)


def _task_names(team_ids: list[int], *, without: Task | None) -> list[str]:
    """The newest task names of the teams (at most :data:`AFTER_SUGGESTIONS`), in one query: the
    newest of each team read from its index (task_team_live_idx) and merged, so that a team of
    100,000 tasks costs a few hundred rows, never a sort of all of them."""
    if not team_ids:
        return []
    parts = []
    for team_id in team_ids:
        rows = Task.objects.filter(team_id=team_id).exclude(status=TaskStatus.DELETED).exclude(name="")
        if without is not None:
            rows = rows.exclude(pk=without.pk)
        parts.append(rows.order_by("-created_at", "-id").values_list("name", "created_at")[:AFTER_SUGGESTIONS])
    merged = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        merged = merged.order_by("-created_at")[:AFTER_SUGGESTIONS]
    return [name for name, _ in merged]


def _looks_like_id(text: str) -> bool:
    import uuid

    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


class BackfillForm(ApiInputForm):
    local_times = ("start", "end")

    start = forms.CharField(widget=LocalDateTimeInput(), help_text="In the task's time zone.")
    end = forms.CharField(widget=LocalDateTimeInput(), help_text="Not in the future.")


class WhyForm(ApiInputForm):
    local_times = ("at",)

    at = forms.CharField(widget=LocalDateTimeInput(), help_text="A time in the task's zone.")


class OccurrenceWindowForm(ApiInputForm):
    local_times = ("from", "to")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = forms.CharField(required=False, widget=LocalDateTimeInput())
        self.fields["to"] = forms.CharField(required=False, widget=LocalDateTimeInput())


# --- notification channels and rules -------------------------------------------------------------


class TimeInput(forms.TimeInput):
    input_type = "time"


class ChannelForm(ApiInputForm):
    """A notification channel: the fields of ``POST /api/v1/notification-channels``."""

    layout: tuple[str, ...] = ("name", "kind", "target", "failing_after", "quiet_from", "quiet_to", "timezone")
    wide_fields = ("target",)

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        """``teams``: on a new channel, the teams it may go in (those where the user is an editor;
        the first choice, the personal team, is the API's default)."""
        super().__init__(*args, **kwargs)
        if teams is not None:
            ordered = sorted(teams, key=lambda team: not team.personal)
            choices = [(team.slug, f"{team.name} (personal)" if team.personal else team.name) for team in ordered]
            # Not required: left out, it goes in the personal team (the API's default).
            self.fields["team"] = forms.ChoiceField(
                choices=choices, required=False, help_text="Its members see it; its editors change it."
            )
            self.layout = ("team", *type(self).layout)

    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=ChannelKind.choices)
    target = forms.CharField(
        max_length=500, help_text="A URL for webhook and Slack, an e-mail address for email. Shown masked once saved."
    )
    failing_after = forms.IntegerField(
        label="Failing after", min_value=1, max_value=MAX_FAILING_AFTER, initial=DEFAULT_FAILING_AFTER,
        help_text="failed delivery attempts in a row (retries count)",
    )  # fmt: skip
    quiet_from = forms.CharField(required=False, widget=TimeInput(), help_text="Quiet hours: nothing is sent from ...")
    quiet_to = forms.CharField(required=False, widget=TimeInput(), help_text="... until this time (then it is).")
    timezone = forms.CharField(max_length=64, initial="UTC", help_text="The quiet hours' zone (IANA).")

    @classmethod
    def initial_for(cls, channel: Channel) -> dict[str, Any]:
        return {
            "name": channel.name,
            "kind": channel.kind,
            "target": channel.shown_target(),  # sending the mask back keeps the stored target
            "failing_after": channel.failing_after,
            "quiet_from": channel.quiet_from.strftime("%H:%M") if channel.quiet_from else "",
            "quiet_to": channel.quiet_to.strftime("%H:%M") if channel.quiet_to else "",
            "timezone": channel.timezone,
        }

    def api_input(self) -> dict[str, Any]:
        """Every field as the API takes it: an empty quiet hour is null (none)."""
        data = self.payload()
        for name in ("quiet_from", "quiet_to"):
            data.setdefault(name, None)
        return data


#: Rule flags and durations, with the words the page shows for them.
RULE_EVENTS = (
    ("on_failure", "fails for good (attempts exhausted)"),
    ("on_retry", "fails an attempt that will be retried"),
    ("on_recovery", "recovers (first success after failures)"),
    ("on_skip", "skips an occurrence"),
)
RULE_DURATIONS = (
    ("late_after", "Started late by more than"),
    ("running_longer_than", "Running longer than"),
    ("no_success_within", "No success within"),
    ("digest_every", "Send as one digest every"),
)
#: Tasks offered in a rule's task menu (newest first); a rule for another task is added from its page.
RULE_TASK_CHOICES = 300


class RuleForm(ApiInputForm):
    """A notification rule: the fields of ``POST /api/v1/notification-rules``. ``task`` empty is
    the team's default for every task of the team without rules of its own; ``fixed_task`` (a
    task's page) takes the task from the page instead of a menu. The menus offer the channels and
    tasks of ``team_ids`` (the teams where the user is an editor; a rule's own team when it is
    edited); a new rule goes in its channel's team, whose task it must name (the service says so)."""

    def __init__(
        self, *args: Any, team_ids: Any, fixed_task: Task | None = None, rule: Rule | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fixed_task = fixed_task
        channels = Channel.objects.filter(team_id__in=team_ids).select_related("team").order_by("name", "id")
        self.channel_choices = [(str(c.pk), f"{c.name} ({c.kind}, {c.team.slug})") for c in channels]
        self.fields["channel"] = forms.ChoiceField(choices=self.channel_choices)
        if fixed_task is None:
            tasks = (
                Task.objects.filter(team_id__in=team_ids)
                .exclude(status=TaskStatus.DELETED)
                .order_by("-created_at")
                .only("id", "name")[:RULE_TASK_CHOICES]
            )
            choices = [("", "Every task without rules of its own (default)")]
            if rule is not None and rule.task is not None and rule.task not in tasks:
                choices.append((str(rule.task_id), str(rule.task)))  # an older task, kept as it is
            self.fields["task"] = forms.ChoiceField(
                required=False, choices=choices + [(str(t.pk), str(t)) for t in tasks], label="For"
            )
        self.fields["enabled"] = forms.BooleanField(required=False, initial=True)
        for name, words in RULE_EVENTS:
            self.fields[name] = forms.BooleanField(required=False, label=words)
        for name, words in RULE_DURATIONS:
            self.fields[name] = forms.CharField(
                required=False, max_length=40, label=words, help_text='e.g. "90s", "5m", "1h"; empty: off'
            )

    def has_channels(self) -> bool:
        """Whether there is a channel to send through (the menu is empty otherwise)."""
        return bool(self.channel_choices)

    @classmethod
    def initial_for(cls, rule: Rule) -> dict[str, Any]:
        initial: dict[str, Any] = {
            "task": str(rule.task_id or ""),
            "channel": str(rule.channel_id),
            "enabled": rule.enabled,
        }
        for name, _ in RULE_EVENTS:
            initial[name] = getattr(rule, name)
        for name, _ in RULE_DURATIONS:
            value = getattr(rule, name)
            initial[name] = format_duration(value) if value is not None else ""
        return initial

    def api_input(self) -> dict[str, Any]:
        """Every field as the API takes it: empty durations are null (off), an empty task null."""
        data = self.cleaned_data
        result: dict[str, Any] = {"channel": data.get("channel"), "enabled": bool(data.get("enabled"))}
        if self.fixed_task is not None:
            result["task"] = str(self.fixed_task.pk)
        else:
            result["task"] = data.get("task") or None
        for name, _ in RULE_EVENTS:
            result[name] = bool(data.get(name))
        for name, _ in RULE_DURATIONS:
            result[name] = (data.get(name) or "").strip() or None
        return result


class AccessTokenForm(ApiInputForm):
    """A personal access token: the fields of ``POST /api/v1/tokens``. ``teams``: the choices of
    the team scope (the user's teams, by slug); without them the form has no team field (a
    service account's token is always its team's)."""

    layout: tuple[str, ...] = ("name", "scopes", "team", "expires_in")

    name = forms.CharField(max_length=100, help_text="What it is for, e.g. CI deploys.")
    scopes = forms.ChoiceField(
        label="Access",
        choices=[("read", "Read only (GET)"), ("write", "Read and write")],
        initial="read",
        help_text="What a request with this key may do.",
    )
    expires_in = forms.ChoiceField(
        label="Expires in",
        choices=[("7d", "7 days"), ("30d", "30 days"), ("90d", "90 days"), ("365d", "a year")],
        initial="90d",
    )
    team = forms.ChoiceField(
        label="Team",
        required=False,
        help_text="Scope the token to one of your teams: it sees and acts in that team only.",
    )

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teams is None:
            del self.fields["team"]
            self.layout = tuple(name for name in self.layout if name != "team")
        else:
            field = self.fields["team"]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [("", "All your teams"), *((team.slug, team.name) for team in teams)]

    def payload(self, names: Any = None) -> dict[str, Any]:
        data = super().payload(names)
        if "scopes" in data:
            data["scopes"] = [data["scopes"]]  # the API takes a list: write implies read
        return data
