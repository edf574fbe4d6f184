"""A run's input: what a trigger, a trigger URL's body or an upstream's output gives one run of a
task, and how a task declares what it accepts (``input_schema``) and which of its config values an
input may fill (``input_fills``).

* ``input_schema``: a JSON Schema (any draft ``jsonschema`` knows; 2020-12 when it names none)
  that a trigger's input must satisfy, checked when the task is saved (as a schema) and when a run
  is asked for (the input against it).
* ``input_fills``: ``{"<config path>": "<input path>"}``, both dot-separated (a number indexes a
  list). At run time the runner gets the task's config with exactly those paths set from the
  run's input; a path whose input value is missing keeps the config's value. A fill path must name
  something in the config and no secret (an input is shown, a secret never is).

The engine applies the fills (:func:`config_filled`, in :func:`executions.runs.run_spec`), so
runs of every origin get them: triggered, started by a trigger URL, a workflow's steps, replays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from tasks_app.secrets import has_reserved_key, parse_path, secret_paths
from tms_core.errors import InvalidInput

#: The largest input (characters of its JSON) a run is given: a trigger's, a trigger URL's body, an
#: upstream's output read as its follower's input.
INPUT_MAX_CHARS = 64 * 1024
#: The largest ``input_schema`` (characters of its JSON).
SCHEMA_MAX_CHARS = 64 * 1024
#: The most entries of ``input_fills``, and the longest path in one.
MAX_FILLS = 100
MAX_PATH_CHARS = 200

Path = tuple[str | int, ...]


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _has_nul(value: Any) -> bool:
    """PostgreSQL's ``jsonb`` refuses ``\\u0000``: refused here with a message instead."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def _where(path: Iterable[Any]) -> str:
    parts = [str(part) for part in path]
    return ".".join(parts) if parts else "the input itself"


def check_input_schema(schema: Any) -> list[str]:
    """The problems of ``schema`` as a task's ``input_schema`` (none: it is one, or null)."""
    if schema is None:
        return []
    if not isinstance(schema, dict):
        return ['A JSON Schema: an object, such as {"type": "object", "required": ["date"]}.']
    if len(_text(schema)) > SCHEMA_MAX_CHARS:
        return [f"At most {SCHEMA_MAX_CHARS} characters of JSON."]
    if _has_nul(schema):
        return ["Null characters are not allowed."]
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return [f"Not a valid JSON Schema: {exc.message} (at {_where(exc.absolute_path)})."]
    return []


def check_input(value: Any, schema: Mapping[str, Any] | None) -> None:
    """Raise :class:`InvalidInput` on ``input`` unless ``value`` may be a run's input: a JSON
    object within :data:`INPUT_MAX_CHARS` that satisfies ``schema`` (when the task has one; a run
    asked for without an input is checked as ``{}``, so a schema's required keys are required)."""
    if value is not None:
        if not isinstance(value, dict):
            raise InvalidInput.on("input", 'A JSON object, such as {"date": "2026-11-27"}.')
        size = len(_text(value))
        if size > INPUT_MAX_CHARS:
            raise InvalidInput.on("input", f"At most {INPUT_MAX_CHARS} characters of JSON; this one has {size}.")
        if _has_nul(value):
            raise InvalidInput.on("input", "Null characters are not allowed.")
        if has_reserved_key(value):
            raise InvalidInput.on("input", 'The key "$enc" is reserved (it marks encrypted values).')
    if schema is None:
        return
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors({} if value is None else value), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidInput({"input": [f"{error.message} (at {_where(error.absolute_path)})" for error in errors[:10]]})


def input_schema_problem(value: Any, schema: Mapping[str, Any]) -> str:
    """Why ``value`` (a run's input) does not satisfy ``schema``, in one line; "" if it does."""
    try:
        check_input(value, schema)
    except InvalidInput as exc:
        return "; ".join(str(message) for message in exc.errors["input"])
    return ""


def _get(value: Any, path: Path) -> Any:
    for key in path:
        if isinstance(value, dict) and isinstance(key, str | int):
            value = value[str(key)] if str(key) in value else value[key]
        elif isinstance(value, list) and isinstance(key, int):
            value = value[key]
        else:
            raise KeyError(key)
    return value


def check_input_fills(*, fills: Any, runner: str, config: Any, secret_fields: Iterable[str]) -> list[str]:
    """The problems of ``fills`` as a task's ``input_fills`` for this (plain) config."""
    if fills is None:
        return []
    if not isinstance(fills, dict):
        return ['An object mapping config paths to input paths, such as {"payload.date": "date"}.']
    if len(fills) > MAX_FILLS:
        return [f"At most {MAX_FILLS} entries."]
    secret = set(secret_paths(runner, config, secret_fields))
    problems = []
    for target, source in fills.items():
        if not target or len(target) > MAX_PATH_CHARS:
            problems.append(f"{target!r}: a config path of 1 to {MAX_PATH_CHARS} characters.")
            continue
        if not isinstance(source, str) or not source or len(source) > MAX_PATH_CHARS:
            problems.append(f"{target!r}: its input path must be a text of 1 to {MAX_PATH_CHARS} characters.")
            continue
        path = parse_path(target)
        try:
            _get(config, path)
        except (KeyError, IndexError, TypeError):
            problems.append(f"{target!r} names nothing in config (a fill replaces a value the config has).")
            continue
        if any(path[:depth] in secret for depth in range(1, len(path) + 1)) or any(
            hidden[: len(path)] == path for hidden in secret
        ):
            problems.append(f"{target!r} is (or holds) a secret: an input is shown, so it cannot fill one.")
    return problems


def config_filled(config: Any, run_input: Any, fills: Mapping[str, str] | None) -> Any:
    """``config`` (plain) with each path of ``fills`` set from ``run_input`` where the input has
    a value there; nothing else changes (a copy: ``config`` is left as it was)."""
    if not fills or not isinstance(run_input, dict):
        return config
    filled = json.loads(json.dumps(config))
    for target, source in fills.items():
        try:
            value = _get(run_input, parse_path(source))
            path = parse_path(target)
            parent = _get(filled, path[:-1])
            key = path[-1]
            if isinstance(parent, dict):
                if str(key) not in parent:
                    continue  # the config no longer has it: nothing to fill
                parent[str(key)] = value
            elif isinstance(parent, list) and isinstance(key, int) and key < len(parent):
                parent[key] = value
        except (KeyError, IndexError, TypeError):
            continue  # the input has no value there: the config's stays
    return filled
