"""A CI-sized chaos run: a few hundred executions on real monitors, workers and beat while
workers are SIGKILLed, one is paused past its timeout, RabbitMQ and PostgreSQL restart."""

from __future__ import annotations

import shutil

import pytest

from executions.harness.chaos import ChaosConfig, run_chaos
from tests.processes import LOG_DIR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.timeout(240)
def test_chaos_loses_nothing_and_launches_nothing_twice():
    assert shutil.which("rabbitmqctl"), "the chaos test restarts the local RabbitMQ"
    assert shutil.which("pg_ctlcluster"), "the chaos test restarts the local PostgreSQL"
    lines: list[str] = []
    config = ChaosConfig(executions=240, spread=20, kill_every=2.5, log_dir=LOG_DIR / "chaos", progress=lines.append)
    report = run_chaos(config)
    print("\n".join(lines + report.lines()))

    assert report.submitted == 240
    assert report.lost == 0
    assert report.succeeded + report.failed == 240
    assert report.duplicate_launches == 0
    assert report.duplicate_terminal_events == 0
    # Every disruption really happened.
    assert report.kills >= 6
    assert report.pauses == 1
    assert report.broker_restarts == 1
    assert report.database_restarts == 1
    # Work held by killed or paused workers was resumed, within one lease timeout plus the
    # monitor's sweep (its longest sleep) and a second of dispatch on a loaded 2-core machine.
    assert report.unrecovered_victims == 0
    assert report.recoveries, "no kill hit a worker while it held an execution"
    bound = config.worker_timeout + 0.5 + 1.5
    assert report.recovery_max <= bound, report.recoveries
