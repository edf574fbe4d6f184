"""The small JSON paths that named events use (``$.customer_id``, ``$.order.id``): a debounce key
in an event's payload, a wait-for-event step's correlation key in its run's input and the field
of the event it is compared with. Only object keys, dot-separated, after ``$``."""

from __future__ import annotations

import re
from typing import Any

#: One key of a path: letters, digits, ``_`` and ``-``.
_KEY = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
#: The most keys a path may have.
MAX_DEPTH = 10

_MISSING = object()


def json_path_parse(text: Any) -> tuple[str, ...]:
    """The keys of ``text`` (``$.a.b`` -> ``("a", "b")``), or :class:`ValueError` saying why not."""
    if not isinstance(text, str) or not text.startswith("$."):
        raise ValueError('Expected a JSON path such as "$.customer_id" ($, then dot-separated keys).')
    keys = tuple(text[2:].split("."))
    if len(keys) > MAX_DEPTH:
        raise ValueError(f"At most {MAX_DEPTH} keys.")
    for key in keys:
        if not _KEY.match(key):
            raise ValueError(f"{key!r} is not a key: use letters, digits, _ and -.")
    return keys


def json_path_get(value: Any, path: str) -> Any:
    """The value at ``path`` in ``value``, or :data:`MISSING` when it has none."""
    for key in json_path_parse(path):
        if not isinstance(value, dict) or key not in value:
            return MISSING
        value = value[key]
    return value


#: What :func:`json_path_get` answers for a path that leads nowhere.
MISSING: Any = _MISSING
