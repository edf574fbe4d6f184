"""A CI-sized chaos run: a few hundred executions and ten diamond workflows on real monitors,
workers and beat while workers are SIGKILLed, one is paused past its timeout, RabbitMQ and
PostgreSQL restart."""

from __future__ import annotations

import shutil

import pytest

from tests.processes import LOG_DIR
from tms_core.conf import tms_settings
from tooling.harness.chaos import ChaosConfig, run_chaos

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.timeout(240)
def test_chaos_loses_nothing_and_launches_nothing_twice():
    assert shutil.which("rabbitmqctl"), "the chaos test restarts the local RabbitMQ"
    assert shutil.which("pg_ctlcluster"), "the chaos test restarts the local PostgreSQL"
    lines: list[str] = []
    # Spare worker slots (sleep runs hold one while they work), so that a resumed execution does
    # not also wait for a free slot: the bound below is about detecting and handing work back.
    config = ChaosConfig(
        executions=240,
        workflows=10,
        spread=20,
        kill_every=2.5,
        concurrency=6,
        log_dir=LOG_DIR / "chaos",
        progress=lines.append,
    )
    report = run_chaos(config)
    print("\n".join(lines + report.lines()))

    assert report.submitted == 240
    assert report.lost == 0
    assert report.succeeded + report.failed == 240
    assert report.duplicate_launches == 0
    assert report.duplicate_terminal_events == 0
    # Workflows (issue 31): every step whose upstreams succeeded ran once, none twice, through
    # the same kills and restarts.
    assert report.workflows == 10
    assert report.workflow_steps_missing == 0
    assert report.workflow_steps_duplicate == 0
    assert report.workflow_steps >= 3 * report.workflows_completed > 0
    # Every disruption really happened.
    assert report.kills >= 6
    assert report.pauses == 1
    assert report.broker_restarts == 1
    assert report.database_restarts == 1
    # Work held by killed workers was resumed, within the heartbeat timeout (the lease) plus one
    # liveness sweep interval (the beat job that marks silent workers dead runs every heartbeat
    # interval); the typical case well before that.
    assert report.unrecovered_victims == 0
    assert report.recoveries, "no kill hit a worker while it held an execution"
    sweep = tms_settings().HEARTBEAT_INTERVAL
    assert report.recovery_max <= config.worker_timeout + sweep, report.recoveries
    assert report.recovery_p50 <= config.worker_timeout + 2.5, report.recoveries
