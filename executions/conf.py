"""Typed access to the ``TMS`` settings dict, with defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields

from django.conf import settings


@dataclass(frozen=True)
class TmsSettings:
    #: Seconds ahead for which recurring tasks are turned into executions.
    MATERIALISE_HORIZON: float = 300.0
    #: Seconds between beat-run materialiser passes.
    MATERIALISE_INTERVAL: float = 5.0
    #: Tasks locked per materialiser transaction.
    MATERIALISE_BATCH: int = 2000
    #: Executions published per monitor transaction.
    MONITOR_BATCH: int = 500
    #: Longest the monitor sleeps when it knows of no due work and hears no NOTIFY.
    MONITOR_MAX_SLEEP: float = 1.0
    #: A PENDING execution unclaimed for this many seconds is published again.
    PENDING_REPUBLISH_AFTER: float = 120.0
    #: Seconds between worker heartbeats (which also extend the worker's leases).
    HEARTBEAT_INTERVAL: float = 5.0
    #: A worker silent for this long is dead; its leases expire after the same time.
    WORKER_TIMEOUT: float = 30.0
    #: Lease losses (dead workers) tolerated while an attempt has no external run yet; past it
    #: the attempt fails (and is retried per the task's policy), so a crash loop ends.
    MAX_HANDBACKS: int = 3
    #: Bound on the stored output and error text of an execution.
    OUTPUT_MAX_CHARS: int = 16384
    #: Default task timeout in seconds.
    DEFAULT_TIMEOUT: float = 1200.0


def tms_settings() -> TmsSettings:
    configured = getattr(settings, "TMS", {})
    known = {f.name for f in fields(TmsSettings)}
    unknown = set(configured) - known
    if unknown:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"Unknown TMS settings: {', '.join(sorted(unknown))}")
    return TmsSettings(**configured)
