"""API authentication: DRF's token scheme, with a 401 that says which scheme to use.

DRF's ``TokenAuthentication`` ignores an ``Authorization`` header with any other scheme, so a
client sending ``Bearer <key>`` (what most HTTP clients and API tools send by default) was told
"Authentication credentials were not provided", which reads as a missing header. Here another
scheme is an authentication failure whose detail names the ``Token`` scheme. Bearer is not taken
as an alias: these are opaque DRF tokens, not OAuth bearer tokens, and one scheme keeps logs and
documentation unambiguous.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

#: Schemes other authentication classes may handle (the browsable API's session needs none).
_OTHER_SCHEMES = frozenset({b"basic"})


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``; any other scheme is a 401 that names this one."""

    def authenticate(self, request: Request) -> Any:
        header = authentication.get_authorization_header(request).split()
        if header and header[0].lower() not in {self.keyword.lower().encode(), *_OTHER_SCHEMES}:
            scheme = header[0].decode(errors="replace")[:20]
            raise exceptions.AuthenticationFailed(
                f"Unsupported authorization scheme {scheme!r}: send the key as 'Authorization: Token <key>'."
            )
        return super().authenticate(request)
