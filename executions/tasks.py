"""Celery tasks: thin wrappers that take ids and call one service each."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_init
from django.db import InterfaceError, OperationalError

from executions import heartbeat, materialiser, worker_services
from executions.conf import tms_settings
from executions.worker_identity import lease_owner, set_node_id

#: Database outages are retried by republishing with backoff; the row stays the source of truth.
_DB_ERRORS = (OperationalError, InterfaceError)


@worker_init.connect
def _name_worker_node(sender, **kwargs) -> None:  # type: ignore[no-untyped-def]
    set_node_id()


@shared_task(
    name="tms.run_execution",
    ignore_result=True,
    autoretry_for=_DB_ERRORS,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=None,
)
def run_execution(execution_id: int, attempt: int) -> str:
    return worker_services.execution_run(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())


@shared_task(
    name="tms.poll_execution",
    ignore_result=True,
    autoretry_for=_DB_ERRORS,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=None,
)
def poll_execution(execution_id: int, attempt: int) -> str:
    return worker_services.execution_resume(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())


@shared_task(name="tms.materialise", ignore_result=True)
def materialise() -> int:
    return materialiser.materialise_due()


@shared_task(name="tms.liveness", ignore_result=True)
def liveness() -> list[str]:
    return heartbeat.workers_mark_dead(timeout=tms_settings().WORKER_TIMEOUT)
