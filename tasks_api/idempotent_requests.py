"""A create request made safe to retry: the ``Idempotency-Key`` header's OpenAPI parameters and
the view helper that answers a repeated request with the stored response (the store itself is
:mod:`tasks_app.idempotency`). Shared by the task API and the compat API's views, so neither view
module imports the other."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app.idempotency import HEADER, REPLAYED_HEADER, idempotency_key_clean, idempotent_create, request_fingerprint
from tms_core.auth import request_user

IDEMPOTENCY_PARAMETER = OpenApiParameter(
    HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    # Printable ASCII; a space neither first nor last, where HTTP would strip it.
    pattern=r"^[!-~](?:[ -~]{0,253}[!-~])?$",
    description=(
        "Makes a retried create (or trigger) safe: a second request with the same key and body gets the first response "
        "(with `Idempotent-Replayed: true`) and creates nothing; the same key with another body is a 422. "
        "Keys are remembered for 24 hours; 1-255 printable ASCII characters, e.g. a UUID."
    ),
)
REPLAYED_HEADER_PARAMETER = OpenApiParameter(
    REPLAYED_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    response=[201, 200],
    description="`true` when this is the stored response of an earlier request with the same Idempotency-Key.",
)


def idempotent_create_response(request: Request, create: Any) -> Response:
    """Run ``create`` (returning status and body) under the request's Idempotency-Key, if any."""
    key = idempotency_key_clean(request.headers.get(HEADER))
    # Only a keyed request is compared with an earlier one: the others skip hashing their body.
    fingerprint = (
        request_fingerprint(method=request.method or "POST", path=request.path, body=request.data) if key else ""
    )
    stored = idempotent_create(owner=request_user(request), key=key, fingerprint=fingerprint, create=create)
    headers = {REPLAYED_HEADER: "true"} if stored.replayed else {}
    return Response(stored.body, status=stored.status, headers=headers)
