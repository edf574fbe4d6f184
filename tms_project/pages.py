"""Pages outside the API and the back office's own: the not-found page under DEBUG, and the icon.

With ``DEBUG`` on (``make run`` sets ``DJANGO_DEBUG=true`` so that a server error shows its
traceback to the developer at the console) Django answers every 404 with its technical page,
which lists the project's URL patterns, instead of calling ``handler404``. Whoever mistypes a URL
is a user of the back office, not a developer of its routes: :class:`NotFoundPageMiddleware`
serves ``handler404``'s page (the back office's styled "Not Found", or the API's JSON) under DEBUG
too. DEBUG itself stays as it is, with its other effects (tracebacks, template errors).
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static

from tms_core.api.errors import handler404


class NotFoundPageMiddleware:
    """Replaces Django's technical 404 page (DEBUG only) with ``handler404``'s answer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and not response.streaming
            and response.get("Content-Type", "").startswith("text/html")
            # Django's technical page says why it shows itself; no page of ours does.
            and b"<code>DEBUG = True</code>" in response.content
        ):
            return handler404(request)
        return response


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for on a page that names no icon: the SVG icon."""
    return HttpResponsePermanentRedirect(static("backoffice/favicon.svg"))
