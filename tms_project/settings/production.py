"""Settings for a deployment (the docker image sets ``DJANGO_SETTINGS_MODULE`` to this module).

Refuses to start, with every problem in one message, without a real ``DJANGO_SECRET_KEY`` (unset,
a key from the repository (``base.PUBLIC_KEYS``: the development and test keys), or too short or
too uniform to pass Django's own check), with DEBUG on, without ``DJANGO_ALLOWED_HOSTS``, or
without valid ``TMS_SECRET_KEYS`` (the Fernet keys that encrypt secret task config values; none
from the repository). HTTPS hardening is on by default and each part can be changed from the
environment (for example behind a TLS-terminating proxy, or for a plain-HTTP try-out):

==================================  =========  ================================================
variable                            default    setting
==================================  =========  ================================================
DJANGO_SECURE_SSL_REDIRECT          true       SECURE_SSL_REDIRECT
DJANGO_SECURE_HSTS_SECONDS          31536000   SECURE_HSTS_SECONDS (0 turns HSTS off)
DJANGO_SECURE_HSTS_SUBDOMAINS       true       SECURE_HSTS_INCLUDE_SUBDOMAINS
DJANGO_SECURE_HSTS_PRELOAD          true       SECURE_HSTS_PRELOAD (the header only; listing the
                                               domain is a separate, manual step)
DJANGO_SESSION_COOKIE_SECURE        true       SESSION_COOKIE_SECURE
DJANGO_CSRF_COOKIE_SECURE           true       CSRF_COOKIE_SECURE
DJANGO_SECURE_PROXY_SSL_HEADER      unset      SECURE_PROXY_SSL_HEADER, as ``HEADER,value``
                                               (e.g. ``HTTP_X_FORWARDED_PROTO,https``); set it
                                               only behind a proxy that overwrites that header
==================================  =========  ================================================

``/healthz`` and ``/readyz`` are answered before the SSL redirect and the host check, so probes
over plain HTTP by IP work (see :mod:`ops.middleware`).
"""

import os

from django.core.exceptions import ImproperlyConfigured

from tms_project.settings.base import *  # noqa: F403
from tms_project.settings.base import DEVELOPMENT_SECRET_KEY, PUBLIC_KEYS, TMS, env

#: Django's own bar (``security.W009``): at least this many characters, this many distinct ones.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_UNIQUE = 5


def _secrets_keys_problem(keys: tuple[str, ...]) -> str | None:
    """What is wrong with TMS_SECRET_KEYS (the keys that encrypt secret config values), if anything."""
    if not keys:
        return (
            "TMS_SECRET_KEYS is not set (comma-separated Fernet keys, newest first; make one with: "
            "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
        )
    from cryptography.fernet import Fernet

    for index, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except ValueError:
            return f"TMS_SECRET_KEYS: key {index} is not a Fernet key (url-safe base64 of 32 bytes)"
        if key in PUBLIC_KEYS:
            return f"TMS_SECRET_KEYS: key {index} is a key from the repository (public: anyone can decrypt with it)"
    return None


def _refusals(*, secret_key: str, debug: bool, allowed_hosts: list[str], secrets_keys: tuple[str, ...]) -> list[str]:
    problems = []
    if not secret_key:
        problems.append("DJANGO_SECRET_KEY is not set")
    elif secret_key == DEVELOPMENT_SECRET_KEY:
        problems.append("DJANGO_SECRET_KEY is the development key from the repository")
    elif secret_key in PUBLIC_KEYS:
        problems.append("DJANGO_SECRET_KEY is a key from the repository (public: anyone can sign with it)")
    elif (
        len(secret_key) < SECRET_KEY_MIN_LENGTH
        or len(set(secret_key)) < SECRET_KEY_MIN_UNIQUE
        or secret_key.startswith("django-insecure-")
    ):
        problems.append(
            f"DJANGO_SECRET_KEY is too weak (at least {SECRET_KEY_MIN_LENGTH} characters, "
            f"{SECRET_KEY_MIN_UNIQUE} distinct, not 'django-insecure-...')"
        )
    if debug:
        problems.append("DJANGO_DEBUG is on")
    if not allowed_hosts:
        problems.append("DJANGO_ALLOWED_HOSTS is not set (a comma-separated list of the host names served)")
    keys_problem = _secrets_keys_problem(secrets_keys)
    if keys_problem:
        problems.append(keys_problem)
    return problems


SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# No default host list here: the base's localhost defaults would hide a forgotten variable.
ALLOWED_HOSTS = [host for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if host.strip()]

_problems = _refusals(
    secret_key=SECRET_KEY, debug=DEBUG, allowed_hosts=ALLOWED_HOSTS, secrets_keys=tuple(TMS["SECRET_KEYS"])
)
if _problems:
    raise ImproperlyConfigured(
        "Refusing to start with the production settings: "
        + "; ".join(_problems)
        + ". Generate a key with: python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )

# --- HTTPS ------------------------------------------------------------------------------------
# https://docs.djangoproject.com/en/5.2/ref/middleware/#module-django.middleware.security
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=True)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=True)
_proxy_header = env.str("DJANGO_SECURE_PROXY_SSL_HEADER", default="")
if _proxy_header:
    _name, _, _value = _proxy_header.partition(",")
    if not _name.strip() or not _value.strip():
        raise ImproperlyConfigured(
            "DJANGO_SECURE_PROXY_SSL_HEADER must be 'HEADER,value', e.g. HTTP_X_FORWARDED_PROTO,https"
        )
    SECURE_PROXY_SSL_HEADER = (_name.strip(), _value.strip())
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
