"""A runner config as the runner judges it, for a task's change and for a single run's override.

A task's config is checked here when it is created or changed (:mod:`tasks_api.creation`,
:mod:`tasks_api.editing`), and so is a replay's partial config (:func:`config_override`, ``POST
/api/v1/executions/replay``): the same size limit, reserved key, runner validation and secret
rules, whoever asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rest_framework import serializers

from runners.registry import UnknownRunner, get_runner, runner_aliases
from tasks_app.masking import MASK
from tasks_app.models import Task
from tasks_app.quotas import check_config_size
from tasks_app.run_input import check_input, config_filled
from tasks_app.secrets import (
    Path,
    config_carry_secrets,
    config_open,
    config_seal,
    config_unmask,
    has_reserved_key,
    secret_paths,
)
from tms_core.errors import InvalidInput


def task_validate_runner(*, runner: str, config: Any) -> dict[str, Any]:
    """Return ``config`` once the runner accepted it, or raise :class:`InvalidInput` on ``runner``
    or ``config`` (with the runner's per-field messages nested under ``config``)."""
    # The size first: a runner's validation of a huge document would cost more than measuring it.
    check_config_size(config)
    try:
        backend = get_runner(runner)
    except UnknownRunner:
        raise InvalidInput.on(
            "runner", f"Unknown runner {runner!r}; choose one of: {', '.join(runner_aliases())}."
        ) from None
    if has_reserved_key(config):
        raise InvalidInput.on("config", 'The key "$enc" is reserved (it marks encrypted values).')
    try:
        backend.validate_config(config)
    except serializers.ValidationError as exc:  # how runners reject a config (BaseRunner.validate_config)
        raise InvalidInput({"config": exc.detail}) from None
    return config


def task_check_runner_timeout(*, runner: str, config: Any, timeout: Any) -> None:
    """:class:`InvalidInput` on ``config`` when the runner says ``config`` cannot work within the
    task's ``timeout`` (a ``sleep`` pause longer than it); nothing for a config it refuses anyway."""
    try:
        backend = get_runner(runner)
        checked = backend.validate_config(config)
    except (UnknownRunner, serializers.ValidationError):
        return
    if timeout is None:
        return
    problems = backend.timeout_problems(checked, timeout.total_seconds())
    if problems:
        raise InvalidInput({"config": problems})


def destination_moved(before: tuple[str, Any, Any], after: tuple[str, Any], *, artifact: bool) -> bool:
    """Whether a change sends the task's runs elsewhere: another runner or artifact, or a change
    of what the runner's :meth:`~runners.base.BaseRunner.destination` reads (URL and host,
    command, function, image, recipients; the whole config for a runner that declares nothing)."""
    if artifact or before[0] != after[0]:
        return True
    try:
        runner = get_runner(after[0])
    except UnknownRunner:
        return bool(before[1] != after[1])
    return bool(runner.destination(before[1]) != runner.destination(after[1]))


def config_merged(base: Any, override: Any) -> Any:
    """``base`` with ``override`` laid over it: mappings merge key by key, anything else (a list,
    a text, a number) replaces the value it lands on."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = config_merged(base[key], value) if key in base else value
        return merged
    return override


def _sent(value: Any, path: Path = ()) -> Iterator[Path]:
    """The leaf paths of an override that send a value (not the mask, which keeps the stored one)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _sent(item, (*path, key))
    elif value != MASK:
        yield path


def config_override(*, task: Task, override: dict[str, Any]) -> tuple[Any, list[str]]:
    """The config a run of ``task`` uses with ``override`` (a partial config) laid over the task's,
    checked as a change of the task's config would be: the runner validates it (:class:`InvalidInput`
    on ``config``); a secret sent as its mask keeps the task's value; and when the override points
    the run elsewhere (another URL, host, command ...), the task's secrets that it did not send again
    are dropped, as an update of the task would drop them. Returns the config sealed as a task's is
    stored (secrets encrypted) and the paths of the secrets dropped."""
    if not isinstance(override, dict):
        raise InvalidInput.on("config", "A JSON object: the config values to change for these runs.")
    check_config_size(override)
    if has_reserved_key(override):
        raise InvalidInput.on("config", 'The key "$enc" is reserved (it marks encrypted values).')
    plain = config_open(task.config)
    fields = list(task.secret_fields or [])
    merged = config_merged(plain, config_unmask(override, plain))
    merged = task_validate_runner(runner=task.runner, config=json.loads(json.dumps(merged)))
    sent = set(_sent(override))
    kept = {
        path
        for path in secret_paths(task.runner, plain, fields)
        if not any(path[:depth] in sent for depth in range(1, len(path) + 1))
    }
    before = (task.runner, plain, fields)
    moved = destination_moved(before, (task.runner, merged), artifact=False)
    merged, dropped = config_carry_secrets(before, (task.runner, merged, fields), kept=kept, moved=moved)
    if dropped:
        merged = task_validate_runner(runner=task.runner, config=merged)
    return config_seal(task.runner, merged, [path for path in fields if _names(merged, path)]), dropped


def config_for_run(
    *, runner: str, config: Any, secret_fields: Iterable[str], run_input: Any, fills: Mapping[str, str] | None
) -> tuple[Any, list[str]]:
    """``config`` (plain) with the paths of ``fills`` set from ``run_input`` (:func:`config_filled`),
    under the rule an update and a replay's override follow: when the filled values send the run
    elsewhere (the runner's :meth:`~runners.base.BaseRunner.destination` changes: another URL,
    command, function, image, recipients), every secret of ``config`` is left out of the filled
    one. A task cannot be saved with such a fill while its config holds secrets
    (:func:`tasks_app.run_input.check_input_fills`); this keeps a task saved before that rule, or a
    replay's config, from sending its credentials where an input says. Answers the config and the
    paths of the secrets dropped."""
    filled = config_filled(config, run_input, fills)
    if filled is config:
        return config, []
    fields = list(secret_fields)
    if not destination_moved((runner, config, fields), (runner, filled), artifact=False):
        return filled, []
    return config_carry_secrets((runner, config, fields), (runner, filled, fields), kept=None, moved=True)


def input_check(*, task: Task, run_input: dict[str, Any] | None) -> None:
    """Raise :class:`InvalidInput` on ``input`` unless ``run_input`` may be given to a run of
    ``task``: a bounded JSON object (or none) that satisfies the task's ``input_schema``, and
    whose values, filled into the config (``input_fills``, :func:`config_for_run`), leave a
    config the runner accepts."""
    check_input(run_input, task.input_schema)
    if run_input and task.input_fills:
        filled, _dropped = config_for_run(
            runner=task.runner,
            config=config_open(task.config),
            secret_fields=task.secret_fields or [],
            run_input=run_input,
            fills=task.input_fills,
        )
        try:
            task_validate_runner(runner=task.runner, config=filled)
        except InvalidInput as exc:
            raise InvalidInput(
                {"input": [f"Filled into config (input_fills), it makes a config the runner refuses: {exc.errors}"]}
            ) from None


def _names(config: Any, path: str) -> bool:
    value = config
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return False
    return True
