"""Trigger URLs: make, rotate and remove a task's, and start a run through one.

A trigger URL (:class:`tasks_app.models.TaskHook`) lets an outside system start a run of one
task without a user's token, proving itself with the URL's own secret (:mod:`tasks_app.hooks`).
A run it starts goes through :func:`tasks_api.triggers.task_trigger`, as ``POST
/api/v1/tasks/{id}/trigger`` does, so the team's quota, ``trigger_debounce`` and the
``Idempotency-Key`` header behave the same; the audit log names the trigger URL as who acted.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.http import HttpRequest

from tasks_api.task_writes import _lock
from tasks_api.triggers import task_check_input, task_trigger
from tasks_app.audit import acting_token, audit_context, audit_record
from tasks_app.hooks import HookRefused, hook_check, hook_new_id, hook_new_secret, hook_signature_remember
from tasks_app.idempotency import StoredResponse, idempotent_create, request_fingerprint, trigger_url_scope
from tasks_app.models import EventHook, EventHookSignature, Task, TaskHook, TaskHookSignature, TaskStatus
from tasks_app.secrets import SecretsUnavailable, text_open, text_seal
from tms_core.clock import db_now
from tms_core.errors import ConflictError
from tms_core.public_url import public_url

#: The path of the inbound endpoint, below the site's root (:func:`tms_core.public_url.public_url`).
PATH = "/hooks/v1/"
#: The audit source of what a trigger URL does.
SOURCE = "trigger-url"


def hook_url(hook: TaskHook, *, request: HttpRequest | None = None) -> str:
    """Where the outside system sends its requests: below ``TMS_PUBLIC_URL``, or when that is unset
    below the address ``request`` (the one showing the URL) reached."""
    return f"{public_url(request)}{PATH}{hook.pk}"


def hook_actor(hook_id: str) -> str:
    """How the audit log and the execution's events name a trigger URL (its id's first characters:
    enough to tell it apart, too little to be mistaken for the whole URL)."""
    return f"trigger URL {hook_id[:8]}"


@dataclass(frozen=True)
class HookMade:
    """A trigger URL just made or rotated, with its secret in the clear: shown once, never again."""

    hook: TaskHook
    secret: str
    rotated: bool


#: What a signed URL's audit entry says it did, by its action's verb (``trigger_url.<verb>``).
AUDIT_SAID = {"create": "made", "rotate": "secret rotated", "delete": "removed"}


def hook_secret_put(
    model: type[TaskHook] | type[EventHook],
    hook: TaskHook | EventHook | None,
    secret: str,
    *,
    keys: dict[str, Any],
    holder: dict[str, Any],
) -> tuple[Any, bool]:
    """``hook`` (a trigger URL or an event URL) with ``secret`` (sealed) as its secret and
    ``holder``'s fields (who made it) set, or when it is None a new ``model`` row for ``keys`` (what
    it belongs to); and whether it was rotated (the URL kept, the old secret refused from now on).
    Call it in the caller's transaction, the row locked."""
    if hook is None:
        return model.objects.create(id=hook_new_id(), secret=text_seal(secret), **keys, **holder), False
    hook.secret, hook.rotated_at = text_seal(secret), db_now()
    for name, value in holder.items():
        setattr(hook, name, value)
    hook.save(update_fields=["secret", "rotated_at", *holder])
    return hook, True


def _audit(task: Task, verb: str, hook_id: str) -> None:
    """The audit entry of ``task``'s trigger URL ``hook_id``'s change (never its secret)."""
    detail = f"{AUDIT_SAID[verb]}: {hook_actor(hook_id)}"
    audit_record(
        action=f"trigger_url.{verb}",
        object_type="task",
        object_id=task.pk,
        owner=task.owner_id,
        task_id=task.pk,
        detail=detail,
    )


def task_hook_set(*, task: Task) -> HookMade:
    """Give ``task`` a trigger URL with a new secret; if it has one, only the secret changes (the
    URL stays) and the old secret stops working at once. Audited (``trigger_url.create`` or
    ``trigger_url.rotate``), never with the secret."""
    secret = hook_new_secret()
    with transaction.atomic():
        task = _lock(task.pk)
        hook = TaskHook.objects.select_for_update().filter(task=task).first()
        # The new secret is a credential of whoever made it: a token's, listed and undone with it.
        holder = {"created_by_token": acting_token()}
        hook, rotated = hook_secret_put(TaskHook, hook, secret, keys={"task": task}, holder=holder)
        _audit(task, "rotate" if rotated else "create", hook.pk)
    hook.refresh_from_db()
    return HookMade(hook=hook, secret=secret, rotated=rotated)


def task_hook_delete(*, task: Task) -> bool:
    """Remove ``task``'s trigger URL (its requests answer 404 from now on); False if it had none."""
    with transaction.atomic():
        task = _lock(task.pk)
        hook = TaskHook.objects.filter(task=task).first()
        if hook is None:
            return False
        hook_id = hook.pk
        hook.delete()
        _audit(task, "delete", hook_id)
    return True


def body_input(body: bytes) -> dict[str, Any] | None:
    """The run's input a trigger URL's body gives: the body when it is a JSON object (whatever
    its content type says), else none (a form, plain text, a JSON list: the run starts without
    input, as before bodies were read)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        value = json.loads(body)
    except ValueError:  # not JSON (nor UTF-8): no input
        return None
    return value if isinstance(value, dict) else None


class HookNotFound(LookupError):
    """No trigger URL has this id (never made, removed, or its task deleted)."""


def hook_fire(*, hook_id: str, request: SignedRequest) -> StoredResponse:
    """Start a run of the trigger URL's task if the request proves itself (:func:`hook_check`).

    Raises :class:`HookNotFound` (unknown id, deleted task), :class:`HookRefused` (bad or missing
    signature, old timestamp, wrong bearer secret), :class:`ConflictError` (the task is paused:
    pausing a task stops what others start, while its owner can still run it by hand; or
    :class:`~tasks_app.hooks.HookReplayed`: this signed request was already accepted) and what
    :func:`task_trigger` raises (quota; :class:`InvalidInput` on ``input`` for a JSON body that
    the task's ``input_schema`` refuses). A body that is a JSON object becomes the run's input
    (:func:`body_input`). Nothing is written before the request is proven.
    """
    hook = TaskHook.objects.select_related("task", "task__owner").filter(pk=hook_id).first()
    if hook is None or hook.task.status == TaskStatus.DELETED:
        raise HookNotFound(hook_id)
    proven = hook_prove(hook, request, what="trigger URL", path=PATH + hook.pk)
    task = hook.task
    if task.status == TaskStatus.PAUSED:
        raise ConflictError("The task is paused: its trigger URL starts no run until it is resumed.")
    actor = hook_actor(hook.pk)
    run_input = body_input(request.body)
    task_check_input(task=task, run_input=run_input)  # 400 on ``input``, before anything is stored

    def create() -> tuple[int, Any]:
        trigger = task_trigger(task=task, actor=actor, run_input=run_input)
        execution = trigger.execution
        answer = {
            "execution": execution.pk,
            "task": str(task.pk),
            "status": execution.status,
            "due_at": execution.due_at,
            "joined": trigger.joined,
        }
        return (200 if trigger.joined else 202), answer

    # The trigger URL's own key namespace: its holder cannot replay or block the owner's.
    return proven.answer(owner=task.owner, scope=trigger_url_scope(hook.pk), source=SOURCE, actor=actor, create=create)


@dataclass(frozen=True)
class SignedRequest:
    """A request to a signed URL (a trigger URL or an event URL), as it arrived."""

    headers: Mapping[str, str]
    body: bytes
    #: Its ``Idempotency-Key`` (cleaned), if any.
    idempotency_key: str | None = None
    #: The client's address, for the audit log.
    remote_addr: str | None = None


@dataclass(frozen=True)
class ProvenRequest:
    """A :class:`SignedRequest` that proved itself with the URL's secret (:func:`hook_prove`);
    :meth:`answer` answers it once. Both kinds of URL share this so that they prove, remember and
    replay requests alike."""

    hook: TaskHook | EventHook
    #: The request's path (the fingerprint of an ``Idempotency-Key``).
    path: str
    request: SignedRequest
    #: How it proved itself: ``"signature"`` or ``"bearer"`` (:func:`hook_check`).
    proof: str
    #: The server's Unix time the proof was judged by.
    now: float

    def answer(
        self, *, owner: Any, scope: str, source: str, actor: str, create: Callable[[], tuple[int, Any]]
    ) -> StoredResponse:
        """What ``create`` answers, stored under the request's ``Idempotency-Key`` in ``scope``
        (a repeated key answers the stored response), in one transaction with the signed request
        remembered (a copy sent again is :class:`~tasks_app.hooks.HookReplayed`), audited as
        ``actor`` from ``source``; then the URL's ``last_used_at`` moves."""
        request = self.request
        # The body's digest, not the body: an event's body may be anything (and large); the
        # timestamp and signature are left out, so a retried event (signed again) is the same request.
        fingerprint = (
            request_fingerprint(method="POST", path=self.path, body=hashlib.sha256(request.body).hexdigest())
            if request.idempotency_key
            else ""
        )
        signatures = EventHookSignature if isinstance(self.hook, EventHook) else TaskHookSignature
        with audit_context(source=source, actor_name=actor, remote_addr=request.remote_addr), transaction.atomic():
            if self.proof == "signature":
                # Remembered with what it starts: a copy of this request sent again is a 409.
                hook_signature_remember(hook_id=self.hook.pk, headers=request.headers, now=self.now, model=signatures)
            stored = idempotent_create(
                owner=owner, key=request.idempotency_key, fingerprint=fingerprint, create=create, scope=scope
            )
        type(self.hook).objects.filter(pk=self.hook.pk).update(last_used_at=Now())
        return stored


def hook_prove(hook: TaskHook | EventHook, request: SignedRequest, *, what: str, path: str) -> ProvenRequest:
    """``request`` to ``hook``'s ``path``, proven with its secret (:func:`hook_check`), or
    :class:`HookRefused` (``what`` names the URL in the message) when it does not prove itself or
    the secret cannot be read. Writes nothing."""
    try:
        secret = text_open(hook.secret)
    except SecretsUnavailable:
        raise HookRefused(f"This {what}'s secret cannot be read (a key was removed): make a new one.") from None
    now = time.time()
    proof = hook_check(secret=secret, headers=request.headers, body=request.body, now=now)
    return ProvenRequest(hook=hook, path=path, request=request, proof=proof, now=now)
