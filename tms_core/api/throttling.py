"""DRF throttles that count per client address as :func:`tms_core.client_address.client_address`
sees it (``X-Forwarded-For`` only from ``TMS_TRUSTED_PROXIES``), not as DRF's ``NUM_PROXIES``
does (which, unset, counts per whatever ``X-Forwarded-For`` the client sends)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from rest_framework import throttling

from tms_core.client_address import client_address


class ClientAddressMixin:
    """``get_ident``: the client address every throttle, the lockout and the audit log share."""

    def get_ident(self, request: Any) -> str:
        return client_address(request) or ""


class UserRateThrottle(ClientAddressMixin, throttling.UserRateThrottle):
    """DRF's per-user rate; anonymous requests counted per client address."""


class AnonRateThrottle(ClientAddressMixin, throttling.AnonRateThrottle):
    """DRF's anonymous rate, per client address."""


class SimpleRateThrottle(ClientAddressMixin, throttling.SimpleRateThrottle):
    """DRF's rate by scope, per client address."""


class SettingRateThrottle(SimpleRateThrottle):
    """Requests per client address, at the rate of the setting ``setting`` names (read per
    request, so it can change), counted under ``scope``: an endpoint outside systems call
    without an account (trigger URLs, callbacks)."""

    setting: ClassVar[str]

    def get_rate(self) -> str | None:
        rate: str | None = getattr(settings, self.setting)
        return rate

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
