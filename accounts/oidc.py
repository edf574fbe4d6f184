"""Single sign-on through an OpenID Connect provider (mozilla-django-oidc, adapted).

The pieces, all inert while SSO is off (``TMS_OIDC["ENABLED"]``, from ``TMS_OIDC_CLIENT_ID``):

* :class:`OidcBackend` turns the provider's claims into a user (:func:`accounts.sso.oidc_user_sync`),
  and checks that the ID token was issued to this client by the configured issuer (the library
  checks the signature and the nonce, not the audience nor the issuer).
* :class:`AuthenticateView`, :class:`CallbackView` and :class:`LogoutView` under ``/oidc/``;
  the back office's, the admin's and the browsable API's logout are :class:`LogoutView` too.
* :class:`SessionRefresh` sends an SSO session's GET back to the provider (``prompt=none``) once
  ``TMS_OIDC_RENEW_SECONDS`` have passed, so a user disabled there loses access here.

Endpoints: explicit ``TMS_OIDC_*_ENDPOINT`` settings win; the rest are read from the issuer's
discovery document (``<issuer>/.well-known/openid-configuration``), fetched on first use by each
web process and kept for its life. A failed fetch fails that sign-in with a message and is tried
again on the next one: no process fails to start because the provider is down.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh as LibrarySessionRefresh
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from accounts.sso import SsoRefused, oidc_user_sync

logger = logging.getLogger(__name__)

#: mozilla-django-oidc's endpoint settings, and the discovery document's key for each.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
ERROR_TEMPLATE = "registration/sso_error.html"
#: The provider's answers to a silent session check (prompt=none) that mean "sign in again".
SESSION_ENDED = frozenset({"login_required", "interaction_required", "consent_required", "account_selection_required"})


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read (or names another issuer)."""


def sso_config() -> dict[str, Any]:
    return getattr(settings, "TMS_OIDC", {}) or {}


def sso_enabled() -> bool:
    return bool(sso_config().get("ENABLED"))


_discovered: dict[str, dict[str, Any]] = {}
_discovery_lock = threading.Lock()


def provider_metadata() -> dict[str, Any]:
    """The issuer's discovery document (``{}`` without an issuer), fetched once per process."""
    issuer = sso_config().get("ISSUER", "")
    if not issuer:
        return {}
    with _discovery_lock:
        found = _discovered.get(issuer)
        if found is not None:
            return found
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            response = requests.get(
                url,
                timeout=import_from_settings("OIDC_TIMEOUT", 10.0),
                verify=import_from_settings("OIDC_VERIFY_SSL", True),
            )
            response.raise_for_status()
            document = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise ProviderUnavailable(f"could not read {url}: {exc}") from exc
        if not isinstance(document, dict) or str(document.get("issuer", "")).rstrip("/") != issuer:
            # OpenID Connect Discovery 1.0, section 4.3: the document must name the issuer asked.
            raise ProviderUnavailable(f"{url} names another issuer ({document.get('issuer')!r}), not {issuer!r}")
        _discovered[issuer] = document
        return document


def oidc_setting(name: str, *default: Any) -> Any:
    """mozilla-django-oidc's ``get_settings``, with the endpoints read from discovery when not set."""
    if name in DISCOVERED and not getattr(settings, name, ""):
        url = provider_metadata().get(DISCOVERED[name])
        if not url:
            raise ProviderUnavailable(f"the provider announces no {DISCOVERED[name]}")
        return url
    return import_from_settings(name, *default)


def end_session_endpoint() -> str:
    """The provider's logout URL, or ``""`` when it has none (or cannot be reached now)."""
    explicit = sso_config().get("END_SESSION_ENDPOINT", "")
    if explicit:
        return explicit
    try:
        return str(provider_metadata().get("end_session_endpoint") or "")
    except ProviderUnavailable as exc:
        logger.warning("SSO logout: %s; logged out here only", exc)
        return ""


def is_sso_session(request: HttpRequest) -> bool:
    backend = request.session.get(BACKEND_SESSION_KEY, "")
    return backend == f"{OidcBackend.__module__}.{OidcBackend.__name__}"


def provider_logout_url(request: HttpRequest) -> str | None:
    """Where to send the browser to end an SSO session at the provider too (RP-initiated logout,
    with the ID token as hint and the login page to come back to), or None."""
    if not sso_enabled() or not request.user.is_authenticated or not is_sso_session(request):
        return None
    endpoint = end_session_endpoint()
    if not endpoint:
        return None
    params = {
        "client_id": import_from_settings("OIDC_RP_CLIENT_ID"),
        "post_logout_redirect_uri": request.build_absolute_uri(resolve_url(settings.LOGOUT_REDIRECT_URL)),
    }
    id_token = request.session.get("oidc_id_token")
    if id_token:
        params["id_token_hint"] = id_token
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(params)}"


def sso_error(request: HttpRequest, message: str, *, status: int) -> HttpResponse:
    """The page a failed sign-in ends on: what went wrong, and the way back to the login page."""
    return render(request, ERROR_TEMPLATE, {"message": message}, status=status)


def sso_context(request: HttpRequest) -> dict[str, Any]:
    """Template context of the login pages: the SSO button and whether the local form shows."""
    config = sso_config()
    enabled = bool(config.get("ENABLED"))
    return {
        "sso": {
            "enabled": enabled,
            "provider_name": config.get("PROVIDER_NAME", ""),
            "local_login": not enabled or config.get("LOCAL_LOGIN", True),
        }
    }


def axes_exempt(request: HttpRequest, credentials: Any) -> bool:
    """django-axes' AXES_WHITELIST_CALLABLE: the SSO callback is not a password login."""
    return request.path == reverse("oidc_authentication_callback")


class LocalLoginGate:
    """With SSO on and ``TMS_OIDC_LOCAL_LOGIN=false``, refuse password logins made through a page
    (admin, back office, browsable API), so a hidden form cannot still be posted. Commands (no
    request) are unaffected, nor are API tokens, which never reach authenticate()."""

    def authenticate(self, request: HttpRequest | None, username: Any = None, password: Any = None, **kwargs: Any):
        if request is not None and password is not None and sso_enabled() and not sso_config().get("LOCAL_LOGIN"):
            raise PermissionDenied("password logins are off (TMS_OIDC_LOCAL_LOGIN=false)")
        # No get_user(): it logs nobody in, and a backend that has one may be picked as a
        # session's backend (the test client's force_login takes the first such).
        return None


class OidcBackend(OIDCAuthenticationBackend):
    """The authorization-code flow's last step: code -> tokens -> claims -> user."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds every backend for every authenticate() (password logins too): read the
        # settings when used, not here, so nothing is fetched or required while SSO is off.
        self.UserModel = auth.get_user_model()

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: oidc_setting("OIDC_OP_TOKEN_ENDPOINT"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: oidc_setting("OIDC_OP_USER_ENDPOINT"))
    OIDC_OP_JWKS_ENDPOINT = property(
        lambda self: (
            None if import_from_settings("OIDC_RP_SIGN_ALGO") == "HS256" else oidc_setting("OIDC_OP_JWKS_ENDPOINT")
        )
    )
    OIDC_RP_CLIENT_ID = property(lambda self: import_from_settings("OIDC_RP_CLIENT_ID"))
    OIDC_RP_CLIENT_SECRET = property(lambda self: import_from_settings("OIDC_RP_CLIENT_SECRET"))
    OIDC_RP_SIGN_ALGO = property(lambda self: import_from_settings("OIDC_RP_SIGN_ALGO"))
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any):
        # Only the callback view passes a nonce: a password login never reaches the provider.
        if request is None or "nonce" not in kwargs or not sso_enabled():
            return None
        return super().authenticate(request, **kwargs)

    def retrieve_matching_jwk(self, token: str) -> Any:
        header = jwt.get_unverified_header(token)
        if "kid" in header:
            return super().retrieve_matching_jwk(token)
        # RFC 7515 makes "kid" optional, and a provider with one signing key may leave it out (the
        # library requires it): then the key set must hold exactly one key for the algorithm.
        response = requests.get(
            self.OIDC_OP_JWKS_ENDPOINT,
            verify=self.get_settings("OIDC_VERIFY_SSL", True),
            timeout=self.get_settings("OIDC_TIMEOUT", None),
        )
        response.raise_for_status()
        keys = [
            key
            for key in response.json().get("keys", [])
            if key.get("alg", header.get("alg")) == header.get("alg") and key.get("use", "sig") == "sig"
        ]
        if len(keys) != 1:
            raise SuspiciousOperation("the ID token names no key, and the provider has no single signing key")
        return jwt.PyJWK(keys[0])

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload = super().verify_token(token, **kwargs)
        if "nonce" in kwargs:  # the ID token (not a signed userinfo answer)
            audience = payload.get("aud")
            audiences = [audience] if isinstance(audience, str) else list(audience or [])
            if import_from_settings("OIDC_RP_CLIENT_ID") not in audiences:
                raise SuspiciousOperation("the ID token was issued to another client")
            issuer = sso_config().get("ISSUER", "")
            if issuer and str(payload.get("iss", "")).rstrip("/") != issuer:
                raise SuspiciousOperation(f"the ID token was issued by {payload.get('iss')!r}, not {issuer!r}")
        return payload

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            # OpenID Connect Core 1.0, section 5.3.2: else the answer is about someone else.
            raise SuspiciousOperation("the userinfo answer is about another subject than the ID token")
        config = sso_config()
        try:
            return oidc_user_sync(
                issuer=str(payload.get("iss", "")).rstrip("/"),
                claims={**payload, **userinfo},
                username_claim=config["USERNAME_CLAIM"],
                groups_claim=config["GROUPS_CLAIM"],
                group_roles=config["GROUPS"],
            )
        except SsoRefused as exc:
            self.request.tms_sso_refusal = str(exc)
            return None


def _provider_name() -> str:
    return sso_config().get("PROVIDER_NAME", "the provider")


class AuthenticateView(OIDCAuthenticationRequestView):
    """``/oidc/authenticate/``: to the provider's sign-in, with state, nonce and PKCE in the session."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the endpoint is read when used (see OidcBackend)

    OIDC_OP_AUTH_ENDPOINT = property(lambda self: oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT"))
    OIDC_RP_CLIENT_ID = property(lambda self: import_from_settings("OIDC_RP_CLIENT_ID"))

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is off")
        try:
            return super().get(request)
        except ProviderUnavailable as exc:
            logger.warning("SSO sign-in: %s", exc)
            return sso_error(request, f"{_provider_name()} cannot be reached now; try again later.", status=502)


class CallbackView(OIDCAuthenticationCallbackView):
    """``/oidc/callback/`` (the redirect URI to register at the provider)."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is off")
        # Where a session check (SessionRefresh) was going: the failure below flushes the session.
        self.next_url = request.session.get("oidc_login_next") or ""
        try:
            if "code" in request.GET and "oidc_states" not in request.session:
                # The library answers this (a browser that started no sign-in) as a plain failure.
                raise SuspiciousOperation("a callback to a browser that started no sign-in")
            return super().get(request)
        except SuspiciousOperation as exc:
            # A state not issued to this browser, a wrong nonce, a token for another client: refuse.
            logger.warning("SSO sign-in refused: %s", exc)
            return sso_error(
                request,
                "This sign-in could not be verified (it was not started from this browser, or it was "
                "already used). Start again from the login page.",
                status=400,
            )
        except (ProviderUnavailable, requests.RequestException) as exc:
            logger.warning("SSO sign-in failed: %s", exc)
            return sso_error(
                request, f"{_provider_name()} could not complete the sign-in; try again later.", status=502
            )

    def login_failure(self) -> HttpResponse:
        request = self.request
        error = request.GET.get("error")
        if error in SESSION_ENDED:
            # A session check (prompt=none) the provider would not answer silently: its session
            # ended, or the user was disabled there. Logged out here (the library did); to the login.
            logger.info("SSO session check refused (%s): logged out", error)
            messages.info(request, f"Your session has ended: sign in again with {_provider_name()}.")
            login = resolve_url(settings.LOGIN_URL)
            return HttpResponseRedirect(f"{login}?{urlencode({'next': self.next_url})}" if self.next_url else login)
        if error:
            description = request.GET.get("error_description", "")
            message = f"{_provider_name()} did not sign you in ({error}{': ' + description if description else ''})."
        else:
            refusal = getattr(request, "tms_sso_refusal", "")
            message = refusal or "This account cannot sign in here (it is disabled, or the sign-in expired)."
        logger.info("SSO sign-in failed: %s", message)
        return sso_error(request, message, status=403)


class LogoutView(View):
    """Logout (POST) for every login page: ends the session here, and for an SSO session also at
    the provider when it has an ``end_session_endpoint``."""

    http_method_names = ["post"]

    def post(self, request: HttpRequest) -> HttpResponse:
        destination = provider_logout_url(request) or resolve_url(settings.LOGOUT_REDIRECT_URL)
        auth.logout(request)
        return HttpResponseRedirect(destination)


class OidcLogoutView(LogoutView):
    """``/oidc/logout/``: the same, present only with SSO on."""

    def post(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is off")
        return super().post(request)


class SessionRefresh(LibrarySessionRefresh):
    """Re-check an SSO session with the provider after ``TMS_OIDC_RENEW_SECONDS`` (on a GET)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, get_response: Any) -> None:
        MiddlewareMixin.__init__(self, get_response)  # settings are read when used (see OidcBackend)

    OIDC_EXEMPT_URLS = property(lambda self: import_from_settings("OIDC_EXEMPT_URLS", []))
    OIDC_OP_AUTHORIZATION_ENDPOINT = property(lambda self: oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT"))
    OIDC_RP_CLIENT_ID = property(lambda self: import_from_settings("OIDC_RP_CLIENT_ID"))
    OIDC_STATE_SIZE = property(lambda self: import_from_settings("OIDC_STATE_SIZE", 32))
    OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
    OIDC_RP_SCOPES = property(lambda self: import_from_settings("OIDC_RP_SCOPES"))
    OIDC_USE_NONCE = property(lambda self: import_from_settings("OIDC_USE_NONCE", True))
    OIDC_NONCE_SIZE = property(lambda self: import_from_settings("OIDC_NONCE_SIZE", 32))

    def is_refreshable_url(self, request: HttpRequest) -> bool:
        # Only sessions SSO opened: a password session has no provider to ask.
        # The method first: an API POST, or any request with SSO off, leaves the session unread.
        return (
            request.method == "GET"
            and sso_enabled()
            and is_sso_session(request)
            and super().is_refreshable_url(request)
        )

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        try:
            return super().process_request(request)
        except ProviderUnavailable as exc:
            # Cannot re-check: end the session rather than let it outlive a disabled account.
            logger.warning("SSO session check: %s; logging %s out", exc, request.user)
            auth.logout(request)
            return HttpResponseRedirect(reverse(settings.LOGIN_URL))
