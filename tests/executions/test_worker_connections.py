"""A worker's pool process gets past a database restart at its next task (no dead connection kept)."""

from __future__ import annotations

import pytest
from django.db import Error, connection

from executions.tasks import drop_unusable_connections

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_connection_settings():
    """As in a worker: no per-use health checks (executions.tasks._prepare_worker)."""
    saved = connection.settings_dict["CONN_HEALTH_CHECKS"]
    connection.settings_dict["CONN_HEALTH_CHECKS"] = False
    yield
    connection.settings_dict["CONN_HEALTH_CHECKS"] = saved


def _kill_own_backend() -> None:
    """What a PostgreSQL restart does to the connection: the server ends it under us."""
    with pytest.raises(Error), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def test_a_dead_connection_is_replaced_before_the_next_task(worker_connection_settings):
    _kill_own_backend()
    with pytest.raises(Error), connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # kept as it is, the connection stays dead
    drop_unusable_connections()  # task_prerun of the next task (or of the retry)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_healthy_connection_is_kept_without_a_query(worker_connection_settings, django_assert_num_queries):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    with django_assert_num_queries(0):
        drop_unusable_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == backend
