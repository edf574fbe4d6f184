"""Celery tasks: thin wrappers that take ids and call one service each."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from celery.signals import worker_init
from django.db import InterfaceError, OperationalError

from executions import heartbeat, materialiser, worker_services
from executions.conf import tms_settings
from executions.worker_identity import lease_owner, set_node_id

logger = logging.getLogger(__name__)

#: Database outages are retried by republishing with backoff; the row stays the source of truth.
_DB_RETRY: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "max_retries": None,
}


@worker_init.connect
def _name_worker_node(sender: Any, **kwargs: Any) -> None:
    set_node_id()


def _note_redelivery(task: Task, execution_id: int) -> None:
    if (task.request.delivery_info or {}).get("redelivered"):
        logger.info("redelivered message %s for execution %s", task.request.id, execution_id)


@shared_task(name="tms.run_execution", bind=True, ignore_result=True, **_DB_RETRY)
def run_execution(self: Task, execution_id: int, attempt: int) -> str:
    _note_redelivery(self, execution_id)
    return worker_services.execution_run(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())


@shared_task(name="tms.poll_execution", bind=True, ignore_result=True, **_DB_RETRY)
def poll_execution(self: Task, execution_id: int, attempt: int) -> str:
    _note_redelivery(self, execution_id)
    return worker_services.execution_resume(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())


@shared_task(name="tms.materialise", ignore_result=True)
def materialise() -> int:
    return materialiser.materialise_due()


@shared_task(name="tms.liveness", ignore_result=True)
def liveness() -> list[str]:
    return heartbeat.workers_mark_dead(timeout=tms_settings().WORKER_TIMEOUT)
