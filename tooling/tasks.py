"""The benchmark's Celery task. Workers load it through autodiscovery (``tooling`` is an
installed app), so the workers ``tms_bench`` starts can run the bare-Celery baseline."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="tms.bench_noop", ignore_result=True)
def bench_noop() -> None:
    """Does nothing: the bare-Celery baseline that ``tms_bench`` compares the platform with."""
