"""Single sign-on (OpenID Connect) settings, from the environment: checked once, when settings load.

SSO is on when ``TMS_OIDC_CLIENT_ID`` is set. :func:`build_oidc_settings` turns the ``TMS_OIDC_*``
variables into Django settings: ``TMS_OIDC`` (what TMS reads, through :mod:`accounts.oidc`) and the
``OIDC_*`` names of mozilla-django-oidc. A value it cannot use raises :class:`OidcConfigError`
naming the variable (``base`` turns it into ImproperlyConfigured), so a mistyped role or a missing
secret stops the web process at start-up instead of failing the first sign-in. Nothing here imports
Django or reaches the network: the provider's endpoints, when only ``TMS_OIDC_ISSUER`` is given, are
discovered on first use (see :mod:`accounts.oidc`), so a worker or a provider outage never stops a
process from starting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accounts.roles import RoleError, parse_role

#: mozilla-django-oidc's name of each endpoint, and its variable.
ENDPOINT_VARIABLES = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "TMS_OIDC_AUTHORIZATION_ENDPOINT",
    "OIDC_OP_TOKEN_ENDPOINT": "TMS_OIDC_TOKEN_ENDPOINT",
    "OIDC_OP_USER_ENDPOINT": "TMS_OIDC_USERINFO_ENDPOINT",
    "OIDC_OP_JWKS_ENDPOINT": "TMS_OIDC_JWKS_ENDPOINT",
}
SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256")


class OidcConfigError(ValueError):
    """A ``TMS_OIDC_*`` variable has a value TMS cannot use; the message names it."""


def _http_url(name: str, value: str) -> str:
    value = value.strip()
    if value and not value.startswith(("https://", "http://")):
        raise OidcConfigError(f"{name} must be an http(s) URL, not {value!r}.")
    return value


def parse_groups(text: str) -> dict[str, str]:
    """``TMS_OIDC_GROUPS`` (``group=role,group=role``) as a dict; :class:`OidcConfigError` for a pair
    without ``=`` or a group given twice (a dict would keep one of the two silently). The roles are
    checked by :func:`build_oidc_settings`. A group name may hold ``:`` and ``/`` (Dex's
    ``org:team``, Keycloak's full paths), not ``,`` or ``=``."""
    groups: dict[str, str] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue  # a trailing comma
        group, sep, role = pair.partition("=")
        group, role = group.strip(), role.strip()
        if not sep or not group or not role:
            raise OidcConfigError(
                f"TMS_OIDC_GROUPS: {pair.strip()!r} is not group=role "
                "(e.g. TMS_OIDC_GROUPS=ops=team:ops:operator,tms-support=staff)."
            )
        if group in groups:
            raise OidcConfigError(
                f"TMS_OIDC_GROUPS: group {group!r} is given twice: a group maps to one role "
                "(a member of several groups gets each group's role)."
            )
        groups[group] = role
    return groups


def build_oidc_settings(
    *,
    client_id: str = "",
    client_secret: str = "",
    issuer: str = "",
    endpoints: Mapping[str, str] | None = None,
    end_session_endpoint: str = "",
    provider_name: str = "",
    scopes: str = "openid email profile",
    username_claim: str = "preferred_username",
    groups_claim: str = "groups",
    groups: Mapping[str, str] | str | None = None,
    renew_seconds: int = 900,
    local_login: bool = True,
    sign_algo: str = "RS256",
    use_pkce: bool = True,
    timeout: float = 10.0,
    verify_ssl: bool = True,
) -> dict[str, Any]:
    """Django settings for SSO: ``{"TMS_OIDC": {...}, "OIDC_...": ...}``.

    ``groups`` is ``TMS_OIDC_GROUPS``, as its text or as a dict (group -> role).
    ``endpoints`` maps the keys of :data:`ENDPOINT_VARIABLES` to explicit URLs; with ``issuer``
    set, the ones left out are discovered. Raises :class:`OidcConfigError` for a value it cannot use.
    """
    endpoints = {key: _http_url(ENDPOINT_VARIABLES[key], url) for key, url in (endpoints or {}).items() if url}
    issuer = _http_url("TMS_OIDC_ISSUER", issuer).rstrip("/")
    end_session_endpoint = _http_url("TMS_OIDC_END_SESSION_ENDPOINT", end_session_endpoint)
    groups = parse_groups(groups) if isinstance(groups, str) else dict(groups or {})
    client_id = client_id.strip()
    if not client_id:
        return _sso_off(issuer=issuer, client_secret=client_secret, endpoints=endpoints, groups=groups)
    if not client_secret:
        raise OidcConfigError("TMS_OIDC_CLIENT_SECRET is required with TMS_OIDC_CLIENT_ID.")
    _check_provider(endpoints=endpoints, issuer=issuer, sign_algo=sign_algo)
    scope_list = scopes.split()
    if "openid" not in scope_list:
        raise OidcConfigError(f"TMS_OIDC_SCOPES must include openid, not {scopes!r}.")
    if not username_claim.strip():
        raise OidcConfigError("TMS_OIDC_USERNAME_CLAIM must name a claim (e.g. preferred_username).")
    _check_groups(groups, groups_claim)
    if not 60 <= renew_seconds <= 86400:
        raise OidcConfigError("TMS_OIDC_RENEW_SECONDS must be between 60 and 86400 (seconds).")
    if not 0 < timeout <= 120:
        raise OidcConfigError("TMS_OIDC_TIMEOUT must be above 0 and at most 120 (seconds).")
    return {
        "TMS_OIDC": {
            "ENABLED": True,
            "ISSUER": issuer,
            "END_SESSION_ENDPOINT": end_session_endpoint,
            "PROVIDER_NAME": provider_name.strip() or "single sign-on",
            "USERNAME_CLAIM": username_claim.strip(),
            "GROUPS_CLAIM": groups_claim.strip(),
            "GROUPS": groups,
            "LOCAL_LOGIN": local_login,
        },
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_RP_SCOPES": " ".join(scope_list),
        "OIDC_RP_SIGN_ALGO": sign_algo,
        **endpoints,
        "OIDC_USE_PKCE": use_pkce,
        "OIDC_TIMEOUT": timeout,
        "OIDC_VERIFY_SSL": verify_ssl,
        # Kept in the session for the provider's logout (its id_token_hint).
        "OIDC_STORE_ID_TOKEN": True,
        "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": renew_seconds,
        "OIDC_CREATE_USER": True,
    }


def _sso_off(
    *, issuer: str, client_secret: str, endpoints: Mapping[str, str], groups: Mapping[str, str]
) -> dict[str, Any]:
    """The settings with SSO off; :class:`OidcConfigError` when other SSO variables are set without the client id."""
    given = [name for name, value in (("TMS_OIDC_ISSUER", issuer), ("TMS_OIDC_CLIENT_SECRET", client_secret)) if value]
    given += [ENDPOINT_VARIABLES[key] for key in endpoints]
    given += ["TMS_OIDC_GROUPS"] if groups else []
    if given:
        raise OidcConfigError(f"{', '.join(given)} set but TMS_OIDC_CLIENT_ID is not: set it to turn SSO on.")
    return {"TMS_OIDC": {"ENABLED": False, "LOCAL_LOGIN": True}}


def _check_provider(*, endpoints: Mapping[str, str], issuer: str, sign_algo: str) -> None:
    """Check the signing algorithm, and that every endpoint it needs is given or can be discovered."""
    missing = [ENDPOINT_VARIABLES[key] for key in ENDPOINT_VARIABLES if key not in endpoints]
    if sign_algo not in SIGN_ALGORITHMS:
        raise OidcConfigError(f"TMS_OIDC_SIGN_ALGO must be one of {', '.join(SIGN_ALGORITHMS)}, not {sign_algo!r}.")
    if sign_algo == "HS256":
        # The ID token is signed with the client secret: no key set to fetch.
        missing = [name for name in missing if name != "TMS_OIDC_JWKS_ENDPOINT"]
    if missing and not issuer:
        raise OidcConfigError(
            f"SSO needs TMS_OIDC_ISSUER (its endpoints are then discovered) or explicit {', '.join(missing)}."
        )


def _check_groups(groups: Mapping[str, str], groups_claim: str) -> None:
    """Check that each group is named and maps to a role, and that a claim carries the groups."""
    for group, role in groups.items():
        if not str(group).strip():
            raise OidcConfigError(f"TMS_OIDC_GROUPS: a pair has no group before '=' (its role is {role!r}).")
        try:
            parse_role(str(role))
        except RoleError as exc:
            raise OidcConfigError(f"TMS_OIDC_GROUPS: group {group!r} maps to {exc}.") from None
    if groups and not groups_claim.strip():
        raise OidcConfigError("TMS_OIDC_GROUPS_CLAIM must name a claim when TMS_OIDC_GROUPS is set.")
