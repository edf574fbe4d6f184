"""Secret values of a task's runner config: encrypted at rest, masked on read, opened only to run.

Which values are secret (:func:`secret_paths`), for every runner:

* every value under a key that looks secret (``Authorization``, ``api_key``, ``password``,
  ``token``, ... see :func:`tasks_app.masking.is_secret_key`), at any depth;
* every value of an environment mapping (``env``);
* a URL with a password or a secret-named query parameter (the whole URL string);
* the fields the runner declares (:attr:`runners.base.BaseRunner.secret_config_fields`: every
  header value of ``http`` and ``function``, every ``env`` value of ``subprocess`` and
  ``kubernetes``);
* the paths the owner lists in the task's ``secret_fields`` (``"payload.token"``, ``"args.2"``,
  ``"json.auth"``: a dot-separated path into the config, a number indexing a list; everything
  under it is secret).

In the database each secret value (a leaf of the config: a string, number or boolean; empty
strings and nulls stay as they are, so "not set" remains visible) is replaced by
``{"$enc": "<Fernet token>"}``, the token holding the value's JSON. Fernet (the ``cryptography``
library: AES-128-CBC with an HMAC-SHA256, a timestamp and a random IV) uses the keys of
``TMS_SECRET_KEYS``: the first encrypts, every one decrypts (:class:`~cryptography.fernet.MultiFernet`),
so a key is rotated by putting a new one first, running ``manage.py tms_rotate_keys`` (which
re-encrypts every value with it) and then dropping the old one.

The plain config exists only in memory: the worker opens it (:func:`config_open`) into the
:class:`runners.base.RunSpec` it hands to the runner; the API, the admin and the back office show
it through :func:`config_masked`; writes bring the plain config, with secrets left at
:data:`~tasks_app.masking.MASK` put back from the stored ones (:func:`config_unmask`), and the
services seal it (:func:`config_seal`) before saving.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.core.exceptions import ImproperlyConfigured

from runners.registry import UnknownRunner, get_runner
from tasks_app.masking import MASK, is_environment_key, is_secret_key, mask_url, unmask_config
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput

#: The key of the object that stands for an encrypted value in a stored config.
ENCRYPTED = "$enc"

#: A path into a config: keys of mappings and indexes of lists.
Path = tuple[str | int, ...]


class SecretsUnavailable(Exception):
    """A stored secret cannot be decrypted with any key of ``TMS_SECRET_KEYS``."""


# --- keys ---------------------------------------------------------------------------------------


def check_keys(keys: Sequence[str]) -> None:
    """Raise :class:`ImproperlyConfigured` unless every key is a Fernet key."""
    for index, key in enumerate(keys):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                f"TMS_SECRET_KEYS: key {index + 1} is not a Fernet key (32 url-safe base64-encoded bytes; make one "
                "with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
            ) from None


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("TMS_SECRET_KEYS is empty: secret config values can be neither sealed nor opened.")
    check_keys(keys)
    return MultiFernet([Fernet(key) for key in keys])


def fernet() -> MultiFernet:
    """The configured keys: the first encrypts, all of them decrypt."""
    return _fernet(tuple(tms_settings().SECRET_KEYS))


# --- which values are secret --------------------------------------------------------------------


def parse_path(text: str) -> Path:
    """``"payload.items.0.token"`` as a path (numbers index lists)."""
    return tuple(int(part) if part.isdigit() else part for part in text.split("."))


def runner_secret_fields(runner: str) -> tuple[str, ...]:
    """The config fields ``runner`` declares secret (none for an unknown alias)."""
    try:
        return tuple(get_runner(runner).secret_config_fields)
    except UnknownRunner:
        return ()


def _children(value: Any) -> Iterator[tuple[str | int, Any]]:
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, list):
        yield from enumerate(value)


def _is_secret_url(value: Any) -> bool:
    return isinstance(value, str) and "://" in value and mask_url(value) != value


def _walk(value: Any, path: Path, marked: frozenset[Path], secret: bool) -> Iterator[tuple[Path, bool]]:
    """(path, whole) of each secret leaf: ``whole`` when all of it is secret, False for a URL
    secret only for its password or query (shown with :func:`mask_url`)."""
    if _is_token(value):
        yield path, secret
        return
    if isinstance(value, dict | list):
        for key, item in _children(value):
            child = (*path, key)
            below = secret or child in marked or is_secret_key(key) or is_environment_key(key)
            yield from _walk(item, child, marked, below)
        return
    if value is None or value == "":
        return
    if secret:
        yield path, True
    elif _is_secret_url(value):
        yield path, False


def _secret_leaves(runner: str, config: Any, secret_fields: Iterable[str]) -> list[tuple[Path, bool]]:
    marked = frozenset(parse_path(text) for text in (*runner_secret_fields(runner), *secret_fields))
    return list(_walk(config, (), marked, False))


def secret_paths(runner: str, config: Any, secret_fields: Iterable[str] = ()) -> list[Path]:
    """Paths of the secret leaves of ``config`` (plain or sealed) on ``runner``."""
    return [path for path, _ in _secret_leaves(runner, config, secret_fields)]


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def _replace(config: Any, replacements: dict[Path, Any]) -> Any:
    """A copy of ``config`` with the value at each path replaced."""

    def rebuild(value: Any, path: Path) -> Any:
        if path in replacements:
            return replacements[path]
        if isinstance(value, dict):
            return {key: rebuild(item, (*path, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [rebuild(item, (*path, index)) for index, item in enumerate(value)]
        return value

    return rebuild(config, ())


def _is_token(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {ENCRYPTED} and isinstance(value[ENCRYPTED], str)


def _open_value(value: Any) -> Any:
    try:
        return json.loads(fernet().decrypt(value[ENCRYPTED].encode()))
    except InvalidToken:
        raise SecretsUnavailable(
            "A secret config value cannot be decrypted with any key of TMS_SECRET_KEYS (was a key removed?)."
        ) from None


def _seal_value(value: Any) -> dict[str, str]:
    return {ENCRYPTED: fernet().encrypt(json.dumps(value).encode()).decode()}


# --- the operations ----------------------------------------------------------------------------


def config_seal(runner: str, config: Any, secret_fields: Iterable[str] = ()) -> Any:
    """``config`` (plain) as it is stored: each secret value encrypted."""
    paths = secret_paths(runner, config, secret_fields)
    return _replace(
        config, {path: _seal_value(_get(config, path)) for path in paths if not _is_token(_get(config, path))}
    )


def config_open(config: Any) -> Any:
    """``config`` (stored) with every encrypted value decrypted: for the runner, never for display."""
    if not _has_token(config):
        return config

    def rebuild(value: Any) -> Any:
        if _is_token(value):
            return _open_value(value)
        if isinstance(value, dict):
            return {key: rebuild(item) for key, item in value.items()}
        if isinstance(value, list):
            return [rebuild(item) for item in value]
        return value

    return rebuild(config)


def _has_token(value: Any) -> bool:
    if _is_token(value):
        return True
    return any(_has_token(item) for _, item in _children(value))


def config_masked(runner: str, config: Any, secret_fields: Iterable[str] = ()) -> Any:
    """``config`` (plain or stored) as people see it: every secret value reads :data:`MASK`;
    a URL secret only for its password or secret-named query parameters keeps its shape."""
    replacements: dict[Path, Any] = {}
    for path, whole in _secret_leaves(runner, config, secret_fields):
        if whole:
            replacements[path] = MASK
        else:
            value = _get(config, path)
            replacements[path] = mask_url(_open_value(value) if _is_token(value) else value)
    return _replace(config, replacements)


def config_masked_pair(
    before: tuple[str, Any, Iterable[str]], after: tuple[str, Any, Iterable[str]]
) -> tuple[Any, Any]:
    """Two plain configs, each as ``(runner, config, secret_fields)``, masked for a diff: a secret
    whose value changed reads ``"******** (changed)"`` on the after side, so a diff shows that it
    changed without showing it."""
    masked_before, masked_after = config_masked(*before), config_masked(*after)
    changed: dict[Path, Any] = {}
    for path in secret_paths(*after):
        try:
            old = _get(before[1], path)
        except (KeyError, IndexError, TypeError):
            old = None
        if old != _get(after[1], path):
            changed[path] = f"{MASK} (changed)"
    return masked_before, _replace(masked_after, changed) if changed else masked_after


def config_unmask(submitted: Any, stored_plain: Any) -> Any:
    """``submitted`` (edited from the masked config) with each value still reading :data:`MASK`
    given back its stored value: sending the mask back keeps a secret, anything else replaces it."""
    return unmask_config(submitted, stored_plain)


def config_unmask_kept(submitted: Any, stored_plain: Any) -> tuple[Any, set[Path]]:
    """:func:`config_unmask`, and the paths whose value it put back from ``stored_plain`` (each
    place the mask, or a masked URL, was sent back): the secrets an update keeps unseen."""
    kept: set[Path] = set()

    def walk(value: Any, stored: Any, path: Path) -> Any:
        if isinstance(value, dict) and isinstance(stored, dict):
            return {
                key: walk(item, stored[key], (*path, key)) if key in stored else item for key, item in value.items()
            }
        if isinstance(value, list) and isinstance(stored, list):
            return [walk(item, stored[i], (*path, i)) if i < len(stored) else item for i, item in enumerate(value)]
        restored = unmask_config(value, stored)  # a leaf (or a mask sent for a whole subtree)
        if restored != value:
            kept.add(path)
        return restored

    return walk(submitted, stored_plain, ()), kept


def _drop(config: Any, paths: Iterable[Path]) -> Any:
    """A copy of ``config`` without the values at ``paths``: a mapping's key goes, a list's item
    becomes ``""`` (the other items keep their places)."""
    config = json.loads(json.dumps(config))
    for path in paths:
        parent = _get(config, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = ""
    return config


def _path_text(path: Path) -> str:
    return ".".join(str(part) for part in path)


def config_carry_secrets(
    before: tuple[str, Any, Iterable[str]],
    after: tuple[str, Any, Iterable[str]],
    *,
    kept: set[Path] | None,
    moved: bool,
) -> tuple[Any, list[str]]:
    """Apply the rule that a stored secret is never shown again, to anyone, to an update from
    ``before`` to ``after`` (each ``(runner, plain config, secret_fields)``), whose config kept
    the values at ``kept`` from before (None: the update sent no config, so it kept them all).

    * ``moved`` (the run now goes elsewhere: another runner, URL or host, command, function,
      image, recipients, artifact): every secret kept from before is dropped, unless it was sent
      again in the update; the credentials of a task never follow a run someone pointed elsewhere.
    * Else a kept secret must stay secret: one that ``after`` would show (a path taken out of
      ``secret_fields``, another runner's rules) is an :class:`InvalidInput` on ``secret_fields``
      unless its value is sent again.

    Answers the config to store and the paths it dropped (for the audit)."""
    runner, config, fields = before
    carried: list[Path] = []
    for path in secret_paths(runner, config, fields):
        if kept is not None and not any(path[:depth] in kept for depth in range(len(path) + 1)):
            continue  # sent again (or removed) by the update
        try:
            same = _get(after[1], path) == _get(config, path)
        except (KeyError, IndexError, TypeError):
            continue
        if same:
            carried.append(path)
    if not carried:
        return after[1], []
    if moved:
        return _drop(after[1], carried), [_path_text(path) for path in carried]
    still = set(secret_paths(*after))
    shown = [_path_text(path) for path in carried if path not in still]
    if shown:
        raise InvalidInput.on(
            "secret_fields",
            f"{', '.join(shown)} hold(s) a stored secret, which is never shown again: it stays secret unless "
            "config sends its value again in the same request.",
        )
    return after[1], []


#: Secret values shorter than this are not redacted from texts (they would mask ordinary words).
REDACT_MIN_LENGTH = 4


def secret_values(runner: str, config: Any, secret_fields: Iterable[str] = ()) -> list[str]:
    """The secret values of ``config`` (stored or plain) as text, longest first, for
    :func:`redact`: each whole secret value, and a secret URL's password and secret-named query
    values (which an error message quoting the URL would show)."""
    plain = config_open(config)
    values: set[str] = set()
    for path, whole in _secret_leaves(runner, plain, secret_fields):
        value = _get(plain, path)
        text = value if isinstance(value, str) else json.dumps(value)
        if whole:
            values.add(text)
            continue
        parts = urlsplit(text)
        if parts.password:
            values.update({parts.password, quote(parts.password, safe="")})
        values.update(item for name, item in parse_qsl(parts.query) if is_secret_key(name))
    return sorted((value for value in values if len(value) >= REDACT_MIN_LENGTH), key=len, reverse=True)


def redact(text: str, values: Sequence[str]) -> str:
    """``text`` with every occurrence of ``values`` replaced by :data:`MASK` (an error message or
    output that quotes a secret never reaches the database, the events or the logs)."""
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def has_reserved_key(value: Any) -> bool:
    """Whether ``value`` holds the key that marks an encrypted value (refused in input: a token
    copied from elsewhere must never be decrypted into someone's run)."""
    if isinstance(value, dict):
        return ENCRYPTED in value or any(has_reserved_key(item) for item in value.values())
    if isinstance(value, list):
        return any(has_reserved_key(item) for item in value)
    return False


def config_rotate(config: Any) -> tuple[Any, int]:
    """``config`` (stored) with every token re-encrypted with the first key; and how many."""
    count = 0

    def rebuild(value: Any) -> Any:
        nonlocal count
        if _is_token(value):
            count += 1
            try:
                return {ENCRYPTED: fernet().rotate(value[ENCRYPTED].encode()).decode()}
            except InvalidToken:
                raise SecretsUnavailable("A secret config value cannot be decrypted with any key.") from None
        if isinstance(value, dict):
            return {key: rebuild(item) for key, item in value.items()}
        if isinstance(value, list):
            return [rebuild(item) for item in value]
        return value

    return rebuild(config), count


def check_secret_fields(config: Any, secret_fields: Any) -> dict[str, list[str]]:
    """Per-field errors of a task's ``secret_fields``: a list of paths, each naming something in
    ``config`` (a path that names nothing would protect nothing)."""
    if not isinstance(secret_fields, list) or not all(isinstance(item, str) for item in secret_fields):
        return {"secret_fields": ['A list of paths into config, such as "payload.token".']}
    problems = []
    for text in secret_fields:
        try:
            _get(config, parse_path(text))
        except (KeyError, IndexError, TypeError):
            problems.append(f"{text!r} names nothing in config.")
    return {"secret_fields": problems} if problems else {}


# --- secret texts (columns encrypted as a whole) -------------------------------------------------

#: The prefix of a whole text column stored encrypted (a notification channel's signing secret
#: and target): ``"$enc:<Fernet token>"``. The empty string stays empty ("not set" stays visible).
TEXT_PREFIX = "$enc:"


def text_seal(value: str) -> str:
    """``value`` as it is stored: encrypted with the first key (an already sealed value is kept)."""
    if not value or value.startswith(TEXT_PREFIX):
        return value
    return TEXT_PREFIX + fernet().encrypt(value.encode()).decode()


def text_open(stored: str) -> str:
    """A stored text decrypted; raise :class:`SecretsUnavailable` if no key opens it (or it was
    stored in the clear, which only a write around the model could do)."""
    if not stored:
        return stored
    if not stored.startswith(TEXT_PREFIX):
        raise SecretsUnavailable("A secret column holds a value that is not encrypted.")
    try:
        return fernet().decrypt(stored[len(TEXT_PREFIX) :].encode()).decode()
    except InvalidToken:
        raise SecretsUnavailable(
            "A secret value cannot be decrypted with any key of TMS_SECRET_KEYS (was a key removed?)."
        ) from None


def text_rotate(stored: str) -> str:
    """A stored text re-encrypted with the first key (empty stays empty)."""
    if not stored:
        return stored
    if not stored.startswith(TEXT_PREFIX):
        return text_seal(stored)
    try:
        return TEXT_PREFIX + fernet().rotate(stored[len(TEXT_PREFIX) :].encode()).decode()
    except InvalidToken:
        raise SecretsUnavailable("A secret value cannot be decrypted with any key.") from None


# --- rotation of other apps' secrets -------------------------------------------------------------

#: What ``manage.py tms_rotate_keys`` re-encrypts besides task configs: name -> a function of the
#: batch size answering (rows rewritten, values re-encrypted, ids of rows no key opens). Apps
#: above this one (notifications) register theirs when they are ready, so this module needs no
#: import of them.
ROTATIONS: dict[str, Callable[[int], tuple[int, int, list[str]]]] = {}


def register_rotation(name: str, rotate: Callable[[int], tuple[int, int, list[str]]]) -> None:
    """Have ``tms_rotate_keys`` call ``rotate(batch)`` for the secrets called ``name``."""
    ROTATIONS[name] = rotate
