"""Loads runner backends from the ``TMS_RUNNERS`` setting, one instance per alias."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from runners.base import BaseRunner


class UnknownRunner(LookupError):
    """No runner is configured under the given alias."""


def _build(alias: str, conf: object) -> BaseRunner:
    if not isinstance(conf, dict) or "BACKEND" not in conf:
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}] must be a dict with a BACKEND key.")
    extra = sorted(set(conf) - {"BACKEND", "OPTIONS", "MIN_INTERVAL"})
    if extra:
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: unknown keys {', '.join(extra)}.")
    try:
        backend = import_string(conf["BACKEND"])
    except ImportError as exc:
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: cannot import {conf['BACKEND']!r}: {exc}") from exc
    if not (isinstance(backend, type) and issubclass(backend, BaseRunner)):
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: {conf['BACKEND']!r} is not a BaseRunner.")
    runner = backend(alias, conf.get("OPTIONS") or {})
    if "MIN_INTERVAL" in conf:
        value = conf["MIN_INTERVAL"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: MIN_INTERVAL must be a number of seconds (>= 0).")
        runner.min_interval = float(value)
    return runner


@cache
def all_runners() -> dict[str, BaseRunner]:
    """Every configured runner by alias; raises ImproperlyConfigured for a bad entry."""
    return {alias: _build(alias, conf) for alias, conf in settings.TMS_RUNNERS.items()}


def get_runner(alias: str) -> BaseRunner:
    try:
        return all_runners()[alias]
    except KeyError:
        raise UnknownRunner(alias) from None


def runner_aliases() -> list[str]:
    return sorted(settings.TMS_RUNNERS)


def _reset(*, setting: str, **kwargs: object) -> None:
    if setting == "TMS_RUNNERS":
        all_runners.cache_clear()


setting_changed.connect(_reset)
