"""Callback tokens: a job pushes its heartbeat, progress or outcome instead of waiting to be polled.

Each attempt gets the URL ``/api/v1/executions/<id>/callback`` and a token, which the job sends
in a header (``X-TMS-Callback-Token: <token>`` or ``Authorization: Bearer <token>``), never in the
URL, where access logs and proxies would keep it. The token is signed (``django.core.signing``),
names the execution and the attempt, and carries its own expiry: ``min(task timeout,
CALLBACK_TOKEN_MAX_AGE)`` plus ``CALLBACK_TOKEN_GRACE`` from when it was issued, so a task with a
timeout of years still gets a token of an hour. A job that reports for longer renews it: every
accepted heartbeat or progress report answers with a fresh token.

A token is checked entirely from its signature, before the execution is looked up, so a caller
without a valid token learns nothing about which executions exist.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core import signing

from tms_core.conf import tms_settings
from tms_core.public_url import public_url

_SALT = "tms.executions.callback"
#: Where a job puts its token (``Authorization: Bearer <token>`` is accepted as well).
TOKEN_HEADER = "X-TMS-Callback-Token"  # noqa: S105 (a header name, not a secret)


class CallbackRefused(Exception):
    """The token does not allow this report; the message says why."""


def token_lifetime(timeout: timedelta | float) -> float:
    """Seconds a token issued now stays valid for an attempt that may take ``timeout``."""
    conf = tms_settings()
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return min(max(seconds, 0.0), conf.CALLBACK_TOKEN_MAX_AGE) + conf.CALLBACK_TOKEN_GRACE


def callback_token(*, execution_id: int, attempt: int, timeout: timedelta | float) -> str:
    """A token for this attempt's reports, valid for :func:`token_lifetime` of ``timeout``."""
    expires = int(time.time() + token_lifetime(timeout))
    return signing.dumps({"e": execution_id, "a": attempt, "x": expires}, salt=_SALT, compress=True)


def callback_url(*, execution_id: int) -> str:
    """The URL the job of any attempt of this execution POSTs its reports to (with its token).

    Built by a worker, with no request to say where the site is: ``TMS_PUBLIC_URL``, or
    :data:`tms_core.public_url.FALLBACK` when it is unset."""
    return f"{public_url()}/api/v1/executions/{execution_id}/callback"


@dataclass(frozen=True)
class CallbackClaim:
    execution_id: int
    attempt: int


def callback_verify(*, token: str, execution_id: int) -> CallbackClaim:
    """Check a token for the execution it is used for, from its signature alone (no database);
    raise CallbackRefused if it does not allow a report."""
    conf = tms_settings()
    # The signature's own age bounds any token, whatever expiry it claims.
    hard_limit = timedelta(seconds=conf.CALLBACK_TOKEN_MAX_AGE + conf.CALLBACK_TOKEN_GRACE)
    try:
        payload: Any = signing.loads(token, salt=_SALT, max_age=hard_limit)
    except signing.SignatureExpired:
        raise CallbackRefused("The callback token has expired.") from None
    except signing.BadSignature:
        raise CallbackRefused("The callback token is not valid.") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("x"), int) or not isinstance(payload.get("a"), int):
        raise CallbackRefused("The callback token is not valid.")
    if payload["x"] < time.time():
        raise CallbackRefused("The callback token has expired.")
    if payload.get("e") != execution_id:
        raise CallbackRefused("The callback token belongs to another execution.")
    return CallbackClaim(execution_id=execution_id, attempt=payload["a"])
