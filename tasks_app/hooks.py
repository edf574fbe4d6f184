"""Trigger URLs (``/hooks/v1/<id>``): how an outside system proves it may start a task's run.

The conventions are those of TMS's own outgoing webhooks (docs/notifications.md), turned around:
the caller sends ``X-TMS-Timestamp`` (Unix time, whole seconds) and ``X-TMS-Signature``, the hex
HMAC-SHA256 of ``"{timestamp}.{body}"`` under the trigger URL's secret. A timestamp further than
:data:`TOLERANCE` seconds from the server's clock is refused, so a captured request cannot be
replayed later; and within that window each signed request is remembered
(:func:`hook_signature_remember`, in PostgreSQL) so that the same one sent again is refused
(:class:`HookReplayed`, a 409) instead of starting another run. The signature is compared in
constant time. A caller that cannot compute an HMAC
(a SaaS form with a "secret header" field) may send ``Authorization: Bearer <secret>`` instead:
weaker (the secret travels with each request, and a captured request can be replayed until the
secret is rotated), which docs/triggers.md says.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from tms_core.errors import ConflictError

if TYPE_CHECKING:
    from django.db.models import Model

SIGNATURE_HEADER = "X-TMS-Signature"
TIMESTAMP_HEADER = "X-TMS-Timestamp"
#: Seconds a signed request's timestamp may differ from the server's clock (either way).
TOLERANCE = 300
#: Random bytes of a trigger URL's id and of its secret (url-safe base64: 32 and 43 characters).
ID_BYTES = 24
SECRET_BYTES = 32
#: The secret's visible prefix, so a leaked one is recognised (by secret scanners, by people).
SECRET_PREFIX = "tms_hook_"  # noqa: S105 - a prefix, not a secret


class HookRefused(Exception):
    """The request is not signed (or authorised) by the trigger URL's secret; the message says why."""


class HookReplayed(ConflictError):
    """This signed request was already accepted: a copy sent again (replayed) starts nothing."""

    code = "request_replayed"


def hook_new_id() -> str:
    """A new trigger URL's id: random, saying nothing of the task."""
    return secrets.token_urlsafe(ID_BYTES)


def hook_new_secret() -> str:
    """A new secret (shown once, stored encrypted)."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def hook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"{timestamp}.{body}"`` under ``secret`` (what ``X-TMS-Signature`` holds)."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def hook_check(*, secret: str, headers: Mapping[str, str], body: bytes, now: float) -> str:
    """Check a request against the trigger URL's ``secret``; answer how it proved itself
    (``"signature"`` or ``"bearer"``) or raise :class:`HookRefused` saying what is wrong.
    ``now`` is the server's Unix time."""
    bearer = _bearer(headers)
    if bearer is not None:
        if bearer and hmac.compare_digest(bearer.encode(), secret.encode()):
            return "bearer"
        raise HookRefused("The bearer token is not this trigger URL's secret.")
    signature = headers.get(SIGNATURE_HEADER, "").strip()
    timestamp = headers.get(TIMESTAMP_HEADER, "").strip()
    if not signature or not timestamp:
        raise HookRefused(
            f"Sign the request: {TIMESTAMP_HEADER} (Unix time in seconds) and {SIGNATURE_HEADER} (hex HMAC-SHA256 "
            'of "{timestamp}.{body}" under the secret), or send Authorization: Bearer <secret>.'
        )
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise HookRefused(f"{TIMESTAMP_HEADER} must be Unix time in whole seconds, such as 1767225600.")
    if abs(now - int(timestamp)) > TOLERANCE:
        raise HookRefused(
            f"{TIMESTAMP_HEADER} is more than {TOLERANCE} seconds away from the server's time (a replayed or "
            "delayed request, or a wrong clock): sign it again with the current time."
        )
    given = signature.lower().removeprefix("sha256=")
    if not hmac.compare_digest(hook_signature(secret, timestamp, body).encode(), given.encode()):
        raise HookRefused(f"{SIGNATURE_HEADER} does not match the body and timestamp under this trigger URL's secret.")
    return "signature"


def hook_signature_remember(
    *, hook_id: str, headers: Mapping[str, str], now: float, model: type[Model] | None = None
) -> None:
    """Remember the signed request ``headers`` carry (checked by :func:`hook_check`) as accepted
    by trigger URL ``hook_id``, until its timestamp leaves the tolerance; raise
    :class:`HookReplayed` when it was already (a request can be accepted once). Call it in the
    transaction that starts the run: if that fails and rolls back, the request was not accepted,
    and the same request may be sent again. Two copies at once: the second waits on the unique
    index for the first's transaction, then is refused if it committed. Also forgets this
    trigger URL's requests whose timestamps have left the tolerance (``now``: the server's Unix
    time, the clock :func:`hook_check` judged them by)."""
    from django.db import IntegrityError, transaction

    from tasks_app.models import TaskHookSignature

    memory: Any = model or TaskHookSignature  # an event URL's: EventHookSignature
    timestamp = headers.get(TIMESTAMP_HEADER, "").strip()
    signature = headers.get(SIGNATURE_HEADER, "").strip().lower().removeprefix("sha256=")
    digest = hashlib.sha256(f"{timestamp}.{signature}".encode()).hexdigest()
    memory.objects.filter(hook_id=hook_id, expires_at__lt=datetime.fromtimestamp(now, UTC)).delete()
    try:
        with transaction.atomic():
            memory.objects.create(
                hook_id=hook_id,
                digest=digest,
                expires_at=datetime.fromtimestamp(int(timestamp) + TOLERANCE, UTC),
            )
    except IntegrityError:
        raise HookReplayed(
            "This signed request was already received (the same timestamp and signature): it starts no other run. "
            f"To start another, sign the request again with the current time in {TIMESTAMP_HEADER}."
        ) from None


def hook_signatures_expire() -> int:
    """Forget the signed requests whose timestamps can no longer be accepted (with a margin of
    the tolerance again, for a web clock ahead of the database's); returns how many."""
    from tasks_app.models import EventHookSignature, TaskHookSignature
    from tms_core.clock import db_now

    cutoff = db_now() - timedelta(seconds=TOLERANCE)
    deleted, _ = TaskHookSignature.objects.filter(expires_at__lt=cutoff).delete()
    events, _ = EventHookSignature.objects.filter(expires_at__lt=cutoff).delete()
    return deleted + events


def rotate_hook_secrets(batch: int) -> tuple[int, int, list[str]]:
    """Re-encrypt every trigger URL's and event URL's secret with the first key of
    ``TMS_SECRET_KEYS`` (``manage.py tms_rotate_keys`` calls this): (rows, values, ids no key
    opens). In batches of locked rows, by id."""
    from django.db import transaction

    from tasks_app.models import EventHook, TaskHook
    from tasks_app.secrets import SecretsUnavailable, text_rotate

    rows = 0
    failed: list[str] = []
    model: Any
    for model in (TaskHook, EventHook):
        last = ""
        while True:
            with transaction.atomic():
                found = list(model.objects.select_for_update().filter(pk__gt=last).order_by("pk")[:batch])
                for hook in found:
                    try:
                        secret = text_rotate(hook.secret)
                    except SecretsUnavailable:
                        failed.append(hook.pk)
                        continue
                    model.objects.filter(pk=hook.pk).update(secret=secret)
                    rows += 1
            if len(found) < batch:
                break
            last = found[-1].pk
    return rows, rows, failed
