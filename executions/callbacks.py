"""Callback URLs: a job pushes its heartbeat, progress or outcome instead of waiting to be polled.

Each attempt gets its own URL, ``/api/v1/executions/<id>/callback?token=…``, whose token is
signed (``django.core.signing``), names the execution and the attempt, and expires an hour after
the task's timeout. A token for another execution, for an earlier attempt or past its age is
refused, and a report changes nothing once the attempt has ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing

_SALT = "tms.executions.callback"
#: How long after the task's timeout a callback token is still accepted.
GRACE = timedelta(hours=1)


class CallbackRefused(Exception):
    """The token does not allow this report; the message says why."""


def callback_token(*, execution_id: int, attempt: int) -> str:
    return signing.dumps({"e": execution_id, "a": attempt}, salt=_SALT, compress=True)


def callback_url(*, execution_id: int, attempt: int) -> str:
    """The URL this attempt's job may POST to (its token is accepted until the task's timeout
    plus :data:`GRACE` has passed)."""
    token = callback_token(execution_id=execution_id, attempt=attempt)
    return f"{settings.TMS_PUBLIC_URL}/api/v1/executions/{execution_id}/callback?token={token}"


@dataclass(frozen=True)
class CallbackClaim:
    execution_id: int
    attempt: int


def callback_verify(*, token: str, execution_id: int, max_age: timedelta) -> CallbackClaim:
    """Check a token against the execution it is used for; raise CallbackRefused if invalid."""
    try:
        payload: Any = signing.loads(token, salt=_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise CallbackRefused("The callback token has expired.") from None
    except signing.BadSignature:
        raise CallbackRefused("The callback token is not valid.") from None
    if not isinstance(payload, dict) or payload.get("e") != execution_id:
        raise CallbackRefused("The callback token belongs to another execution.")
    return CallbackClaim(execution_id=execution_id, attempt=int(payload["a"]))
