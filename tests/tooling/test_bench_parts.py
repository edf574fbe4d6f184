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
    lines, worse = compare(now, recorded)
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
    lines, worse = compare(now, recorded)
    assert worse == []
    assert "| sustained: Celery ETA lateness p50 (ms) | 1.8 | 4,453 | +247289% | - | reference |" in "\n".join(lines)


def test_the_noise_is_half_the_range_of_a_figure_over_the_slices_of_its_run():
    from tooling.harness.bench import noise, slices

    assert [len(part) for part in slices(list(range(100)))] == [25, 25, 25, 25]
    assert [len(part) for part in slices(list(range(15)))] == [15]  # too few for two slices of 10
    assert noise([10.0, 12.0, 8.0, 10.0]) == 0.2
    assert noise([10.0]) == 0.0
