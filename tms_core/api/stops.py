"""The answer to a request that stops runs (cancelling an execution, deleting a task): 200 when
nothing can still be running, 202 when an external run may go on (its runner could not stop it).
The report the service returns says which (``may_still_run``); the API's schema says both."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import status
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer


def stop_response(report: Any, serializer_class: type[BaseSerializer]) -> Response:
    """``report`` rendered by ``serializer_class``: 202 if ``report.may_still_run``, else 200."""
    code = status.HTTP_202_ACCEPTED if report.may_still_run else status.HTTP_200_OK
    return Response(serializer_class(report).data, status=code)


def stop_responses(serializer_class: type[BaseSerializer], done: str) -> dict[int, Any]:
    """The OpenAPI responses of :func:`stop_response`; ``done`` says what happened ("Cancelled")."""
    return {
        200: serializer_class,
        202: OpenApiResponse(serializer_class, description=f"{done}; the external run may go on."),
    }
