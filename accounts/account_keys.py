"""Account keys: a user's one all-powers API key (``manage.py tms_create_user`` prints it).

They were DRF's ``authtoken`` keys, kept in clear in ``authtoken_token``; now only the SHA-256
of the key is stored (:class:`accounts.models.AccountKey`), as for personal access tokens, and the
key is shown once, when it is made. Keys made before were hashed into the new table by migration
``accounts.0004``: clients keep sending the same key. A key is 40 hex characters (160 random
bits), the shape DRF's were, so clients and log filters that know that shape still do.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import transaction

from accounts.models import AccountKey


def account_key_digest(key: str) -> str:
    """What the database keeps of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def account_key_create(*, user: Any) -> str:
    """Give ``user`` a new account key, replacing the one they had; return it (nothing can show it
    again)."""
    key = secrets.token_hex(20)
    with transaction.atomic():
        AccountKey.objects.filter(user_id=user.pk).delete()
        AccountKey.objects.create(user_id=user.pk, digest=account_key_digest(key))
    return key


def account_key_exists(*, user: Any) -> bool:
    """Whether ``user`` has an account key."""
    return AccountKey.objects.filter(user_id=user.pk).exists()
