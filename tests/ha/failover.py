"""The PostgreSQL failover scenario of tests/ha, shared by its routes to the primary: the libpq
multi-host URL (test_pg_failover.py) and HAProxy with Patroni's REST check
(test_haproxy_failover.py), on one private Patroni pair (the package's ``pg_cluster``).

Real worker and monitor processes run against the pair through the route under test
(``DATABASE_URL`` of their own; the pytest-django database is not involved): a few hundred noop
runs, one-shot ones spread over the window and a herd due at one instant just after the fault.
Judged from the pair's tables (read through the multi-host URL, whatever the route): every run
SUCCEEDED (0 lost, 0 cancelled as late), each claimed once (0 duplicate launches), every process
alive; the times from the fault to the primary being writable through the route and to the first
run ending after it are printed.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable

import psycopg2
from django.conf import settings

from tests.processes import LOG_DIR, ROOT, TEST_SETTINGS, process_env, wait_for
from tooling.harness import processes
from tooling.harness.pg_cluster import PgCluster, PgNode

SPREAD, HERD = 150, 150
#: Seconds from the seed's start to the first spread run, to the fault, and to the herd.
FIRST, FAULT_AT, HERD_AT, SPREAD_OVER = 6.0, 9.0, 10.0, 10.0
_queues = itertools.count(1)

SEED = """
import sys, django
django.setup()
from datetime import timedelta
from django.db import connection
from django.utils import timezone
from tests.factories import ExecutionFactory, TaskFactory
# Created an hour ahead, then moved in one statement to times counted from the end of the
# seeding: on a loaded machine creating 450 rows takes many seconds, and runs due meanwhile would
# run (or all be done) before the fault.
ahead = timezone.now() + timedelta(hours=1)
tag = sys.argv[6]
task = TaskFactory(name=f"{tag} spread", misfire_grace=timedelta(seconds=60))
spread, herd, first, herd_at, over = int(sys.argv[1]), int(sys.argv[2]), *map(float, sys.argv[3:6])
for i in range(spread):
    ExecutionFactory(task=task, scheduled_for=ahead + timedelta(seconds=first + over * i / spread))
for i in range(herd):
    # A herd: many tasks' runs due at one instant (one task has one run per instant).
    other = TaskFactory(name=f"{tag} herd {i}", owner=task.owner, team=task.team, misfire_grace=timedelta(seconds=60))
    ExecutionFactory(task=other, scheduled_for=ahead + timedelta(seconds=herd_at))
t0 = timezone.now()
with connection.cursor() as cursor:
    cursor.execute(
        "UPDATE executions_execution SET scheduled_for = scheduled_for - %s, due_at = due_at - %s"
        " WHERE task_id IN (SELECT id FROM tasks_app_task WHERE name LIKE %s)",
        [ahead - t0, ahead - t0, f"{tag} %"],
    )
print(t0.timestamp())
"""


def _seed(url: str, tag: str) -> float:
    result = subprocess.run(
        [sys.executable, "-c", SEED, str(SPREAD), str(HERD), str(FIRST), str(HERD_AT), str(SPREAD_OVER), tag],
        cwd=ROOT,
        env=process_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


#: The scenario's runs by status: those of the tasks named after its tag.
STATUSES = (
    "SELECT status, count(*) FROM executions_execution e"
    " WHERE e.task_id IN (SELECT id FROM tasks_app_task WHERE name LIKE %s) GROUP BY 1"
)


def _query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """``sql`` on the pair's primary (libpq picks it from the multi-host URL)."""
    conn = psycopg2.connect(url, connect_timeout=3)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    finally:
        conn.close()


def _statuses(url: str, tagged: str) -> dict[str, int]:
    try:
        rows = _query(url, STATUSES, (tagged,))
    except psycopg2.OperationalError:
        return {}  # the failover: ask again
    return dict(rows)


def _writable_after(route: str, fault: float, timeout: float = 60.0) -> float:
    """Seconds from ``fault`` until a new connection through ``route`` lands on a server that
    accepts writes (polled every 50 ms: what a TMS process reconnecting would get)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg2.connect(route, connect_timeout=2)
            try:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT pg_is_in_recovery()")
                    if cursor.fetchone() == (False,):
                        return time.time() - fault
            finally:
                conn.close()
        except psycopg2.Error:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing writable through {route} {timeout:g}s after the fault")
        time.sleep(0.05)


def kill_primary(cluster: PgCluster) -> PgNode:
    """SIGKILL the primary's postmaster; the node that is to be primary."""
    old = cluster.kill_primary()
    return next(node for node in cluster.nodes if node is not old)


def switchover(cluster: PgCluster) -> PgNode:
    """A planned ``patronictl switchover`` to the standby; the new primary."""
    return cluster.switchover()


def scenario(cluster: PgCluster, inject: Callable[[PgCluster], PgNode], *, route: str | None = None) -> None:
    """Load, ``inject`` the fault (it returns the node that is to be primary), judge. TMS's
    processes and the seed reach the database through ``route`` (default: the pair's multi-host
    URL)."""
    url = cluster.url  # the judge's
    route = route or url
    old_primary = cluster.primary()
    assert old_primary is not None
    queue = f"{settings.TMS_QUEUE}.hapg{next(_queues)}"
    env = {"DATABASE_URL": route, "TMS_QUEUE": queue, "TMS_MONITOR_MAX_SLEEP": "0.3", "TMS_HEARTBEAT_INTERVAL": "0.5"}
    procs = [
        processes.start_worker("pg-worker-a", log_dir=LOG_DIR, queue=queue, **TEST_SETTINGS, **env),
        processes.start_worker("pg-worker-b", log_dir=LOG_DIR, queue=queue, **TEST_SETTINGS, **env),
        processes.start_monitor("pg-monitor", log_dir=LOG_DIR, **TEST_SETTINGS, **env),
    ]
    try:
        for proc in procs[:2]:
            processes.wait_ready(proc, 60)
        tagged = f"{queue} %"
        started = time.time()
        t0 = _seed(route, queue)
        seeded = t0 - started
        wait_for(lambda: time.time() >= t0 + FAULT_AT, timeout=60, interval=0.05, what="the fault's time")
        done_before = _statuses(url, tagged).get("SUCCEEDED", 0)
        fault = time.time()
        new_primary = inject(cluster)
        writable = _writable_after(route, fault)
        cluster.wait_roles(leader=new_primary, standby=None, timeout=60)
        promoted = time.time() - fault

        def all_ended() -> bool:
            for proc in procs:
                assert proc.alive, f"{proc.name} exited ({proc.popen.returncode}):\n{proc.log()[-3000:]}"
            counts = _statuses(url, tagged)
            return sum(counts.values()) == SPREAD + HERD and set(counts) <= {"SUCCEEDED", "FAILED", "CANCELLED"}

        try:
            wait_for(all_ended, timeout=120, interval=0.5, what="every run to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_statuses(url, tagged)}; roles {cluster.roles()}") from None
        counts = _statuses(url, tagged)
        claims = _query(
            url,
            # A claim (PENDING -> RUNNING) is what launches a run; a worker resuming a RUNNING
            # one after its lease lapsed adopts the launch by its idempotency key instead.
            "SELECT e.id, v.attempt, count(*) FROM executions_executionevent v JOIN executions_execution e"
            " ON e.id = v.execution_id WHERE v.from_status = 'PENDING' AND v.to_status = 'RUNNING'"
            " AND e.task_id IN (SELECT id FROM tasks_app_task WHERE name LIKE %s)"
            " GROUP BY 1, 2 HAVING count(*) > 1",
            (tagged,),
        )
        (first_end,) = _query(
            url,
            "SELECT extract(epoch FROM min(finished_at)) FROM executions_execution e"
            " WHERE e.task_id IN (SELECT id FROM tasks_app_task WHERE name LIKE %s)"
            " AND finished_at > to_timestamp(%s)",
            (tagged, fault),
        )[0]
        late = _query(
            url,
            "SELECT extract(epoch FROM max(started_at - scheduled_for)) FROM executions_execution e"
            " WHERE e.task_id IN (SELECT id FROM tasks_app_task WHERE name LIKE %s)",
            (tagged,),
        )[0][0]
        print(
            f"\n{new_primary.name} primary after the fault, {done_before} runs done before it;"
            f" primary again {promoted:.1f}s after, writable through the route {writable:.1f}s after;"
            f" first run ended {float(first_end) - fault:.1f}s after the fault;"
            f" seeded in {seeded:.1f}s; latest start {float(late):.1f}s after its time; {counts}"
        )
        assert counts == {"SUCCEEDED": SPREAD + HERD}, counts  # 0 lost, 0 failed, 0 cancelled as late
        assert claims == [], f"runs claimed more than once: {claims}"
        assert done_before > 0, "the fault came before the load"
        # Issue 45's goal: runs resume within 5 s of the promotion.
        assert float(first_end) - fault <= promoted + 5.0, (first_end, fault, promoted, writable)
        for proc in procs:
            assert proc.alive, f"{proc.name} died:\n{proc.log()[-3000:]}"
        # The old primary comes back as the new one's synchronous standby.
        cluster.wait_roles(leader=new_primary, standby=old_primary, timeout=90)
    finally:
        for proc in procs:
            proc.stop()
