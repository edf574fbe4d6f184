"""Notification rules as the back office shows them, on the notifications page and a task's page:
the rules that speak for a task, a rule in words, and what a user may do with each."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from backoffice.forms import RULE_DURATIONS, RULE_EVENTS
from notifications.models import Channel, Rule
from tasks_app import teams
from tasks_app.models import TeamRole
from tms_core.durations import format_duration


def task_rules(task: Any) -> tuple[list[Rule], bool]:
    """The rules that speak for ``task`` and whether they are its team's defaults."""
    # One query for both: the task's own rules and its team's defaults, then the own ones if any.
    rules = list(
        Rule.objects.filter(Q(task=task) | Q(task__isnull=True), team_id=task.team_id)
        .select_related("channel")
        .order_by("id")
    )
    own = [rule for rule in rules if rule.task_id is not None]
    return (own, False) if own else (rules, True)


def may_act_on(user: Any, obj: Channel | Rule, verb: str) -> bool:
    """Whether ``user`` may ``verb`` (change, delete; sending a test is a change) a channel or
    rule: the editor role in its team, or the model permission (:func:`tasks_app.teams.may`).
    Reads ``caller_role`` when the list annotated it (:func:`tasks_app.teams.with_role`)."""
    model = "channel" if isinstance(obj, Channel) else "rule"
    permission = f"notifications.{verb}_{model}"
    if hasattr(obj, "caller_role"):
        return teams.includes(obj.caller_role, TeamRole.EDITOR) or bool(user.has_perm(permission))
    return teams.may(user, obj.team_id, TeamRole.EDITOR, permission)


def rule_words(rule: Rule) -> str:
    """What a rule tells about, in words."""
    parts = [words.split(" (")[0] for name, words in RULE_EVENTS if getattr(rule, name)]
    for name, words in RULE_DURATIONS[:3]:
        value = getattr(rule, name)
        if value is not None:
            parts.append(f"{words.lower()} {format_duration(value)}")
    text = "; ".join(parts) or "nothing"
    if rule.digest_every is not None:
        text += f" (one digest every {format_duration(rule.digest_every)})"
    return text


def rule_rows(rules: Any, user: Any) -> list[dict[str, Any]]:
    """The rows of a rules table: each rule, its words and what ``user`` may do with it."""
    return [
        {
            "rule": r,
            "words": rule_words(r),
            "can_change": may_act_on(user, r, "change"),
            "can_delete": may_act_on(user, r, "delete"),
        }
        for r in rules
    ]
