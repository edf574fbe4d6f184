"""A private three-node RabbitMQ cluster (tooling.harness.rabbit_cluster) and a private Patroni
PostgreSQL pair (tooling.harness.pg_cluster) for the tests of this folder: on free ports and
under /tmp/tms-ha-* folders of their own, never the shared broker on 5672 or the shared
PostgreSQL on 5432, killed at the end of the module whatever happened."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.processes import run_command
from tooling.harness.pg_cluster import PgCluster
from tooling.harness.rabbit_cluster import RabbitCluster
from tooling.harness.servers import free_ports


@pytest.fixture(scope="module")
def rabbit_cluster() -> Iterator[RabbitCluster]:
    ports = free_ports(6)
    cluster = RabbitCluster(
        prefix=f"tmsha{os.getpid()}n", ports=(ports[0], ports[1], ports[2]), dist_ports=(ports[3], ports[4], ports[5])
    )
    with cluster:
        yield cluster


@pytest.fixture
def cluster(rabbit_cluster: RabbitCluster) -> Iterator[RabbitCluster]:
    """The module's cluster with every node running before and after the test."""
    for node in rabbit_cluster.nodes:
        rabbit_cluster.start_node(node)
    yield rabbit_cluster
    for node in rabbit_cluster.nodes:
        rabbit_cluster.start_node(node)


@pytest.fixture(scope="package")
def pg_cluster() -> Iterator[PgCluster]:
    """A private Patroni pair (tooling.harness.pg_cluster) with TMS's schema migrated into its
    ``tms`` database, shared by the failover tests of this folder (multi-host URL and HAProxy:
    each scenario leaves the pair with a primary and its synchronous standby, and judges its own
    tasks); killed, with its folder, once this pytest process leaves tests/ha, whatever happened."""
    with PgCluster() as cluster:
        result = run_command("migrate", "--noinput", DATABASE_URL=cluster.url)
        assert result.returncode == 0, result.stdout + result.stderr
        yield cluster
