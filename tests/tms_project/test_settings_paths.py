"""Every dotted path the settings name in the product's packages leads somewhere: a module that
moves (tests/test_layering.py's ranks) takes its mentions in the settings with it, or this fails
here rather than at the first request, schema build or run that reads the setting."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from tests.test_layering import PACKAGES

_DOTTED = re.compile(rf"^({'|'.join(PACKAGES)})(\.\w+)+$")


def dotted_paths(value: Any) -> Iterator[str]:
    """The strings in ``value`` (nested lists, tuples and dicts, keys too) that look like a dotted
    path into one of the product's packages."""
    if isinstance(value, str):
        if _DOTTED.match(str(value)):
            yield str(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from dotted_paths(key)
            yield from dotted_paths(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from dotted_paths(item)


def resolves(path: str) -> bool:
    """Whether ``path`` is a module, or attributes (one or more) of a module. A module is only
    looked up, not imported (``tms_project.settings.production`` refuses to load in the suite)."""
    try:
        if importlib.util.find_spec(path) is not None:
            return True
    except ImportError:  # a parent is a module, not a package, or does not exist
        pass
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module)
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_dotted_path_in_the_settings_resolves():
    named = sorted({path for name in dir(settings) if name.isupper() for path in dotted_paths(getattr(settings, name))})
    assert len(named) >= 20  # the runner backends, DRF's classes, the schema's enums, middleware, ...
    assert [path for path in named if not resolves(path)] == []


def test_a_path_left_behind_by_a_move_is_seen():
    assert resolves("tms_core.api.errors.exception_handler")
    assert resolves("tasks_api.compat.CompatStatus.choices")
    assert resolves("tms_project.settings.production")
    assert not resolves("tms_project.api.errors.exception_handler")
    assert not resolves("tasks_app.compat.CompatStatus.choices")
    assert list(dotted_paths({"X": ["tasks_app.models", "not.a.product.path"], "tasks_api.schema": 1})) == [
        "tasks_app.models",
        "tasks_api.schema",
    ]
