"""Put a service's validation error onto a Django form, field by field.

Services raise :class:`tms_core.errors.InvalidInput` (``errors``: field -> messages); some still
raise DRF's ``ValidationError`` or Django's. The admin and the back-office forms call a service
and show whatever it refused on the fields it names, and the rest (``non_field_errors``, fields
the form does not have, conflicts) at the top of the form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import ValidationError as DrfValidationError

from tms_core.errors import DomainError, InvalidInput

#: Every error a service may raise about its input or the object's state.
SERVICE_ERRORS = (InvalidInput, DomainError, DrfValidationError, DjangoValidationError)


def _messages(detail: Any, prefix: str = "") -> list[str]:
    """Flatten nested error details (``{"config": {"url": ["..."]}}``) to readable strings."""
    if isinstance(detail, Mapping):
        return [message for key, value in detail.items() for message in _messages(value, f"{prefix}{key}: ")]
    if isinstance(detail, list | tuple):
        return [message for item in detail for message in _messages(item, prefix)]
    return [f"{prefix}{detail}"]


def error_map(exc: Exception) -> dict[str, list[str]]:
    """``exc`` as field -> messages (``__all__`` for errors about the whole request)."""
    if isinstance(exc, InvalidInput):
        detail: Any = exc.errors
    elif isinstance(exc, DrfValidationError):
        detail = exc.detail
    elif isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
    else:
        detail = {NON_FIELD_ERRORS: [getattr(exc, "message", str(exc))]}
    if not isinstance(detail, Mapping):
        detail = {NON_FIELD_ERRORS: detail}
    errors: dict[str, list[str]] = {}
    for field, value in detail.items():
        name = NON_FIELD_ERRORS if field in ("non_field_errors", None) else str(field)
        errors.setdefault(name, []).extend(_messages(value))
    return errors


def add_service_errors(form: forms.BaseForm, exc: Exception) -> None:
    """Add ``exc``'s messages to ``form``: on the fields it names, the rest at the top (with the
    field's name, so nothing is lost)."""
    for field, messages in error_map(exc).items():
        for message in messages:
            if field in form.fields:
                form.add_error(field, message)
            elif field == NON_FIELD_ERRORS:
                form.add_error(None, message)
            else:
                form.add_error(None, f"{field}: {message}")
