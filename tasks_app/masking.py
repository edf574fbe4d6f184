"""Hide secret-looking values of a task's runner config before showing it to people.

A config may carry credentials: an ``Authorization`` header, an API key, a password, a
process environment. The admin and the back office show configs to operators who need the shape
(which URL, which headers, which command) but not the secrets; this masks every value whose key
looks secret, every value of an environment mapping, and the password (and secret-named query parameters)
of a URL.
Masking is for display only: the stored config is never changed.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What a masked value reads as.
MASK = "********"

#: A key whose value is a secret: any key containing one of these words (case-insensitive), so
#: ``Authorization``, ``X-Api-Key``, ``access_token``, ``client_secret``, ``Set-Cookie`` ...
_SECRET_KEY = re.compile(r"auth|token|secret|passw|pwd|key|cookie|credential|signature|session|private", re.I)
#: A key whose mapping is a process environment: every value in it is masked.
_ENVIRONMENT_KEY = re.compile(r"^(env|environ|environment|env_vars|environment_variables)$", re.I)


def is_secret_key(key: object) -> bool:
    """Whether the value under ``key`` should never be shown."""
    return isinstance(key, str) and bool(_SECRET_KEY.search(key))


def is_environment_key(key: object) -> bool:
    """Whether the mapping under ``key`` is a process environment (all its values are secret)."""
    return isinstance(key, str) and bool(_ENVIRONMENT_KEY.match(key))


def masks_left(value: Any) -> bool:
    """Whether a mask still stands anywhere in ``value`` (a config put back from what was shown:
    a masked value its holder did not give again, which must not be stored or run as it reads)."""
    if isinstance(value, dict):
        return any(masks_left(item) for item in value.values())
    if isinstance(value, list):
        return any(masks_left(item) for item in value)
    return isinstance(value, str) and MASK in value


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
        if any(is_secret_key(name) for name, _ in pairs):
            query = urlencode([(name, MASK if is_secret_key(name) else value) for name, value in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _mask(value: Any, *, all_values: bool = False) -> Any:
    if isinstance(value, dict):
        return {
            key: (
                _mask_all(item)
                if all_values or is_secret_key(key)
                else _mask(item, all_values=bool(isinstance(key, str) and _ENVIRONMENT_KEY.match(key)))
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_mask(item, all_values=all_values) for item in value]
    if all_values:
        return _mask_all(value)
    if isinstance(value, str) and "://" in value:
        return mask_url(value)
    return value


def _mask_all(value: Any) -> Any:
    """Every leaf masked, the shape kept (so an operator still sees which keys are set)."""
    if isinstance(value, dict):
        return {key: _mask_all(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask_all(item) for item in value]
    if value is None or value == "":
        return value
    return MASK


def mask_config(config: Any) -> Any:
    """A copy of ``config`` with secret-looking values replaced by :data:`MASK`.

    Masked: the value of every key that looks secret (``Authorization``, ``token``, ``api_key``,
    ``password``, ``secret``, ``cookie``, ...), nested mappings and lists under such a key
    included; every value of an environment mapping (``env``, ``environment``); the password of
    a URL with userinfo. Empty values stay empty, so "not set" remains visible.
    """
    return _mask(config)


def unmask_config(submitted: Any, stored: Any) -> Any:
    """``submitted`` (a config edited from its masked form) with every value still reading
    :data:`MASK` given back its stored value at the same place, so that saving a form without
    retyping the secrets keeps them. A URL whose masked password was left alone gets its stored
    URL back."""
    if submitted == MASK:
        return stored
    if isinstance(submitted, dict) and isinstance(stored, dict):
        return {
            key: unmask_config(value, stored.get(key)) if key in stored else value for key, value in submitted.items()
        }
    if isinstance(submitted, list) and isinstance(stored, list):
        return [
            unmask_config(value, stored[index]) if index < len(stored) else value
            for index, value in enumerate(submitted)
        ]
    if isinstance(submitted, str) and isinstance(stored, str) and MASK in submitted and mask_url(stored) == submitted:
        return stored
    return submitted


#: The key of an audit entry's ``changes`` naming the environment variables a change touched.
ENV_NAMES = "env_names"


def _environments(value: Any, path: tuple[str, ...] = ()) -> dict[str, dict[Any, Any]]:
    """Each environment mapping of a config (``env``, ``environment``, ... at any depth), by its
    dotted path."""
    found: dict[str, dict[Any, Any]] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            here = (*path, str(key))
            if is_environment_key(key) and isinstance(item, dict):
                found[".".join(here)] = item
            else:
                found.update(_environments(item, here))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(_environments(item, (*path, str(index))))
    return found


def environment_changes(before: Any, after: Any) -> dict[str, dict[str, list[str]]]:
    """The names of the variables each environment mapping of a config gained (``added``), lost
    (``removed``) or got another value for (``changed``), by the mapping's path (``env``,
    ``containers.0.env``): what a reviewer needs of a change whose values stay masked (a variable
    like ``PYTHONWARNINGS`` says what was injected even when its value reads ``********``).
    Give both configs in the clear (values are compared, never returned); a mapping with no
    change, and an empty list, are left out."""
    old, new = _environments(before), _environments(after)
    changes: dict[str, dict[str, list[str]]] = {}
    for path in sorted(set(old) | set(new)):
        was, now = old.get(path, {}), new.get(path, {})
        names = {
            "added": sorted(str(name) for name in now if name not in was),
            "removed": sorted(str(name) for name in was if name not in now),
            "changed": sorted(str(name) for name in now if name in was and now[name] != was[name]),
        }
        names = {kind: listed for kind, listed in names.items() if listed}
        if names:
            changes[path] = names
    return changes


def environment_changed_names(changes: dict[str, dict[str, list[str]]], prefix: str = "config") -> list[str]:
    """:func:`environment_changes` as the dotted names of the variables (``config.env.BROWSER``),
    for a task version's list of what changed."""
    return sorted(
        {f"{prefix}.{path}.{name}" for path, kinds in changes.items() for names in kinds.values() for name in names}
    )
