"""Put a serializer's or a service's validation errors onto a Django form, field by field.

Services raise :class:`tms_core.errors.InvalidInput` (``errors``: field -> messages) or a
:class:`~tms_core.errors.DomainError`; the API's serializers raise DRF's ``ValidationError`` (or
leave ``serializer.errors``); some model code raises Django's. The admin and the back-office
pages validate with the API's serializers and write through its services, so bad input gets
the API's messages; this module puts them where a person reads them: on the field they name
(directly, or through a ``field_map`` when the form calls it otherwise), and the rest
(``non_field_errors``, fields the form does not have, conflicts) above the form, prefixed with
the name so nothing is lost; a button without a form flashes them as messages instead. It is
the one place that does this for both callers, with the steps around it: validate, save through
the service, and put what either refused on the form (:func:`save_validated`,
:func:`save_cleaned`), or say a button's outcome (:func:`flash_outcome`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest
from rest_framework.exceptions import ValidationError as DrfValidationError

from tms_core.errors import DomainError, InvalidInput

#: Every error a service may raise about its input or the object's state.
SERVICE_ERRORS = (InvalidInput, DomainError, DrfValidationError, DjangoValidationError)

#: Keys that mean "the request as a whole", not one field.
GENERAL_KEYS = frozenset({"non_field_errors", NON_FIELD_ERRORS, "detail"})


def error_messages(detail: Any, prefix: str = "") -> list[str]:
    """Flatten nested error details (``{"config": {"url": ["..."]}}``) to readable strings,
    naming nested fields (``url: Enter a valid URL.``) but not the general keys."""
    if isinstance(detail, Mapping):
        messages: list[str] = []
        for key, value in detail.items():
            name = "" if key in GENERAL_KEYS or key is None else str(key)
            messages += error_messages(value, f"{prefix}{name}: " if name else prefix)
        return messages
    if isinstance(detail, list | tuple):
        return [message for item in detail for message in error_messages(item, prefix)]
    return [f"{prefix}{detail}"]


def errors_of(exc: BaseException) -> Any:
    """The error detail an exception carries: a mapping field -> messages, or a list of messages."""
    if isinstance(exc, InvalidInput):
        return exc.errors
    if isinstance(exc, DrfValidationError):
        return exc.detail
    if isinstance(exc, DjangoValidationError):
        return exc.message_dict if hasattr(exc, "error_dict") else exc.messages
    return [getattr(exc, "message", None) or str(exc)]


def error_map(exc: BaseException) -> dict[str, list[str]]:
    """``exc`` as field -> messages (``__all__`` for errors about the whole request)."""
    detail = errors_of(exc)
    if not isinstance(detail, Mapping):
        return {NON_FIELD_ERRORS: error_messages(detail)}
    errors: dict[str, list[str]] = {}
    for key, value in detail.items():
        name = NON_FIELD_ERRORS if key in GENERAL_KEYS or key is None else str(key)
        errors.setdefault(name, []).extend(error_messages(value))
    return errors


def exception_messages(exc: BaseException) -> list[str]:
    """All of ``exc``'s messages as lines, each prefixed with the field it names (for flash
    messages of a button that has no form)."""
    return error_messages(errors_of(exc))


def flash_errors(request: HttpRequest, exc: BaseException) -> None:
    """Each of ``exc``'s messages (:func:`exception_messages`) as an error message on the next
    page: how a button without a form (delete, cancel, retry) says why it was refused."""
    for message in exception_messages(exc):
        messages.error(request, message)


def add_errors(form: forms.BaseForm, errors: Any, *, field_map: Mapping[str, str] | None = None) -> None:
    """Add ``errors`` (a serializer's ``errors``: field -> messages, or a list of messages) to ``form``.

    A key naming one of the form's fields (or mapped to one by ``field_map``) goes on that field;
    a general key goes above the form; any other key goes above the form, prefixed with its name.
    """
    field_map = field_map or {}
    if not isinstance(errors, Mapping):
        form.add_error(None, error_messages(errors))
        return
    for key, detail in errors.items():
        name = field_map.get(str(key), str(key))
        if name in form.fields:
            form.add_error(name, error_messages(detail))
        elif key in GENERAL_KEYS or key is None:
            form.add_error(None, error_messages(detail))
        else:
            form.add_error(None, error_messages(detail, f"{key}: "))


def add_service_errors(form: forms.BaseForm, exc: BaseException, *, field_map: Mapping[str, str] | None = None) -> None:
    """Put a validation or domain error raised by a serializer or a service on ``form``."""
    add_errors(form, errors_of(exc), field_map=field_map)


def flash_outcome(request: HttpRequest, act: Callable[[], Any], says: Callable[[Any], str]) -> bool:
    """``act()`` for a button without a form: its success in the words ``says`` gives its result,
    or the service's refusal (:func:`flash_errors`), as a message on the next page. Whether it
    succeeded."""
    try:
        result = act()
    except SERVICE_ERRORS as exc:
        flash_errors(request, exc)
        return False
    messages.success(request, says(result))
    return True


def save_cleaned(form: forms.BaseForm, save: Callable[[dict[str, Any]], Any]) -> Any:
    """``save(the form's cleaned data)`` once the form is valid (a service that takes the form's
    fields as they are): what it returns, or None, with the service's errors on the form's
    fields, when the form or the service refuses."""
    if not form.is_valid():
        return None
    try:
        return save(form.cleaned_data)
    except SERVICE_ERRORS as exc:
        add_service_errors(form, exc)
        return None


def save_validated(
    form: forms.BaseForm,
    serializer: Any,
    save: Callable[[Any], Any],
    *,
    field_map: Mapping[str, str] | None = None,
) -> Any:
    """``save(validated data)`` once ``serializer`` (the API's) accepts the form's input: what it
    returns, or None, with the serializer's or the service's errors on the form's fields (named
    through ``field_map`` where the form calls a field otherwise), when either refuses."""
    if not serializer.is_valid():
        add_errors(form, serializer.errors, field_map=field_map)
        return None
    try:
        return save(serializer.validated_data)
    except SERVICE_ERRORS as exc:
        add_service_errors(form, exc, field_map=field_map)
        return None
