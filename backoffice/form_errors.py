"""Errors from the API's serializers and from the services, put on a Django form.

The pages validate with the same serializers as the API and write through the same services,
so bad input gets the same messages; this puts them where a person reads them: on the field
they name, or above the form when they name none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from rest_framework.exceptions import ErrorDetail
from rest_framework.exceptions import ValidationError as DRFValidationError

from tms_core.errors import DomainError, InvalidInput

#: Keys that mean "the request as a whole".
_GENERAL = frozenset({"non_field_errors", "__all__", "detail"})


def error_messages(detail: Any, prefix: str = "") -> list[str]:
    """Flatten a (nested) error detail into messages, naming nested fields (``url: Enter a URL.``)."""
    if isinstance(detail, Mapping):
        messages = []
        for key, value in detail.items():
            name = "" if key in _GENERAL else str(key)
            messages += error_messages(value, f"{prefix}{name}: " if name else prefix)
        return messages
    if isinstance(detail, list | tuple):
        return [message for item in detail for message in error_messages(item, prefix)]
    return [f"{prefix}{detail if isinstance(detail, str | ErrorDetail) else str(detail)}"]


def errors_of(exc: BaseException) -> Any:
    """The per-field errors an exception carries: InvalidInput's, a serializer's, or one message."""
    if isinstance(exc, InvalidInput):
        return exc.errors
    if isinstance(exc, DRFValidationError):
        return exc.detail
    if isinstance(exc, DomainError):
        return [exc.message]
    return [str(exc)]


def add_errors(form: forms.Form, errors: Any, *, field_map: Mapping[str, str] | None = None) -> None:
    """Add ``errors`` (a dict of field -> messages, or a list of messages) to ``form``.

    A key naming one of the form's fields (or mapped to one by ``field_map``) goes on that field;
    any other key goes above the form, prefixed with its name.
    """
    field_map = field_map or {}
    if not isinstance(errors, Mapping):
        form.add_error(None, error_messages(errors))
        return
    for key, detail in errors.items():
        name = field_map.get(str(key), str(key))
        if name in form.fields:
            form.add_error(name, error_messages(detail))
        elif key in _GENERAL:
            form.add_error(None, error_messages(detail))
        else:
            form.add_error(None, error_messages(detail, f"{key}: "))


def add_service_error(form: forms.Form, exc: BaseException, *, field_map: Mapping[str, str] | None = None) -> None:
    """Put a validation or domain error raised by a serializer or a service on ``form``."""
    add_errors(form, errors_of(exc), field_map=field_map)
