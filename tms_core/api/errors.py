"""One error shape for the whole API.

Every error answers ``{"type": ..., "detail": ..., "errors": {field: [messages]}}``; ``errors``
is present for validation failures and maps each bad field (nested for nested input) to its
messages, with ``non_field_errors`` for errors about the request as a whole. Domain errors from
services (:mod:`tms_core.errors`) are mapped here, and so are Django's own 404 and 500 pages
for API paths, so nothing under the API answers HTML.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import TemplateDoesNotExist
from django.views.defaults import page_not_found, permission_denied, server_error
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from tms_core.errors import ConflictError, DomainError, GoneError, IdempotencyKeyReused, InvalidInput, QuotaExceeded

#: HTTP status of each domain error.
DOMAIN_STATUS: dict[type[DomainError], int] = {
    ConflictError: status.HTTP_409_CONFLICT,
    GoneError: status.HTTP_404_NOT_FOUND,
    IdempotencyKeyReused: status.HTTP_422_UNPROCESSABLE_ENTITY,
    QuotaExceeded: status.HTTP_429_TOO_MANY_REQUESTS,
}


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self) -> None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        super().__init__(f"The request body is larger than {limit} bytes (TMS_MAX_REQUEST_BYTES).")


class _DomainAPIError(exceptions.APIException):
    def __init__(self, error: DomainError) -> None:
        if isinstance(error, QuotaExceeded):
            self.wait = error.retry_after  # DRF's handler turns it into a Retry-After header
        self.status_code = next(
            (code for kind, code in DOMAIN_STATUS.items() if isinstance(error, kind)), status.HTTP_400_BAD_REQUEST
        )
        super().__init__(detail=error.message, code=error.code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, InvalidInput):
        exc = exceptions.ValidationError(exc.errors)
    elif isinstance(exc, DomainError):
        exc = _DomainAPIError(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()  # never "No Task matches the given query."
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge()
    elif isinstance(exc, DjangoPermissionDenied):
        # The services' own messages say what role is missing; a bare one keeps DRF's wording.
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, exceptions.NotAuthenticated):
        exc = exceptions.NotAuthenticated(
            "Authentication credentials were not provided: send 'Authorization: Token <key>' "
            "or 'Authorization: Bearer <key>'."
        )
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


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(("/api/", "/tasks"))


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 404 (a path no route matches): the API's error shape for API paths."""
    if _is_api(request):
        return JsonResponse({"type": "not_found", "detail": "Not found."}, status=404)
    return page_not_found(request, exception)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """A refusal outside DRF's views: the API's error shape for API paths; elsewhere the back
    office's own page (``403.html``, with its navigation, as the 404's), naming the role needed and
    the one held when the check carried them (:class:`tms_core.errors.RoleRequired`)."""
    message = str(exception or "")
    if _is_api(request):
        detail = message or "You do not have permission to perform this action."
        return JsonResponse({"type": "permission_denied", "detail": detail}, status=403)
    context = {
        "exception": message,
        "role_needed": getattr(exception, "role", None),
        "role_held": getattr(exception, "held", None),
        "request_path": request.path,
    }
    try:
        return render(request, "403.html", context, status=403)
    except TemplateDoesNotExist:  # a project without the back office's templates: Django's own
        return permission_denied(request, exception or DjangoPermissionDenied())


def handler500(request: HttpRequest) -> HttpResponse:
    """An unexpected error: the API's error shape for API paths (the traceback is logged)."""
    if _is_api(request):
        return JsonResponse({"type": "server_error", "detail": "Internal server error."}, status=500)
    return server_error(request)
