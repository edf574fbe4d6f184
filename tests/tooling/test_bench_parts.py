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
