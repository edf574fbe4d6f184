"""Probes and outages at the edge of the web process.

:class:`HealthCheckMiddleware` answers ``/healthz`` and ``/readyz`` itself, first in the chain:
a container platform probes by IP over plain HTTP, which the SSL redirect and the allowed-hosts
check would otherwise turn into a 301 or a 400. ``/readyz`` answers anyone ready or unavailable
(200 or 503); which check failed, and why, only to those who may read ``/metrics``.

:class:`OutageMiddleware` turns a view's transient database error (the server restarting, a
dropped connection) or broker error into a 503 with ``Retry-After``, in the API's error shape
for API paths, instead of a 500: the request can be sent again, and nothing was half-done
(every service write is one transaction). A queue RabbitMQ refuses to declare because it exists
as the other type than ``TMS_QUEUE_TYPE`` is a 503 too, whose detail names the setting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as BrokerOperationalError

from ops.checks import READINESS, run_checks
from ops.metrics import metrics_access
from tms_core.conf import tms_settings
from tms_core.queue_type import queue_type_mismatch

logger = logging.getLogger(__name__)

HEALTH_PATHS = ("/healthz", "/healthz/")
READY_PATHS = ("/readyz", "/readyz/")
#: Errors that mean a dependency is (briefly) unavailable rather than a bug.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, BrokerOperationalError)


def retry_after() -> int:
    """Seconds a client should wait before retrying after a 503 (``TMS_RETRY_AFTER``, default 5)."""
    return int(settings.TMS_RETRY_AFTER)


def readiness_response(*, details: bool = True) -> JsonResponse:
    """200 when the database and the broker are reachable and every migration is applied, else
    503: ``{"status": "ready" | "unavailable"}``, with ``"checks": {name: {"ok": ..., "detail":
    ...}}`` naming what is down only for ``details`` (the details name the database, the broker
    URL and migrations: for operators, never for anyone who can reach the port)."""
    results = run_checks(READINESS)
    ready = all(result.ok for result in results)
    for result in results:
        if not result.ok:
            logger.warning("not ready: %s %s", result.name, result.detail)
    body: dict[str, object] = {"status": "ready" if ready else "unavailable"}
    if details:
        body["checks"] = {result.name: {"ok": result.ok, "detail": result.detail} for result in results}
    response = JsonResponse(body, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = str(retry_after())
    response["Cache-Control"] = "no-store"
    return response


class HealthCheckMiddleware:
    """``/healthz``: the process is alive (no dependency is touched). ``/readyz``: it can serve."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in HEALTH_PATHS or request.path in READY_PATHS:
            if request.method not in ("GET", "HEAD"):
                response = JsonResponse({"type": "method_not_allowed", "detail": "Use GET."}, status=405)
                response["Allow"] = "GET, HEAD"
                return response
            if request.path in HEALTH_PATHS:
                response = JsonResponse({"status": "alive"})
                response["Cache-Control"] = "no-store"
                return response
            # Details to whoever may read /metrics (its token, or its networks; loopback by default).
            return readiness_response(details=metrics_access(request) is None)
        return self.get_response(request)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(("/api/", "/tasks", "/hooks/"))


class OutageMiddleware:
    """A view's database or broker outage answers 503 with ``Retry-After``, not a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        mismatch = queue_type_mismatch(exception, tms_settings().QUEUE_TYPE)
        if mismatch is not None:
            # RabbitMQ refused to declare a queue the view publishes to (406: it exists as the
            # other type than TMS_QUEUE_TYPE): no retry helps until an operator changes the setting
            # or the queue, so the answer says which, as the workers and monitors do.
            logger.error("broker refused a queue during %s %s: %s", request.method, request.path, mismatch)
            return self._unavailable(request, f"The service is unavailable (broker): {mismatch}")
        if not isinstance(exception, OUTAGE_ERRORS):
            return None
        dependency = "broker" if isinstance(exception, BrokerOperationalError) else "database"
        logger.warning(
            "%s unavailable during %s %s: %s: %s",
            dependency,
            request.method,
            request.path,
            type(exception).__name__,
            str(exception).strip().splitlines()[0] if str(exception).strip() else "",
        )
        return self._unavailable(request, f"The service is temporarily unavailable ({dependency}); retry shortly.")

    @staticmethod
    def _unavailable(request: HttpRequest, detail: str) -> HttpResponse:
        if _is_api(request):
            response: HttpResponse = JsonResponse({"type": "service_unavailable", "detail": detail}, status=503)
        else:
            response = HttpResponse(detail, status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(retry_after())
        return response
