"""A tiny ``tms_bench`` run, so the harness keeps working. No timing is asserted."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


# Two runs, so that the suite's workers share them (one run of every scenario was its slowest
# test, 150-220 s); lists and prune have a run of their own below.
# The herd is due about 12 s ahead (--herd-soon), not on the next minute boundary (up to 75 s).
@pytest.mark.timeout(900)
def test_tms_bench_runs_the_engine_scenarios_and_compares_with_a_record(tmp_path, capsys):
    out, recorded = tmp_path / "bench.json", tmp_path / "recorded.json"
    call_command(
        "tms_bench",
        "--scenario", "burst", "--scenario", "herd", "--scenario", "restore", "--scenario", "sustained",
        "--scenario", "fairness",
        "--tasks", "40", "--herd-tasks", "20", "--herd-soon", "--restore-tasks", "20",
        "--rate", "10", "--sustained-rate", "6", "--duration", "2", "--fair-herd", "30", "--fair-few", "3",
        "--json", str(out),
        "--compare", str(recorded), "--record",
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "| burst |" in printed
    figures = json.loads(out.read_text())
    scenarios = {row["scenario"]: row for row in figures["results"]}
    assert set(scenarios) == {"burst", "herd", "restore", "sustained", "sustained_at_6", "fairness"}
    assert scenarios["burst"]["executions"] == 40
    fair = scenarios["fairness"]["extra"]
    assert fair["started_exactly_once"] == fair["runs"] == 33 and fair["never_started"] == 0
    assert scenarios["burst"]["baseline_per_second"] > 0
    herd = scenarios["herd"]
    assert herd["executions"] == 20
    assert herd["extra"]["lost"] == herd["extra"]["duplicated"] == herd["extra"]["bare_lost"] == 0
    assert herd["baseline_per_second"] > 0
    # The restore: tasks due the instant they appear, not materialised; each runs once.
    restore = scenarios["restore"]
    assert restore["executions"] == 20
    assert restore["extra"]["lost"] == restore["extra"]["duplicated"] == restore["extra"]["tasks_not_run_once"] == 0
    assert restore["extra"]["time_ratio"] > 0
    # The wait for the minute boundary is measured apart, and only it is left out of the herd's CPU.
    extra = herd["extra"]
    assert extra["idle_wait_s"] > 0 and extra["idle_cpu_ms_per_s"]
    assert 0 < extra["herd_cpu_ms_per_exec_total"] <= extra["cpu_ms_per_exec_total"]
    assert scenarios["sustained"]["executions"] == 20
    # A fixed rate beside it, with Celery's ETA tasks at that rate too.
    at_6 = scenarios["sustained_at_6"]
    assert at_6["executions"] == 12 and at_6["extra"]["target_rate"] == 6 and at_6["extra"]["celery_eta_runs"] == 12
    # Celery's own ETA tasks at the same rate beside it (issue 33), and the noise of its figures.
    sustained = scenarios["sustained"]["extra"]
    assert sustained["celery_eta_runs"] == 20 and set(sustained["celery_eta_lateness_ms"]) >= {"p50", "p99"}
    assert {"lateness_p50", "lateness_p99", "celery_eta_p50"} <= set(sustained["noise"])
    # make bench's record: nothing recorded before, so every figure is new; the file now holds them.
    assert "Nothing recorded in" in printed and "| sustained: lateness p50 (ms) |" in printed
    kept = json.loads(recorded.read_text())
    assert kept["figures"]["sustained: lateness p50 (ms)"]["better"] == "lower"
    assert kept["figures"]["burst: exec/s / bare Celery"]["value"] > 0
    assert figures["machine"]["cores"] >= 1


@pytest.mark.timeout(900)
def test_tms_bench_runs_the_data_scenarios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    call_command(
        "tms_bench",
        "--scenario", "sustained_filled", "--scenario", "create", "--scenario", "dashboard", "--scenario", "pages",
        "--rate", "10", "--duration", "2", "--scale-executions", "2000", "--scale-tasks", "200",
        "--create-requests", "5", "--bulk-tasks", "200", "--dashboard-renders", "3", "--list-requests", "3",
        "--json", str(out),
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "| sustained_filled |" in printed
    scenarios = {row["scenario"]: row for row in json.loads(out.read_text())["results"]}
    assert set(scenarios) == {"sustained_filled", "create", "dashboard", "pages"}
    assert "celery_eta_runs" not in scenarios["sustained_filled"]["extra"]
    assert scenarios["sustained_filled"]["extra"]["filler_executions"] == 2000
    assert scenarios["create"]["extra"]["bulk_tasks_per_second"] > 0
    dashboard = scenarios["dashboard"]
    assert dashboard["executions"] == 2000
    assert dashboard["extra"]["tasks"] == 200
    # The snapshot's queries: at most the 10 that tests/executions/test_dashboard.py fixes for its
    # scene (this one reads 8 for staff), and one more for an owner: their team ids.
    assert dashboard["extra"]["staff_queries"] + 1 == dashboard["extra"]["owner_queries"] <= 10
    assert dashboard["extra"]["staff_runs_24h"] > dashboard["extra"]["owner_runs_24h"] > 0
    assert "| dashboard |" in printed


def test_tms_bench_lists_and_prune_scenarios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    call_command(
        "tms_bench", "--scenario", "lists", "--scenario", "prune", "--tasks", "30", "--scale-executions", "3000",
        "--scale-tasks", "100", "--list-requests", "3", "--json", str(out),
    )  # fmt: skip
    scenarios = {row["scenario"]: row for row in json.loads(out.read_text())["results"]}
    assert scenarios["lists"]["executions"] == 3000
    assert {"p50", "p95"} <= set(scenarios["lists"]["extra"]["http"]["owner"]["deep_90pct"])
    prune = scenarios["prune"]
    # Every task keeps its latest run only: 100 tasks' latest finished runs and the unfinished ones stay.
    assert 2500 < prune["executions"] < 3000 and prune["extra"]["archive_files"] >= 3
    assert prune["lateness_ms"] and prune["extra"]["lateness_without_pruning_ms"]


def test_tms_bench_workflows_runs_every_chain_to_its_last_step(tmp_path, capsys):
    # The chains' roots are made due only once every step's task exists: with a fixed lead, a
    # loaded machine still created the later steps when the first ended, and those chains
    # stopped there (2,369 of 5,000 steps ran, and the bench waited out its timeout).
    out = tmp_path / "bench.json"
    call_command(
        "tms_bench", "--scenario", "workflows", "--workflow-runs", "12", "--workflow-steps", "3",
        "--workflow-map-runs", "3", "--workflow-map-items", "12", "--json", str(out),
    )  # fmt: skip
    (row,) = json.loads(out.read_text())["results"]
    assert row["scenario"] == "workflows"
    assert row["executions"] == 36  # every step of every chain, once
    assert row["extra"]["workflow_runs"] == 12 and row["extra"]["steps"] == 3
    assert row["extra"]["seconds"] > 0 and row["extra"]["independent_seconds"] > 0
    # The map-and-join phase (issue 48): 3 workflow runs each mapping 12 items and joining them,
    # against the chains' 36 independent runs (as many: not run again); each item ran once and
    # each join got its 12 documents.
    mapped = row["extra"]["map"]
    assert mapped["workflow_runs"] == 3 and mapped["items"] == 12
    assert mapped["executions"] == 3 * (12 + 2)  # each root, its 12 items and its join
    assert mapped["map_runs_seen"] == 3
    assert mapped["lost"] == mapped["duplicated"] == mapped["joins_short"] == 0
    assert mapped["seconds"] > 0 and mapped["independent_seconds"] > 0 and mapped["time_ratio"] > 0


@pytest.mark.timeout(900)
def test_tms_bench_scale_draws_the_cost_curve_with_every_every_minute_run_once(tmp_path, capsys):
    # Issue 50's curve at two tiny sizes: 20 every-minute tasks among 200 and 400, one minute each.
    out, plot = tmp_path / "bench.json", tmp_path / "curve.png"
    call_command(
        "tms_bench", "--scenario", "scale", "--scale-size", "200", "--scale-size", "400",
        "--scale-every-minute", "20", "--scale-minutes", "1", "--scale-requests", "3",
        "--scale-plot", str(plot), "--json", str(out),
    )  # fmt: skip
    printed = capsys.readouterr().out
    (row,) = json.loads(out.read_text())["results"]
    assert row["scenario"] == "scale"
    points = row["extra"]["points"]
    assert [point["size"] for point in points] == [200, 400]
    for point in points:
        runs = point["every_minute_runs"]
        assert runs["expected"] == runs["started"] == 20  # each task due once in the one-minute window
        assert runs["lost"] == runs["duplicated"] == runs["coalesced"] == runs["unfinished"] == 0
        assert {"p50", "p95", "p99", "max"} <= set(runs["lateness_ms"])
        assert point["runs_in_window"] >= 20
        assert point["materialiser"]["passes"] > 0 and "pass_ms" in point["materialiser"]
        assert point["cpu_ms_per_run"]["postgresql"] > 0 and point["cpu_ms_per_run"]["worker"] > 0
        assert point["bytes"]["tasks"] == point["size"]
        assert point["bytes"]["tasks_heap_per_task"] > 0 and point["bytes"]["executions_indexes_per_execution"] > 0
        assert point["rss_mib"]["worker"]["max_mib"] > 0 and point["rss_mib"]["monitor"]["max_mib"] > 0
        assert point["requests"]["api_tasks"]["p95"] > 0 and point["requests"]["ui_tasks"]["p95"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert row["extra"]["plot"] == str(plot)
    assert "| every-minute lateness p50 / p95 / p99 / max (ms) |" in printed
    # The filler is gone afterwards.
    from tasks_app.models import Task

    assert not Task.objects.exists()
