"""The monitor's LISTEN connection, lost (a PostgreSQL failover ends every session; here its one
backend is terminated on the shared server), is made again at once, and the monitor looks for
what it missed: a run made due (and NOTIFYed) just after is taken within about a second, not
after the rest of the monitor's sleep (issue 45).

The monitor sleeps up to 10 s here (``TMS_MONITOR_MAX_SLEEP``), so only a NOTIFY heard on a live
LISTEN connection wakes it early."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.notify import CHANNEL
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import running, start_monitor, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: How soon a run made due must be taken, well under the 10 s sleep (it takes about 0.1 s).
PROMPT = 3.0


def _listening() -> set[int]:
    """The backends of this database that LISTEN for due work (the monitor's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            [f"LISTEN {CHANNEL}"],
        )
        return {pid for (pid,) in cursor.fetchall()}


def _taken_within(owner, name: str) -> float:
    """Make a run due now (its creation NOTIFYs); seconds until the monitor took it."""
    task = task_create(owner=owner, runner="noop", config={}, name=name)
    made = time.monotonic()
    wait_for(
        lambda: Execution.objects.filter(task=task, status=S.PENDING).exists(),
        timeout=PROMPT,
        what=f"the monitor to take {name}'s run",
    )
    return time.monotonic() - made


def test_a_lost_listen_connection_is_made_again_at_once_and_notifies_heard():
    owner = UserFactory()
    monitor = start_monitor(TMS_MONITOR_MAX_SLEEP="10")
    with running(monitor):
        (first,) = wait_for(_listening, timeout=30, what="the monitor's LISTEN")
        assert _taken_within(owner, "before") < PROMPT

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
            assert cursor.fetchone() == (True,)
        killed = time.monotonic()
        (second,) = wait_for(lambda: _listening() - {first}, timeout=PROMPT, what="the monitor to LISTEN again")
        listening_again = time.monotonic() - killed
        assert second != first and listening_again < PROMPT

        assert _taken_within(owner, "after") < PROMPT
        assert monitor.alive  # the monitor lived through it
        monitor.popen.kill()  # not SIGTERM: that ends the monitor after its sleep (10 s here)
    assert Execution.objects.filter(status=S.PENDING).count() == 2
