"""What a ``wait_event`` run (runners.wait_event) asks the platform on each poll: the first event
of its name, in its team, received since it started, whose payload matches its input. A runner
never reads the database, so the worker gives it this lookup in its :class:`~runners.base.RunSpec`."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db.models import F
from django.db.models.fields.json import KeyTransform

from executions.models import Execution, ReceivedEvent
from runners.base import EventCheck, EventLookup
from tms_core.clock import db_now
from tms_core.json_paths import MISSING, json_path_get, json_path_parse


def event_lookup_for(execution: Execution) -> EventLookup:
    """The lookup a run of ``execution`` is given (cheap: nothing is read until it is called)."""
    return partial(event_check, execution)


def event_check(execution: Execution, name: str, input_path: str, event_path: str) -> EventCheck:
    """The first event named ``name`` in the run's team received at or after the run started
    whose payload at ``event_path`` equals the run's input at ``input_path`` (no path: any such
    event)."""
    now = db_now()
    started = execution.started_at or now
    waited = (now - started).total_seconds()
    events = ReceivedEvent.objects.filter(team_id=execution.team_id, name=name, received_at__gte=started)
    if input_path:
        value = json_path_get(execution.input or {}, input_path)
        if value is MISSING:
            return EventCheck(waited=waited, problem=f"the run's input has no {input_path} to match events with")
        # Key transforms, not a lookup string: a key such as "contains" or "a__b" stays a key.
        matched: Any = F("payload")
        for key in json_path_parse(event_path):
            matched = KeyTransform(key, matched)
        # JSON equality in the database: a number matches a number, a string a string.
        events = events.alias(matched=matched).filter(matched=value)
    event = events.order_by("received_at", "id").values_list("payload", flat=True).first()
    if event is None:
        return EventCheck(waited=waited)
    # An event's payload is a JSON object (the events API takes nothing else).
    return EventCheck(payload=event if isinstance(event, dict) else {"payload": event}, waited=waited)
