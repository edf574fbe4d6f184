"""Domain errors raised by services; :mod:`tms_core.api.errors` maps each to one HTTP answer.

Services stay free of HTTP: they say *what* went wrong (the request conflicts with the current
state, an idempotency key was reused with another request, ...), the API layer says how to answer.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied


class DomainError(Exception):
    """Base class: ``code`` is the machine-readable ``type`` of the API error."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConflictError(DomainError):
    """The request is valid but conflicts with the current state (e.g. cancelling a finished run)."""

    code = "conflict"


class GoneError(DomainError):
    """The object the request is about no longer exists for the caller (e.g. deleted meanwhile)."""

    code = "not_found"


class IdempotencyKeyReused(DomainError):
    """An ``Idempotency-Key`` was sent again with a different request."""

    code = "idempotency_key_reused"


class InvalidInput(DomainError):
    """The request is malformed for the business rules: ``errors`` maps each field to its messages.

    Services raise this (never DRF's ``ValidationError``) so that every caller can present the
    errors its own way: the API as a 400 with per-field messages, the admin and the back-office
    forms as errors on the fields they name (``non_field_errors`` for the request as a whole).
    """

    code = "validation_error"

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__("Invalid input.")
        self.errors = errors

    @classmethod
    def on(cls, field: str, message: str) -> InvalidInput:
        """The error for one field with one message."""
        return cls({field: [message]})


class QuotaExceeded(DomainError):
    """The owner used up a rolling-window quota; ``retry_after`` is how many seconds until the
    request would fit again (the API answers 429 with a ``Retry-After`` header)."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


class RoleRequired(PermissionDenied):
    """A 403 for want of a role in the object's team: Django's PermissionDenied (the API answers
    it as any 403, with ``message``), carrying the role needed and the one held (None: not a
    member) so that the back office's 403 page can name them."""

    def __init__(self, message: str, *, role: str, held: str | None) -> None:
        super().__init__(message)
        self.message, self.role, self.held = message, role, held
