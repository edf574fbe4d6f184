"""Typed access to the ``TMS_API`` settings dict (the REST API's knobs), with defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class ApiSettings:
    #: Most executions one "materialise up to" request may create.
    MATERIALISE_MAX: int = 1000
    #: Furthest ahead, in seconds, a "materialise up to" request may reach.
    MATERIALISE_MAX_AHEAD: float = 7 * 86400.0
    #: Seconds an ``Idempotency-Key`` is remembered.
    IDEMPOTENCY_KEY_TTL: float = 86400.0
    #: Most tasks the original service's ``GET /tasks`` lists (newest first).
    COMPAT_LIST_MAX: int = 1000


def api_settings() -> ApiSettings:
    configured = getattr(settings, "TMS_API", {})
    unknown = set(configured) - {f.name for f in fields(ApiSettings)}
    if unknown:
        raise ImproperlyConfigured(f"Unknown TMS_API settings: {', '.join(sorted(unknown))}")
    return ApiSettings(**configured)
