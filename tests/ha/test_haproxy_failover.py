"""A PostgreSQL failover under load with TMS given HAProxy's write port
(docker/haproxy/haproxy.cfg: Patroni's ``GET /primary`` check, ``on-marked-down
shutdown-sessions``) instead of the multi-host URL: the primary's postmaster SIGKILLed on the
package's Patroni pair (shared with test_pg_failover.py), judged as there (tests/ha/failover.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ha.failover import kill_primary, scenario
from tooling.harness.haproxy import HAProxy
from tooling.harness.pg_cluster import PgCluster

pytestmark = [pytest.mark.slow]


@pytest.fixture
def haproxy(pg_cluster: PgCluster) -> Iterator[HAProxy]:
    """HAProxy in front of the pair, routing to its primary alone before the test starts (HAProxy
    counts every server up until its first check)."""
    with HAProxy(pg_cluster) as proxy:
        primary = pg_cluster.primary()
        assert primary is not None
        proxy.wait_routed_to(primary, timeout=30)
        yield proxy


def test_the_primarys_postmaster_killed_mid_load_through_haproxy_loses_and_repeats_nothing(pg_cluster, haproxy):
    scenario(pg_cluster, kill_primary, route=haproxy.url)
    # HAProxy sends connections to the new primary alone, and to the old one no more once it is
    # back as the standby.
    new_primary = pg_cluster.primary()
    assert new_primary is not None and haproxy.routed_to() is new_primary, haproxy.server_states()
