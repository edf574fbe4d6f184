"""Parts of the ``tms_bench`` harness checked without running a benchmark (cheap: no processes)."""

from __future__ import annotations

import json

from tooling.harness.bench import Bench

STATS = {"passes": 3, "published": 2, "held_back": 0, "due_query_p99_ms": 1.5}


class _Log:
    """Stands in for a stopped monitor process: only its log is read."""

    def __init__(self, text: str) -> None:
        self.text = text

    def log(self) -> str:
        return self.text


def test_the_monitor_stats_are_read_from_a_json_log_as_from_a_plain_one():
    # Issue 33: with the production default (TMS_LOG_FORMAT=json) the stats are escaped inside
    # the line's message, and the sustained and burst scenarios failed reading them.
    message = f"monitor:host:1 stopped; monitor stats {json.dumps(STATS)}"
    json_log = "\n".join(
        [
            json.dumps({"level": "INFO", "message": "monitor:host:1 started (batch 500)"}),
            json.dumps({"level": "INFO", "message": message, "process": 1}),
        ]
    )
    plain_log = f"INFO executions.monitor {message}\n"
    assert Bench._monitor_stats(_Log(json_log)) == STATS  # type: ignore[arg-type]
    assert Bench._monitor_stats(_Log(plain_log)) == STATS  # type: ignore[arg-type]
    assert Bench._monitor_stats(_Log("no stats: the monitor was killed\n")) == {}  # type: ignore[arg-type]
    assert Bench._monitor_stats(None) == {}


def test_a_figure_is_marked_worse_only_beyond_the_noise_measured_now_or_then():
    from tooling.harness.compare import NOISE_FLOOR, Figure, compare, headline

    recorded = {
        "sustained: lateness p50 (ms)": Figure(14.0, 0.2, "lower"),
        "burst: exec/s": Figure(250.0, 0.05, "higher"),
        "create: bulk create tasks/s": Figure(5000.0, 0.05, "higher"),
        "herd: herd time / bare Celery": Figure(1.0, 0.0, "lower"),
    }
    now = {
        "sustained: lateness p50 (ms)": Figure(16.0, 0.1, "lower"),  # +14 %: within the recorded +-20 %
        "burst: exec/s": Figure(200.0, 0.05, "higher"),  # -20 %: beyond +-10 %
        "create: bulk create tasks/s": Figure(20000.0, 0.05, "higher"),  # better
        "herd: herd time / bare Celery": Figure(1.0 + NOISE_FLOOR / 2, 0.0, "lower"),  # within the floor
        "sustained_75: lateness p50 (ms)": Figure(12.0, 0.1, "lower"),  # nothing recorded
    }
    lines, worse = compare(now, recorded, same_machine=True)
    assert worse == ["burst: exec/s"]
    table = "\n".join(lines)
    assert "| burst: exec/s | 250 | 200 | -20% | +-10% | **WORSE** |" in table
    assert "| create: bulk create tasks/s | 5,000 | 20,000 | +300% | +-10% | better |" in table
    assert "| sustained: lateness p50 (ms) | 14 | 16 | +14% | +-20% |  |" in table
    assert "| sustained_75: lateness p50 (ms) | - | 12 | - | - | new |" in table

    # The headline figures of a run's rows, each with the noise its run measured.
    rows = [
        {
            "scenario": "sustained_75",
            "lateness_ms": {"p50": 9.0, "p99": 30.0},
            "extra": {"cpu_ms_per_exec": 2.5, "noise": {"lateness_p50": 0.3}},
        }
    ]
    found = headline(rows)
    assert found["sustained_75: lateness p50 (ms)"] == Figure(9.0, 0.3, "lower")
    assert found["sustained_75: CPU ms/exec"] == Figure(2.5, 0.0, "lower")
    assert "sustained_75: lateness p95 (ms)" not in found


def test_celery_s_own_figures_are_printed_for_reference_and_never_marked():
    """Celery's ETA tasks run at the sustained rate, half the burst rate of the same run: when
    TMS's burst got faster, Celery's lateness at the higher rate was flagged as TMS's regression
    (four "worse" figures in every run since)."""
    from tooling.harness.compare import Figure, compare, headline

    rows = [
        {"scenario": "sustained", "lateness_ms": {"p50": 3.0}, "extra": {"celery_eta_lateness_ms": {"p50": 4453.0}}}
    ]
    now = headline(rows)
    assert now["sustained: Celery ETA lateness p50 (ms)"].better == "reference"
    recorded = {
        "sustained: Celery ETA lateness p50 (ms)": Figure(1.8, 0.1, "lower"),
        "sustained: lateness p50 (ms)": Figure(3.0, 0.1, "lower"),
    }
    lines, worse = compare(now, recorded, same_machine=True)
    assert worse == []
    assert "| sustained: Celery ETA lateness p50 (ms) | 1.8 | 4,453 | +247289% | - | reference |" in "\n".join(lines)


def test_the_noise_is_half_the_range_of_a_figure_over_the_slices_of_its_run():
    from tooling.harness.bench import noise, slices

    assert [len(part) for part in slices(list(range(100)))] == [25, 25, 25, 25]
    assert [len(part) for part in slices(list(range(15)))] == [15]  # too few for two slices of 10
    assert noise([10.0, 12.0, 8.0, 10.0]) == 0.2
    assert noise([10.0]) == 0.0


# --- which figures a recorded run from another machine can judge (issue 44) ---------------------

#: The recorded machine of docs/bench-baseline.json's kind, and this one as machine() reads it.
HERE = {"cpu": "AMD EPYC 7B13", "cores": 2, "speed": 40.0, "memory_gib": 23, "python": "3.11.7"}


def test_on_another_machine_only_the_ratios_to_bare_celery_are_judged():
    """Issue 44: on a slower 2-core machine make bench marked 11 figures WORSE while every ratio
    to bare Celery in the same run was better (burst 4.18x against 2.96x, herd 0.58 against 0.80)."""
    from tooling.harness.compare import Figure, compare

    recorded = {
        "burst: exec/s": Figure(2697.8, 0.056, "higher"),
        "burst: exec/s / bare Celery": Figure(2.96, 0.056, "higher"),
        "herd: herd time / bare Celery": Figure(0.80, 0.0, "lower"),
        "herd: herd CPU / bare Celery": Figure(0.9, 0.0, "lower"),
        "sustained: lateness p50 (ms)": Figure(165.2, 0.6, "lower"),
        "create: single API create p50 (ms)": Figure(7.7, 0.026, "lower"),
    }
    now = {
        "burst: exec/s": Figure(1100.0, 0.05, "higher"),  # -59 %: a slower machine
        "burst: exec/s / bare Celery": Figure(4.18, 0.05, "higher"),
        "herd: herd time / bare Celery": Figure(0.58, 0.0, "lower"),
        "herd: herd CPU / bare Celery": Figure(1.3, 0.0, "lower"),  # a ratio worse: still marked
        "sustained: lateness p50 (ms)": Figure(900.0, 0.1, "lower"),
        "create: single API create p50 (ms)": Figure(21.0, 0.02, "lower"),
    }
    lines, worse = compare(now, recorded, same_machine=False)
    table = "\n".join(lines)
    assert worse == ["herd: herd CPU / bare Celery"]
    assert "| burst: exec/s / bare Celery | 2.96 | 4.18 | +41% | +-10% | better |" in table
    assert "| herd: herd time / bare Celery | 0.8 | 0.58 | -28% | +-10% | better |" in table
    assert "| herd: herd CPU / bare Celery | 0.9 | 1.3 | +44% | +-10% | **WORSE** |" in table
    # Absolute figures: printed for reference, unmarked.
    assert "| burst: exec/s | 2,698 | 1,100 | -59% | - | other machine |" in table
    assert "| sustained: lateness p50 (ms) | 165 | 900 | +445% | - | other machine |" in table
    assert "| create: single API create p50 (ms) | 7.7 | 21 | +173% | - | other machine |" in table
    # On the machine that recorded them the same absolute figures are judged.
    _, worse_here = compare(now, recorded, same_machine=True)
    assert set(worse_here) == {
        "burst: exec/s",
        "herd: herd CPU / bare Celery",
        "sustained: lateness p50 (ms)",
        "create: single API create p50 (ms)",
    }


def test_the_same_machine_is_the_same_cpu_cores_and_calibrated_speed_whatever_its_name():
    from tooling.harness.compare import SPEED_TOLERANCE, same_machine

    assert same_machine(HERE, {**HERE, "hostname": "elsewhere", "memory_gib": 8, "python": "3.11.9"})[0]
    assert same_machine(HERE, {**HERE, "speed": HERE["speed"] * (1 - SPEED_TOLERANCE / 2)})[0]
    slower, why = same_machine(HERE, {**HERE, "speed": HERE["speed"] * (1 + 2 * SPEED_TOLERANCE)})
    assert not slower and "single-core speed" in why
    assert not same_machine(HERE, {**HERE, "cores": 4})[0]
    assert not same_machine(HERE, {**HERE, "cpu": "Intel(R) Xeon(R) CPU @ 2.20GHz"})[0]
    # docs/bench-baseline.json as it was recorded before: a generic model name and no speed.
    unknown, why = same_machine(HERE, {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 23})
    assert not unknown and "no single-core speed" in why
    assert not same_machine(HERE, None)[0]


def test_the_speed_figure_is_a_positive_calibrated_single_core_rate():
    from tooling.harness.compare import cpu_speed

    first, second = cpu_speed(), cpu_speed()
    assert first > 0 and second > 0
    # Best of several rounds: two readings a moment apart agree within a factor of two even on
    # a shared machine (the comparison allows SPEED_TOLERANCE; this only checks it is a rate).
    assert 0.5 < first / second < 2.0


def test_the_recorded_run_keeps_the_machine_it_ran_on(tmp_path):
    from tooling.harness.compare import load_recorded, record

    path = tmp_path / "recorded.json"
    rows = [{"scenario": "burst", "per_second": 100.0, "ratio": 1.5, "extra": {}}]
    record(path, rows, when="2026-12-06T00:00:00+00:00", machine=HERE, load=[])
    figures, about = load_recorded(path)
    assert about["machine"] == HERE and figures["burst: exec/s / bare Celery"].value == 1.5


def test_a_platform_process_is_given_the_database_as_configured_multi_host_and_options_included():
    """tooling.harness.processes.database_url: a Patroni pair's libpq multi-host URL went to the
    platform's processes as ``postgres://u@h1,h2:p1,p2/db``, without ``target_session_attrs``."""
    import environ

    from tooling.harness.processes import database_url

    env = environ.Env()
    for url in (
        "postgres://postgres@127.0.0.1:5433,127.0.0.1:5434/tms?target_session_attrs=read-write",
        "postgres://u%40x:p%3Aw%2Fd@db.example:6432/tms?connect_timeout=5&sslmode=require",
        "postgres://postgres@/tms?host=%2Fvar%2Frun%2Fpg+x&port=5433",
    ):
        assert env.db_url_config(database_url(env.db_url_config(url))) == env.db_url_config(url)
    assert database_url({"NAME": "tms", "USER": "postgres", "HOST": "", "PORT": ""}) == (
        "postgres://postgres@127.0.0.1:5432/tms"
    )


# --- the cost curve (issue 50), its pure parts ------------------------------------------------


def _point(size: int, p99: float, pg_cpu: float) -> dict:
    return {
        "size": size,
        "every_minute": 10_000,
        "every_minute_runs": {"started": 30_000, "lost": 0, "duplicated": 0, "lateness_ms": {"p50": 5.0, "p99": p99}},
        "cpu_ms_per_run": {"postgresql": pg_cpu, "platform": 1.0, "worker": 0.7},
        "materialiser": {"passes": 36, "pass_ms": {"p50": 40.0, "p95": 80.0}, "ms_per_row": 0.05},
        "bytes": {"tasks_per_task": 1500, "executions_per_execution": 900, "tasks_heap_per_task": 700},
        "requests": {"api_tasks": {"p50": 9.0, "p95": 12.0}, "ui_tasks": {"p50": 20.0, "p95": 30.0}},
        "rss_mib": {"worker": {"max_mib": 80.0}},
    }


def test_the_curve_s_goal_compares_100_000_with_1_000_000_tasks_and_names_what_grew():
    from tooling.harness.scale_curve import goal

    points = [_point(10_000, 20.0, 0.3), _point(100_000, 20.0, 0.3), _point(1_000_000, 23.0, 0.36)]
    found = goal(points)
    assert found["ratios"]["every-minute p99"] == 1.15 and found["p99_within_20_percent"]
    assert found["ratios"]["postgresql CPU ms/run"] == 1.2
    assert found["grown"] == ["postgresql CPU ms/run"]
    assert goal(points[:2]) == {}  # no 1,000,000: nothing to judge


def test_the_curve_s_table_has_a_column_per_size_and_the_materialiser_s_passes_are_read_from_its_log():
    from tooling.harness.scale_curve import _passes, curve_table

    lines = curve_table([_point(10_000, 20.0, 0.3), _point(100_000, 21.0, 0.3)])
    assert lines[0] == "| figure | 10,000 tasks | 100,000 tasks |"
    assert "| every-minute lateness p50 / p95 / p99 / max (ms) | 5.0 / - / 20.0 / - | 5.0 / - / 21.0 / - |" in lines
    log = (
        "[2026-12-07 12:00:00,001: INFO/ForkPoolWorker-1] Task tms.materialise[ab-1] succeeded in 0.25s: 1200\n"
        "[2026-12-07 12:00:05,001: INFO/ForkPoolWorker-1] Task tms.liveness[ab-2] succeeded in 0.01s: []\n"
        "[2026-12-07 12:00:05,002: INFO/ForkPoolWorker-1] Task tms.materialise[ab-3] succeeded in 0.05s: 0\n"
    )
    passes = _passes(log)
    assert passes["passes"] == 2 and passes["rows"] == 1200 and passes["ms_per_row"] == 0.25
    assert passes["pass_ms"]["max"] == 250.0


def test_the_curve_is_drawn_as_a_png(tmp_path):
    from tooling.harness.scale_curve import write_plot

    path = tmp_path / "curve.png"
    write_plot([_point(10_000, 20.0, 0.3), _point(100_000, 21.0, 0.3)], path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_the_scale_curve_runs_only_when_named():
    from tooling.harness.bench import DEFAULT_SCENARIOS, SCENARIOS, BenchConfig

    assert "scale" in SCENARIOS and "scale" not in DEFAULT_SCENARIOS
    assert "sustained_filled" in DEFAULT_SCENARIOS
    assert BenchConfig().scenarios == DEFAULT_SCENARIOS


def test_a_curve_run_a_size_at_a_time_takes_the_earlier_sizes_from_their_json(tmp_path):
    from tooling.harness.scale_curve import earlier_points

    earlier = tmp_path / "small.json"
    row = {"scenario": "scale", "extra": {"points": [_point(10_000, 20.0, 0.3), _point(100_000, 21.0, 0.3)]}}
    earlier.write_text(json.dumps({"when": "2026-12-07T12:00:00+00:00", "results": [row]}))
    found = earlier_points((earlier,), besides=[100_000])  # 100,000 measured again now: this run's
    assert [point["size"] for point in found] == [10_000]
    assert found[0]["from"].startswith(str(earlier))
