"""Where outside systems reach this platform: the root of the absolute URLs TMS hands out
(trigger URLs, signed upload URLs, runners' callback URLs).

``TMS_PUBLIC_URL`` names it when it is set. When it is not, a URL built while answering a request
uses the address that request reached (``request.build_absolute_uri``: the ``Host`` header checked
against ``ALLOWED_HOSTS``, and the forwarded host, port and scheme only as far as
``USE_X_FORWARDED_HOST``, ``USE_X_FORWARDED_PORT`` and ``SECURE_PROXY_SSL_HEADER`` trust them), so
a site on another port than 8000 shows URLs that answer (issue 44). Without a request (a worker
giving a runner its callback URL) there is nothing to derive it from: :data:`FALLBACK`, Django's
``runserver`` default, which ``make run`` replaces by passing ``TMS_PUBLIC_URL`` from its ``PORT``.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

#: The root used when ``TMS_PUBLIC_URL`` is unset and no request says where the site is.
FALLBACK = "http://127.0.0.1:8000"


def public_url(request: HttpRequest | None = None) -> str:
    """The site's root URL, without a trailing slash: ``TMS_PUBLIC_URL`` when set, else the root
    of the address ``request`` reached, else :data:`FALLBACK`."""
    configured = str(getattr(settings, "TMS_PUBLIC_URL", "") or "").rstrip("/")
    if configured:
        return configured
    if request is not None:
        return request.build_absolute_uri("/").rstrip("/")
    return FALLBACK
