"""The benchmark's Celery tasks. Workers load them through autodiscovery (``tooling`` is an
installed app), so the workers ``tms_bench`` starts can run the bare-Celery baselines."""

from __future__ import annotations

import logging
import time

from celery import shared_task

logger = logging.getLogger(__name__)

#: The line :func:`bench_eta` logs; ``tms_bench`` reads the lateness back from the workers' logs.
ETA_LINE = "bench eta lateness_ms="


@shared_task(name="tms.bench_noop", ignore_result=True)
def bench_noop() -> None:
    """Does nothing: the bare-Celery baseline that ``tms_bench`` compares the platform with."""


@shared_task(name="tms.bench_eta", ignore_result=True)
def bench_eta(due: float) -> None:
    """A Celery ETA task (``apply_async(eta=...)``) that logs how late it started: wall clock now
    minus ``due`` (a Unix time; the benchmark runs on one machine, so one clock)."""
    logger.info("%s%.3f", ETA_LINE, (time.time() - due) * 1000)
