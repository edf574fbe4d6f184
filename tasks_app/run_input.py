"""A run's input: what a trigger, a trigger URL's body or an upstream's output gives one run of a
task, and how a task declares what it accepts (``input_schema``) and which of its config values an
input may fill (``input_fills``).

* ``input_schema``: a JSON Schema (any draft ``jsonschema`` knows; 2020-12 when it names none)
  that a trigger's input must satisfy, checked when the task is saved (as a schema) and when a run
  is asked for (the input against it).
* ``input_fills``: ``{"<config path>": "<input path>"}``, both dot-separated (a number indexes a
  list). At run time the runner gets the task's config with exactly those paths set from the
  run's input; a path whose input value is missing keeps the config's value. A fill path must name
  something in the config and no secret (an input is shown, a secret never is), and while the
  config holds a secret, nothing of where the run goes (the runner's
  :attr:`~runners.base.BaseRunner.destination_config_fields`: a URL, a command, recipients ...):
  the task's credentials never follow a run that an input pointed elsewhere. The engine enforces
  the same at run time (:func:`tasks_app.run_config.config_for_run`) for tasks saved before.

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

from runners.registry import UnknownRunner, get_runner
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


def has_nul(value: Any) -> bool:
    """Whether a JSON value holds NUL anywhere (in a key too): PostgreSQL's ``jsonb`` refuses
    ``\\u0000``, so the API refuses it with a message instead (a run's input, a task's config)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(key) or has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
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
    if has_nul(schema):
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
        if has_nul(value):
            raise InvalidInput.on("input", "Null characters are not allowed.")
        if has_reserved_key(value):
            raise InvalidInput.on("input", 'The key "$enc" is reserved (it marks encrypted values).')
    if schema is None:
        return
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors({} if value is None else value), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidInput({"input": [f"{error.message} (at {_where(error.absolute_path)})" for error in errors[:10]]})


def _plain(error: Any) -> str:
    """A schema error in plain words where its keyword has a usual phrasing (the message the
    ``jsonschema`` library gives otherwise)."""
    kind, rule = error.validator, error.validator_value
    if kind == "type":
        kinds = rule if isinstance(rule, list) else [rule]
        return "Must be " + " or ".join(PLAIN_TYPES.get(str(name), str(name)) for name in kinds) + "."
    words = {
        "minimum": f"Must be at least {rule}.",
        "maximum": f"Must be at most {rule}.",
        "exclusiveMinimum": f"Must be more than {rule}.",
        "exclusiveMaximum": f"Must be less than {rule}.",
        "minLength": f"At least {rule} character(s).",
        "maxLength": f"At most {rule} character(s).",
        "pattern": f"Must match the pattern {rule}.",
        "multipleOf": f"Must be a multiple of {rule}.",
    }
    if kind == "enum" and isinstance(rule, list):
        return "Must be one of: " + ", ".join(_text(item) for item in rule) + "."
    return words.get(str(kind), str(error.message[:1].upper() + error.message[1:]))


#: JSON Schema's type names in words.
PLAIN_TYPES = {
    "string": "a text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}


def input_problems(value: Any, schema: Mapping[str, Any] | None) -> list[tuple[str | None, str]]:
    """Why ``value`` does not satisfy ``schema``, by the validation :func:`check_input` runs, as
    ``(property, words)`` pairs for a form that has a field per top-level property: ``property``
    is the top-level key a problem is about (a required key that is missing included), None for
    the input as a whole. Empty when it satisfies the schema (or there is none)."""
    if schema is None:
        return []
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    instance = {} if value is None else value
    problems: list[tuple[str | None, str]] = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path)):
        path = list(error.absolute_path)
        if not path and error.validator == "required" and isinstance(error.instance, dict):
            # One error per missing key, each seeing every key missing: each named once.
            for name in error.validator_value:
                if name not in error.instance and (str(name), "Required.") not in problems:
                    problems.append((str(name), "Required."))
            continue
        if not path:
            problems.append((None, _plain(error)))
            continue
        rest = ".".join(str(part) for part in path[1:])
        problems.append((str(path[0]), _plain(error) + (f" (at {rest})" if rest else "")))
    return problems


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
    destinations = _destination_fields(runner)
    problems = []
    for target, source in fills.items():
        if not target or len(target) > MAX_PATH_CHARS:
            problems.append(f"{target!r}: a config path of 1 to {MAX_PATH_CHARS} characters.")
            continue
        if not isinstance(source, str) or not source or len(source) > MAX_PATH_CHARS:
            problems.append(f"{target!r}: its input path must be a text of 1 to {MAX_PATH_CHARS} characters.")
            continue
        if "" in source.split("."):
            # parse_path(".") is two empty keys: no input has a value there, so it would fill nothing.
            problems.append(
                f"{target!r}: its input path {source!r} has an empty part: name a key of the input, "
                'such as "date" or "payload.date" (the whole input cannot fill one value).'
            )
            continue
        if "" in target.split("."):
            problems.append(f'{target!r} has an empty part: name a value of config, such as "payload.date".')
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
        elif secret and (destinations is None or path[0] in destinations):
            problems.append(
                f"{target!r} says where a run goes or what it runs ({_destination_text(runner, destinations)}): "
                f"an input cannot fill it while the config holds secrets ({_paths_text(secret)}), which would "
                "follow the run wherever the input sends it. Take the secrets out of config, or this fill."
            )
    return problems


def _destination_fields(runner: str) -> tuple[str, ...] | None:
    """The config fields that say where a run of ``runner`` goes (None: all of its config)."""
    try:
        return get_runner(runner).destination_config_fields
    except UnknownRunner:
        return None


def _destination_text(runner: str, destinations: tuple[str, ...] | None) -> str:
    if destinations is None:
        return f"any value of a {runner} config"
    return f"{', '.join(destinations)} of a {runner} config"


def _paths_text(paths: Iterable[Path]) -> str:
    return ", ".join(sorted(".".join(str(part) for part in path) for path in paths))


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
