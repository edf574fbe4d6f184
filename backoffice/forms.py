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

from runners.registry import runner_aliases
from tasks_app.models import MisfirePolicy, OverlapPolicy, Task
from tasks_app.services import task_config_masked

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

    def payload(self, names: Any = None) -> dict[str, Any]:
        """The API input: every filled field (or only ``names``), as the JSON the API takes."""
        data = self.cleaned_data
        names = self.fields if names is None else names
        return {name: data[name] for name in names if name in data and data[name] not in ("", None)}


def runner_choices() -> list[tuple[str, str]]:
    return [(alias, alias) for alias in runner_aliases()]


class TaskForm(ApiInputForm):
    """Create or change a task: the fields of ``POST /api/v1/tasks`` an operator sets most."""

    local_times = ("start_at", "end_at")
    json_fields = ("config",)
    wall_times_to_api = True

    name = forms.CharField(
        required=False, max_length=200, label="Name (optional)", help_text="Empty: the task is shown by its id."
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
    cron = forms.CharField(required=False, max_length=120, help_text='Or a cron expression: "*/5 * * * *".')
    timezone = forms.CharField(max_length=64, initial="UTC", help_text="IANA zone, e.g. Europe/Berlin.")
    end_at = forms.CharField(required=False, widget=LocalDateTimeInput(), help_text="No runs after this.")
    max_runs = forms.IntegerField(required=False, min_value=1)
    max_attempts = forms.IntegerField(required=False, min_value=1, max_value=100, initial=3)
    retry_backoff = forms.CharField(required=False, max_length=40, initial="5s")
    timeout = forms.CharField(required=False, max_length=40, help_text="Default 20m.")
    priority = forms.IntegerField(required=False, min_value=0, max_value=9, initial=5)
    misfire_policy = forms.ChoiceField(choices=MisfirePolicy.choices, initial=MisfirePolicy.RUN_ONCE)
    overlap_policy = forms.ChoiceField(choices=OverlapPolicy.choices, initial=OverlapPolicy.ALLOW)

    @classmethod
    def initial_for(cls, task: Task) -> dict[str, Any]:
        """The form's text for an existing task (what :meth:`changes` compares against)."""

        def seconds(value: Any) -> str:
            return "" if value is None else f"{value.total_seconds():g}s"

        return {
            "name": task.name,
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
        }

    def changes(self) -> dict[str, Any]:
        """For an edit: the API input of the fields whose text the person changed, cleared ones as
        null. Untouched fields are not sent, so a time shown to the second is never cut to it."""
        changed = {}
        for name in self.fields:
            before = str(self.initial.get(name, "") or "")
            after = str(self.data.get(name, "") or "")
            if name == "config":
                try:
                    unchanged = json.loads(before or "{}") == json.loads(after or "{}")
                except ValueError:
                    unchanged = False
                if unchanged:
                    continue
            elif before.strip() == after.strip():
                continue
            value = self.cleaned_data.get(name)
            if value in ("", None):
                value = {} if name == "config" else ("" if name in ("cron", "name") else None)
            changed[name] = value
        return changed


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
