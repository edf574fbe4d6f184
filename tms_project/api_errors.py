"""One error shape for the whole API.

Every error answers ``{"type": ..., "detail": ..., "errors": {field: [messages]}}``; ``errors``
is present for validation failures and maps each bad field (nested for nested input) to its
messages, with ``non_field_errors`` for errors about the request as a whole.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"type": "validation_error", "detail": "Invalid input.", "errors": errors}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else response.data
        code = getattr(exc, "default_code", "error")
        response.data = {"type": getattr(getattr(exc, "detail", None), "code", None) or code, "detail": str(detail)}
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response.data["type"] = "not_authenticated"
    return response
