"""Masking of secret-looking values in a task's config (and a run's handle) before they are shown.

One function for every page that shows a config: the back office's task and execution pages and
the admin. What is stored is never changed: masking only decides what a person sees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What a masked value reads as.
MASK = "••••••"

#: A key whose name contains one of these holds a secret (``Authorization``, ``X-Api-Key``,
#: ``client_secret``, ``db_password``, ``Cookie``, ``access_token``, ...).
SECRET_NAME = re.compile(r"token|secret|passw|pwd|key|auth|cookie|credential|signature|session", re.IGNORECASE)
#: Keys whose values are all masked, whatever their names: a process's environment variables.
ENVIRONMENT_KEYS = frozenset({"env", "environment", "env_vars", "environment_variables"})


def is_secret_name(name: object) -> bool:
    """Whether a key (a header, a config field, a query parameter) names a secret."""
    return isinstance(name, str) and bool(SECRET_NAME.search(name))


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo and secret-named query parameters masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(name) for name, _ in pairs):
            query = urlencode([(name, MASK if is_secret_name(name) else value) for name, value in pairs], safe="•")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_secrets(value: Any, *, _all: bool = False) -> Any:
    """A copy of ``value`` (JSON-like: dicts, lists, scalars) with secret-looking values masked.

    Masked: the value of any key whose name looks secret (see :data:`SECRET_NAME`), every value
    under an environment key (``env``), and passwords and secret query parameters in URLs.
    Structure, key names and harmless values stay, so a masked config still reads as a config.
    """
    if isinstance(value, Mapping):
        masked = {}
        for key, item in value.items():
            if _all or is_secret_name(key):
                masked[key] = _mask_leaves(item)
            else:
                masked[key] = mask_secrets(item, _all=isinstance(key, str) and key.lower() in ENVIRONMENT_KEYS)
        return masked
    if isinstance(value, list | tuple):
        return [mask_secrets(item, _all=_all) for item in value]
    if _all and value not in (None, ""):
        return MASK
    if isinstance(value, str) and "://" in value:
        return mask_url(value)
    return value


def _mask_leaves(value: Any) -> Any:
    """Every scalar under ``value`` masked (a secret may itself be a dict: ``{"auth": {...}}``)."""
    if isinstance(value, Mapping):
        return {key: _mask_leaves(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_leaves(item) for item in value]
    return value if value in (None, "") else MASK
