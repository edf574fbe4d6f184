"""A PostgreSQL failover under load, on a private Patroni pair (synchronous replication, TMS given
the libpq multi-host URL with ``target_session_attrs=read-write``): the primary's postmaster
SIGKILLed, and a planned ``patronictl switchover`` (issue 45). The scenario and how it is judged:
tests/ha/failover.py.
"""

from __future__ import annotations

import pytest

from tests.ha.failover import kill_primary, scenario, switchover

pytestmark = [pytest.mark.slow]


def test_the_primarys_postmaster_killed_mid_load_loses_and_repeats_nothing(pg_cluster):
    scenario(pg_cluster, kill_primary)


def test_a_planned_switchover_mid_load_loses_and_repeats_nothing(pg_cluster):
    scenario(pg_cluster, switchover)
