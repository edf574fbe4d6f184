"""``Idempotency-Key`` for create requests: a retried POST gets the first response back.

The key row is inserted in the same transaction that creates the task. A concurrent duplicate's
insert waits on the unique (owner, scope, key) index until the first transaction ends: if it committed,
the duplicate replays its stored response; if it rolled back (the request failed), the duplicate
goes ahead as the first. So two requests with one key never create two tasks. Only successful
responses are stored; a failed request can be retried with the same key.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction

from tasks_app.models import ApiIdempotencyKey
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import IdempotencyKeyReused, InvalidInput

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
_ALLOWED = frozenset(string.ascii_letters + string.digits + string.punctuation + " ")


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: Any
    #: True when this is the stored response of an earlier request with the same key.
    replayed: bool = False


def idempotency_key_clean(value: str | None) -> str | None:
    """Return the header's key, None when absent; raise :class:`InvalidInput` when malformed."""
    if value is None:
        return None
    if not value or len(value) > MAX_KEY_LENGTH or not set(value) <= _ALLOWED:
        raise InvalidInput.on(HEADER, f"Must be 1 to {MAX_KEY_LENGTH} printable ASCII characters, such as a UUID.")
    return value


def request_fingerprint(*, method: str, path: str, body: Any) -> str:
    """A digest of what makes two requests "the same": method, path and body."""
    canonical = json.dumps(
        {"method": method.upper(), "path": path.rstrip("/"), "body": body},
        sort_keys=True,
        separators=(",", ":"),
        cls=DjangoJSONEncoder,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotent_create(
    *,
    owner: User,
    key: str | None,
    fingerprint: str,
    create: Callable[[], tuple[int, Any]],
    scope: str = "",
) -> StoredResponse:
    """Run ``create`` (which returns the response's status and JSON body) at most once per key.

    With no key it just runs. With a key seen before (and not expired) it returns the stored
    response instead, or raises :class:`IdempotencyKeyReused` if the earlier request differed.
    Keys are the owner's, in ``scope``: "" for the owner's own requests, :func:`trigger_url_scope`
    for a trigger URL's (a trigger URL's holder and the owner never share a key).
    """
    if key is None:
        status, body = create()
        return StoredResponse(status, body)
    ttl = timedelta(seconds=tms_settings().IDEMPOTENCY_KEY_TTL)
    with transaction.atomic():
        ApiIdempotencyKey.objects.filter(owner=owner, scope=scope, key=key, created_at__lt=db_now() - ttl).delete()
        try:
            with transaction.atomic():
                record = ApiIdempotencyKey.objects.create(
                    owner=owner,
                    scope=scope,
                    key=key,
                    request_fingerprint=fingerprint,
                    response_status=0,
                    response_body=None,
                )
        except IntegrityError:
            # The first request with this key committed while we waited on the unique index.
            stored = ApiIdempotencyKey.objects.get(owner=owner, scope=scope, key=key)
            if stored.request_fingerprint != fingerprint:
                raise IdempotencyKeyReused(
                    f"This {HEADER} was already used with a different request; use a new key."
                ) from None
            return StoredResponse(stored.response_status, stored.response_body, replayed=True)
        status, body = create()
        record.response_status, record.response_body = status, body
        record.save(update_fields=["response_status", "response_body"])
    return StoredResponse(status, body)


def trigger_url_scope(hook_id: str) -> str:
    """The key namespace of trigger URL ``hook_id``'s requests (its own, apart from its owner's)."""
    return f"trigger-url:{hook_id}"


def idempotency_keys_expire() -> int:
    """Delete keys older than their time to live; returns how many."""
    cutoff = db_now() - timedelta(seconds=tms_settings().IDEMPOTENCY_KEY_TTL)
    deleted, _ = ApiIdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted
