"""The loss of the RabbitMQ node that holds TMS's queue (a classic queue lives on the node that
declared it: ``home node ... of durable queue ... is down``), on a private three-node cluster
with TMS given the three nodes as a failover URL list (issue 45).

Every process connects to the first node of the list, so the queue lives there; that node is
stopped, then started again. Workers and monitors must ride it out: no exit, no crash loop, no
run left PENDING without a message, and every run done once the node is back.
"""

from __future__ import annotations

import itertools
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import ManagedProcess, running, start_monitor, start_worker, wait_for, wait_worker_ready
from tooling.harness.rabbit_cluster import RabbitCluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The queue's home node is down: RabbitMQ's answer to a declare (and a consume) of the queue.
HOME_DOWN = re.compile(r"home node '[^']+' of durable queue")
_queues = itertools.count(1)


def _env(cluster: RabbitCluster) -> dict[str, str]:
    """The processes' settings: the cluster's URL list, a queue of the test's own, fast loops."""
    return {
        "CELERY_BROKER_URL": cluster.url,
        "TMS_QUEUE": f"{settings.TMS_QUEUE}.ha{next(_queues)}",
        "TMS_MONITOR_MAX_SLEEP": "0.3",
        "TMS_HEARTBEAT_INTERVAL": "0.5",
    }


def _due(count: int) -> list[int]:
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    now = timezone.now()
    return [ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=1 + i / 1000)).pk for i in range(count)]


def _count(ids: list[int], *statuses: str) -> int:
    return Execution.objects.filter(pk__in=ids, status__in=statuses).count()


def _failures(proc: ManagedProcess) -> int:
    return len(HOME_DOWN.findall(proc.log()))


def _alive_through_failures(proc: ManagedProcess, count: int, timeout: float) -> None:
    """Wait until ``proc`` has met the missing queue ``count`` times, alive all along."""

    def seen() -> bool:
        assert proc.alive, f"{proc.name} exited ({proc.popen.returncode}):\n{proc.log()[-3000:]}"
        return _failures(proc) >= count

    wait_for(seen, timeout=timeout, interval=0.2, what=f"{proc.name} to meet the missing queue {count} times")


def test_a_monitor_gives_its_batch_back_and_keeps_running_while_the_queues_home_node_is_down(cluster):
    env = _env(cluster)
    first = cluster.nodes[0]
    monitor = start_monitor(**env)
    with running(monitor):
        # The monitor declares the queue on the first node of the list (no worker yet).
        (early,) = _due(1)
        wait_for(lambda: _count([early], S.PENDING), timeout=30, what="the first run to be published")
        assert cluster.queue_home(env["TMS_QUEUE"]) == first.name

        cluster.stop_node(first)
        ids = _due(40)
        # The monitor fails over to another node, whose declare of the queue is refused, again
        # and again: it stays up and gives back every run it took.
        _alive_through_failures(monitor, 3, timeout=30)
        assert _count(ids, S.PENDING) == 0
        assert _count(ids, S.SCHEDULED) == 40

        # A worker (it boots while the node does, and waits for the queue), then the node.
        worker = start_worker(concurrency=2, queue=env["TMS_QUEUE"], **env)
        with running(worker):
            cluster.start_node(first)
            wait_for(lambda: _count([early, *ids], S.SUCCEEDED) == 41, timeout=60, what="every run to succeed")
        assert monitor.alive


def test_workers_ride_out_the_loss_of_their_queues_home_node_without_exiting(cluster):
    env = _env(cluster)
    first = cluster.nodes[0]
    # One worker on the queue's node, one on another (its list starts there): the first loses
    # its connection, the second its consumer (RabbitMQ cancels it when the queue goes down).
    elsewhere = {**env, "CELERY_BROKER_URL": ";".join(node.url for node in cluster.nodes[1:] + cluster.nodes[:1])}
    home = start_worker("worker-home", concurrency=1, queue=env["TMS_QUEUE"], **env)
    with running(home):
        wait_worker_ready(home)  # it declared the queue, on the first node
        workers = [home, start_worker("worker-elsewhere", concurrency=1, queue=env["TMS_QUEUE"], **elsewhere)]
        monitor = start_monitor(**env)
        with running(*workers, monitor):
            wait_worker_ready(workers[1])
            before = _due(4)
            wait_for(lambda: _count(before, S.SUCCEEDED) == 4, timeout=30, what="the first runs to succeed")
            assert cluster.queue_home(env["TMS_QUEUE"]) == first.name

            cluster.stop_node(first)
            # Each worker reconnects or consumes again, and the declare of the queue is refused: it
            # keeps trying, in the same process (Celery's "Unrecoverable error: NotFound" ended it),
            # a few times a second at most.
            for worker in workers:
                _alive_through_failures(worker, 3, timeout=30)
            during = _due(5)

            cluster.start_node(first)
            after = _due(5)
            wait_for(lambda: _count([*during, *after], S.SUCCEEDED) == 10, timeout=60, what="the runs to succeed")
            assert monitor.alive
            for worker in workers:
                assert worker.alive
                log = worker.log()
                assert "Unrecoverable error" not in log
                assert "Frequent restarts detected" not in log
