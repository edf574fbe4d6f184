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

import functools
from typing import Any

from django.db import connection
from django.db.models import Model
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.request import Request

#: The schemes that carry an API key, as they are written (matched without regard to case).
KEY_SCHEMES = ("Token", "Bearer")
#: Schemes other authentication classes may handle (the browsable API's session needs none).
_OTHER_SCHEMES = frozenset({b"basic"})


def _column(model: type[Model], name: str | None = None) -> str:
    """The quoted column of ``model``'s field ``name`` (its primary key's without one)."""
    field = model._meta.pk if name is None else model._meta.get_field(name)
    return connection.ops.quote_name(str(getattr(field, "column", "")))


@functools.cache
def _key_statement(token_model: type[Model], key_field: str = "key") -> tuple[str, list[str], list[str]]:
    """The statement that reads a key's token (by its ``key_field`` column) and its user together
    (as ``select_related`` would), and the attribute names of the two rows' columns, in order."""
    user_model: type[Model] = token_model._meta.get_field("user").related_model  # type: ignore[assignment]
    quote = connection.ops.quote_name
    tokens, users = token_model._meta, user_model._meta
    token_columns = [f"t.{quote(str(field.column))}" for field in tokens.concrete_fields]
    user_columns = [f"u.{quote(str(field.column))}" for field in users.concrete_fields]
    statement = (
        f"SELECT {', '.join(token_columns + user_columns)} FROM {quote(str(tokens.db_table))} t "  # noqa: S608 - the models' names
        f"JOIN {quote(str(users.db_table))} u ON u.{_column(user_model)} = t.{_column(token_model, 'user')} "
        f"WHERE t.{_column(token_model, key_field)} = %s"
    )
    return statement, [f.attname for f in tokens.concrete_fields], [f.attname for f in users.concrete_fields]


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>`` or ``Authorization: Bearer <key>`` (the same keys); any
    other scheme is a 401 that names these two."""

    #: The token model's column :meth:`authenticate_credentials` finds the key's row by (a
    #: subclass that stores a hash of the key names that column and passes the hash).
    key_field = "key"

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

    def authenticate_credentials(self, key: str) -> Any:
        """DRF's lookup, answers and errors, in a statement written once: the ORM built its
        ``select_related`` query anew for every request, a fifth of a task create's CPU
        (issue 33). The driver returns each column as its field holds it: no converters."""
        model = self.get_model()
        statement, token_names, user_names = _key_statement(model, self.key_field)
        with connection.cursor() as cursor:
            cursor.execute(statement, [key])
            row = cursor.fetchone()
        if row is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        split = len(token_names)
        token = model.from_db(connection.alias, token_names, row[:split])
        user_field = model._meta.get_field("user")
        user: Any = user_field.related_model.from_db(connection.alias, user_names, row[split:])  # type: ignore[union-attr]
        user_field.set_cached_value(token, user)  # type: ignore[union-attr]
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return user, token

    def authenticate_header(self, request: Request) -> str:
        # Two challenges (RFC 9110 allows a list): either scheme carries the key.
        return ", ".join(KEY_SCHEMES)
