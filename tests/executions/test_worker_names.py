"""A worker's row and ``/api/v1/workers`` carry Celery's node name (``-n``), the name Flower and
``celery inspect`` use, beside TMS's own ``host:pid`` id (issue 26, item 8). A real worker."""

from __future__ import annotations

import socket

import pytest

from executions.models import Worker
from tests.conftest import client_for
from tests.processes import running, start_worker, wait_for, wait_worker_ready
from tms_project.celery import app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_worker_row_and_the_api_name_the_worker_as_celery_does(staff_user):
    worker = start_worker("named", concurrency=1)
    with running(worker):
        wait_worker_ready(worker)
        row = wait_for(lambda: Worker.objects.filter(pid=worker.pid).first(), timeout=20, what="the worker's row")
        # start_worker names it "named-<ns>@%h"; Celery expands %h to the host name.
        assert row.node_name.startswith("named-") and row.node_name.endswith(f"@{socket.gethostname()}")
        assert row.id == f"{socket.gethostname()}:{worker.pid}"

        shown = client_for(staff_user).get(f"/api/v1/workers/{row.id}").json()
        assert shown["node_name"] == row.node_name
        # The name Celery's own tools answer to (Flower lists workers by it too).
        # A connection of its own: the pool's may be one RabbitMQ closed while this process idled.
        with app.connection_for_write() as conn:
            replies = app.control.inspect(destination=[row.node_name], timeout=5, connection=conn).ping() or {}
        assert replies == {row.node_name: {"ok": "pong"}}
