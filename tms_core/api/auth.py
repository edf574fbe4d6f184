"""API authentication: DRF's token keys, sent as ``Authorization: Token <key>`` or
``Authorization: Bearer <key>``, with a 401 that names both for any other scheme.

``Bearer`` is what clients generated from the OpenAPI schema (openapi-python-client and most
others) and most HTTP tooling send by default, so it is accepted for the same keys: the key is an
opaque DRF token either way, the scheme only says how it is carried. DRF's own class ignores an
``Authorization`` header with another scheme, so a client was told "Authentication credentials
were not provided", which reads as a missing header; here another scheme is an authentication
failure whose detail names the two that work.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

#: The schemes that carry an API key, as they are written (matched without regard to case).
KEY_SCHEMES = ("Token", "Bearer")
#: Schemes other authentication classes may handle (the browsable API's session needs none).
_OTHER_SCHEMES = frozenset({b"basic"})


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>`` or ``Authorization: Bearer <key>`` (the same keys); any
    other scheme is a 401 that names these two."""

    def authenticate(self, request: Request) -> Any:
        header = authentication.get_authorization_header(request).split()
        if not header:
            return None
        schemes = {scheme.lower().encode() for scheme in KEY_SCHEMES}
        if header[0].lower() in _OTHER_SCHEMES:
            return None
        if header[0].lower() not in schemes:
            scheme = header[0].decode(errors="replace")[:20]
            raise exceptions.AuthenticationFailed(
                f"Unsupported authorization scheme {scheme!r}: send the key as 'Authorization: Token <key>' "
                "or 'Authorization: Bearer <key>'."
            )
        # DRF's checks of the rest of the header (one key, no spaces, valid text), for either scheme.
        if len(header) == 1:
            raise exceptions.AuthenticationFailed("Invalid authorization header: no key after the scheme.")
        if len(header) > 2:
            raise exceptions.AuthenticationFailed("Invalid authorization header: the key must not contain spaces.")
        try:
            key = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed(
                "Invalid authorization header: the key contains invalid characters."
            ) from None
        return self.authenticate_credentials(key)

    def authenticate_header(self, request: Request) -> str:
        # Two challenges (RFC 9110 allows a list): either scheme carries the key.
        return ", ".join(KEY_SCHEMES)
