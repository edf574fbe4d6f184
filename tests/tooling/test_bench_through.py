"""``tms_bench --through pgbouncer``: the steady load run again with the platform's processes
behind a private PgBouncer in transaction pooling mode, its ratios to the direct run printed. A
tiny run, so that the option keeps working; no timing is asserted."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from executions.models import Execution


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_tms_bench_through_pgbouncer_runs_the_steady_load_again_behind_it(tmp_path, capsys):
    out = tmp_path / "bench.json"
    call_command(
        "tms_bench", "--scenario", "sustained", "--rate", "2", "--duration", "1", "--no-celery-eta",
        "--concurrency", "1", "--through", "pgbouncer", "--pgbouncer-pool", "2", "--json", str(out),
    )  # fmt: skip
    printed = capsys.readouterr().out
    runs = {row["scenario"]: row for row in json.loads(out.read_text())["results"]}
    assert set(runs) == {"sustained", "sustained@pgbouncer"}
    direct, pooled = runs["sustained"], runs["sustained@pgbouncer"]
    assert direct["executions"] == pooled["executions"] == 2  # 1 recurring x 1 s + 1 one-shot, each run
    assert pooled["extra"]["through"] == "pgbouncer (transaction pooling, pool 2)"
    assert pooled["extra"]["target_rate"] == direct["extra"]["target_rate"] == 2
    assert pooled["extra"]["pgbouncer_cpu_ms_per_exec"] is not None
    ratios = pooled["extra"]["vs_direct"]
    assert set(ratios) == {"throughput", "lateness_p50", "lateness_p99", "cpu_per_run", "servers_cpu_per_run"}
    assert ratios["throughput"] > 0 and ratios["cpu_per_run"] > 0
    assert "Through a pooler or on the HA topology, beside the direct run" in printed
    assert "| sustained | pgbouncer (" in printed
    assert not Execution.objects.exists()  # both runs cleaned up after themselves


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "burst", "--through", "pgbouncer"], "--through needs a scenario it runs again"),
        (["--scenario", "sustained", "--pgbouncer-pool", "4"], "--pgbouncer-pool needs --through pgbouncer"),
    ],
)
def test_tms_bench_through_usage_errors(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("tms_bench", *args)
