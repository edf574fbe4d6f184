"""Celery tasks of the tasks app: thin wrappers that call one service each."""

from __future__ import annotations

from celery import shared_task

from tasks_app.artifacts import artifact_uploads_expire
from tasks_app.hooks import hook_signatures_expire
from tasks_app.idempotency import idempotency_keys_expire
from tasks_app.quotas import quota_uses_expire


@shared_task(name="tms.expire_idempotency_keys", ignore_result=True, send_events=False)
def expire_idempotency_keys() -> int:
    # Both are requests remembered so that a repeated one starts nothing twice.
    return idempotency_keys_expire() + hook_signatures_expire()


@shared_task(name="tms.expire_artifact_uploads", ignore_result=True, send_events=False)
def expire_artifact_uploads() -> int:
    return artifact_uploads_expire()


@shared_task(name="tms.expire_quota_uses", ignore_result=True, send_events=False)
def expire_quota_uses() -> int:
    return quota_uses_expire()
