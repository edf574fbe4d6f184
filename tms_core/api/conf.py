"""Typed access to the ``TMS_API`` settings dict (knobs of the REST API alone), with defaults.

Limits that services apply, whoever calls them, are in :class:`tms_core.conf.TmsSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class ApiSettings:
    #: Most tasks the original service's ``GET /tasks`` lists (newest first).
    COMPAT_LIST_MAX: int = 1000


def api_settings() -> ApiSettings:
    configured = getattr(settings, "TMS_API", {})
    unknown = set(configured) - {f.name for f in fields(ApiSettings)}
    if unknown:
        raise ImproperlyConfigured(f"Unknown TMS_API settings: {', '.join(sorted(unknown))}")
    return ApiSettings(**configured)
