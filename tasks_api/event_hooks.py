"""Signed event URLs: make, rotate and remove a team's URL for one event name, and post the event
through one. An outside system posts the event without a user's token, proving itself with the
URL's secret exactly as a trigger URL's (:mod:`tasks_app.hooks`: a signature over the timestamp
and body, each signed request accepted once, or the secret as a bearer token); what the event
does is :func:`tasks_api.events.event_post`'s, in the URL's team alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.http import HttpRequest

from tasks_api.events import EventPosted, event_post
from tasks_api.hooks import AUDIT_SAID, HookNotFound, SignedRequest, body_input, hook_prove, hook_secret_put
from tasks_app.audit import audit_record
from tasks_app.event_subscriptions import event_name_check
from tasks_app.hooks import hook_new_secret
from tasks_app.idempotency import StoredResponse
from tasks_app.models import EventHook, Team
from tms_core.errors import InvalidInput
from tms_core.public_url import public_url

#: The path of the inbound endpoint, below the site's root.
PATH = "/hooks/v1/events/"
#: The audit source of what an event URL does.
SOURCE = "event-url"


def event_hook_url(hook: EventHook, *, request: HttpRequest | None = None) -> str:
    """Where the outside system posts (below ``TMS_PUBLIC_URL``, else the request's address)."""
    return f"{public_url(request)}{PATH}{hook.pk}"


def event_hook_actor(hook_id: str) -> str:
    """How the audit log and the runs' events name an event URL (its id's first characters)."""
    return f"event URL {hook_id[:8]}"


@dataclass(frozen=True)
class EventHookMade:
    """An event URL just made or rotated, with its secret in the clear: shown once, never again."""

    hook: EventHook
    secret: str
    rotated: bool


def event_hook_set(*, team: Team, name: str, owner: Any) -> EventHookMade:
    """Give ``team`` an event URL for ``name`` with a new secret; if it has one, only the secret
    changes (the old one is refused at once). Audited, never with the secret."""
    try:
        event_name_check(name)
    except Exception as exc:  # noqa: BLE001 - a DRF ValidationError: its message on the name
        raise InvalidInput({"name": [str(getattr(exc, "detail", [exc])[0])]}) from None
    secret = hook_new_secret()
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()  # one maker at a time per team
        hook = EventHook.objects.filter(team=team, name=name).first()
        hook, rotated = hook_secret_put(
            EventHook, hook, secret, keys={"team": team, "name": name}, holder={"owner": owner}
        )
        _audit(team, "rotate" if rotated else "create", hook.pk, name)
    hook.refresh_from_db()
    return EventHookMade(hook=hook, secret=secret, rotated=rotated)


def event_hook_delete(*, team: Team, name: str, actor: Any) -> bool:
    """Remove ``team``'s event URL for ``name`` (its requests answer 404 from now on)."""
    with transaction.atomic():
        hook = EventHook.objects.filter(team=team, name=name).first()
        if hook is None:
            return False
        hook_id = hook.pk
        hook.delete()
        _audit(team, "delete", hook_id, name)
    return True


def _audit(team: Team, verb: str, hook_id: str, name: str) -> None:
    """The audit entry of ``team``'s event URL ``hook_id``'s change (never its secret)."""
    detail = f"{AUDIT_SAID[verb]}: {event_hook_actor(hook_id)} for event {name}"
    audit_record(action=f"event_url.{verb}", object_type="team", object_id=team.pk, owner=None, detail=detail)


def event_hook_fire(*, hook_id: str, request: SignedRequest) -> StoredResponse:
    """Post the event URL's event if the request proves itself: the body, when a JSON object, is
    the payload (else ``{}``). Raises :class:`HookNotFound`, :class:`HookRefused`,
    :class:`~tasks_app.hooks.HookReplayed` (409) and :func:`event_post`'s errors (a payload it
    refuses: 400 on ``payload``). Nothing is written before the request is proven."""
    hook = EventHook.objects.select_related("owner").filter(pk=hook_id).first()
    if hook is None:
        raise HookNotFound(hook_id)
    proven = hook_prove(hook, request, what="event URL", path=PATH + hook.pk)
    actor = event_hook_actor(hook.pk)
    payload = body_input(request.body) or {}

    def create() -> tuple[int, Any]:
        posted: EventPosted = event_post(team_ids=[hook.team_id], name=hook.name, payload=payload, actor=actor)
        answer = {
            "name": posted.name,
            "events": posted.event_ids,
            "tasks": [
                {"task": str(row.task.pk), "outcome": row.outcome, "execution": row.execution_id}
                for row in posted.tasks
            ],
            "waits_nudged": posted.nudged,
        }
        return 202, answer

    return proven.answer(owner=hook.owner, scope=f"event-url:{hook.pk}", source=SOURCE, actor=actor, create=create)
