"""``make bench``'s guard: each headline figure of a ``tms_bench`` run beside the last recorded one.

A recorded run is a JSON file (``docs/bench-baseline.json``) written on purpose, with
``tms_bench --compare FILE --record``, when a change and its figures are accepted. Each figure
carries the run-to-run noise its run measured (how far it moved between stretches of the same
run: :func:`tooling.harness.bench.noise`); a figure is marked worse only when it moved the wrong
way by more than the larger of that noise, now or then, and :data:`NOISE_FLOOR`.

Absolute figures (runs a second, milliseconds) measure the machine as much as the code: a record
from another machine judges only the ratios to bare Celery measured in the same run
(:data:`RATIO_LABELS`), and prints the absolute figures beside it, unmarked (issue 44: a slower
machine had 11 figures marked worse while every ratio was better). The machine is its CPU model,
core count and a calibrated single-core speed (:func:`cpu_speed`), never its host name: a
renamed or rebuilt host of the same kind still compares, a different one of the same name does not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tooling.harness.processes import ROOT

#: The least relative change counted as a change at all: on a shared 2-core machine any figure
#: moves by this much from one run to the next whatever its own stretches say.
NOISE_FLOOR = 0.10

#: How far the single-core speed (:func:`cpu_speed`) of the recording machine and this one may
#: differ for them to count as the same machine: two readings on one shared 2-core machine differ
#: by a few per cent; another CPU generation, or a throttled one, by far more.
SPEED_TOLERANCE = 0.15


@dataclass(frozen=True)
class Figure:
    """One headline figure: its value, the relative noise measured with it, and which way is better."""

    value: float
    noise: float
    #: "lower" or "higher"; "reference" for another system's figure printed beside TMS's
    #: (Celery's ETA tasks at the same rate), never marked worse or better.
    better: str


def _get(row: dict[str, Any], *path: str) -> Any:
    found: Any = row
    for key in path:
        if not isinstance(found, dict) or key not in found:
            return None
        found = found[key]
    return found


#: (label, scenario prefix, value path, noise key in extra.noise or None, better). A scenario
#: prefix matches ``sustained`` and ``sustained_75`` alike.
_FIGURES: tuple[tuple[str, str, tuple[str, ...], str | None, str], ...] = (
    ("exec/s", "burst", ("per_second",), "per_second", "higher"),
    ("exec/s / bare Celery", "burst", ("ratio",), "per_second", "higher"),
    ("CPU ms/exec", "burst", ("extra", "cpu_ms_per_exec"), "cpu_ms_per_exec", "lower"),
    ("herd time / bare Celery", "herd", ("extra", "time_ratio"), None, "lower"),
    ("herd due to last start (s)", "herd", ("extra", "due_to_last_start_s"), None, "lower"),
    ("herd CPU / bare Celery", "herd", ("extra", "herd_cpu_ratio"), None, "lower"),
    ("restore time / bare Celery", "restore", ("extra", "time_ratio"), None, "lower"),
    ("restore due to last start (s)", "restore", ("extra", "due_to_last_start_s"), None, "lower"),
    ("lateness p50 (ms)", "sustained", ("lateness_ms", "p50"), "lateness_p50", "lower"),
    ("lateness p95 (ms)", "sustained", ("lateness_ms", "p95"), "lateness_p95", "lower"),
    ("lateness p99 (ms)", "sustained", ("lateness_ms", "p99"), "lateness_p99", "lower"),
    ("CPU ms/exec", "sustained", ("extra", "cpu_ms_per_exec"), "cpu_ms_per_exec", "lower"),
    (
        "Celery ETA lateness p50 (ms)",
        "sustained",
        ("extra", "celery_eta_lateness_ms", "p50"),
        "celery_eta_p50",
        "reference",
    ),
    (
        "Celery ETA lateness p99 (ms)",
        "sustained",
        ("extra", "celery_eta_lateness_ms", "p99"),
        "celery_eta_p50",
        "reference",
    ),
    ("single API create p50 (ms)", "create", ("extra", "api_single_ms", "p50"), "api_p50", "lower"),
    ("single API create p99 (ms)", "create", ("extra", "api_single_ms", "p99"), "api_p99", "lower"),
    ("bulk create tasks/s", "create", ("extra", "bulk_tasks_per_second"), "bulk", "higher"),
)


#: The labels of the figures that are ratios to bare Celery's in the same run: the only ones a
#: record from another machine can judge.
RATIO_LABELS = frozenset(label for label, *_ in _FIGURES if label.endswith("/ bare Celery"))


def is_ratio(name: str) -> bool:
    """Whether the figure ``scenario: label`` is a ratio to the same run's bare Celery."""
    return name.split(": ", 1)[-1] in RATIO_LABELS


def cpu_speed(*, rounds: int = 5, steps: int = 200_000) -> float:
    """This machine's single-core speed: millions of steps a second of a fixed pure-Python loop
    (the interpreter's kind of work), the best of ``rounds`` by the thread's own CPU time, so
    that other processes sharing the core lengthen it little. About 0.1 s."""
    best = math.inf
    for _ in range(rounds):
        started = time.thread_time()
        x = 0
        for i in range(steps):
            x = (x * 31 + i) & 0xFFFFFFFF
        best = min(best, time.thread_time() - started)
    return float(f"{steps / max(best, 1e-9) / 1e6:.3g}")


def same_machine(now: Mapping[str, Any], then: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether the machine of a recorded run (``then``, :func:`tooling.harness.bench.machine`) is
    this one (``now``): the same CPU model and core count, and a single-core speed within
    :data:`SPEED_TOLERANCE`; and why not, in words."""
    if not then:
        return False, "the record names no machine"
    if then.get("cpu") != now.get("cpu") or then.get("cores") != now.get("cores"):
        return False, (
            f"recorded on {then.get('cpu')} x {then.get('cores')} cores, this is {now.get('cpu')} x {now.get('cores')}"
        )
    recorded, here = then.get("speed"), now.get("speed")
    if not recorded or not here:
        return False, "the record has no single-core speed to tell its machine by (re-record on the reference one)"
    if abs(float(here) / float(recorded) - 1) > SPEED_TOLERANCE:
        return False, f"single-core speed {here} here against {recorded} recorded"
    return True, f"same CPU, cores and single-core speed ({here} against {recorded} recorded)"


def headline(results: Iterable[dict[str, Any]]) -> dict[str, Figure]:
    """The headline figures of a run's results (``asdict`` of each ``Figures``, with its ratio),
    keyed ``scenario: label``."""
    found: dict[str, Figure] = {}
    for row in results:
        scenario = row["scenario"]
        for label, prefix, path, noise_key, better in _FIGURES:
            if scenario != prefix and not scenario.startswith(f"{prefix}_"):
                continue
            value = _get(row, *path)
            if value is None:
                continue
            noise = _get(row, "extra", "noise", noise_key) if noise_key else None
            found[f"{scenario}: {label}"] = Figure(float(value), float(noise or 0.0), better)
    return found


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def record(path: Path, results: list[dict[str, Any]], *, when: str, machine: dict[str, Any], load: Any) -> None:
    """Write this run's headline figures as the recorded ones."""
    payload = {
        "when": when,
        "commit": _commit(),
        "machine": machine,
        "load_average": load,
        "figures": {name: vars(figure) for name, figure in headline(results).items()},
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def load_recorded(path: Path) -> tuple[dict[str, Figure], dict[str, Any]]:
    """The recorded figures and what was recorded about their run (when, commit, load)."""
    data = json.loads(path.read_text())
    figures = {name: Figure(**values) for name, values in data.get("figures", {}).items()}
    return figures, {k: v for k, v in data.items() if k != "figures"}


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def compare(now: dict[str, Figure], recorded: dict[str, Figure], *, same_machine: bool) -> tuple[list[str], list[str]]:
    """A Markdown table of each figure beside its recorded value, and the names of the figures
    worse by more than their noise. Recorded on another machine (``same_machine`` false), only
    the ratios to bare Celery are judged; the absolute figures are printed, unmarked."""
    lines = [
        "| figure | recorded | now | change | noise allowed | |",
        "|---|---|---|---|---|---|",
    ]
    worse: list[str] = []
    for name, figure in now.items():
        before = recorded.get(name)
        if before is None or not before.value:
            lines.append(f"| {name} | - | {_fmt(figure.value)} | - | - | new |")
            continue
        change = (figure.value - before.value) / abs(before.value)
        allowed = max(NOISE_FLOOR, figure.noise, before.noise)
        if figure.better == "reference":
            # Celery's own figure at the sustained rate, which follows this run's burst rate: a
            # faster burst asks more of Celery too. It is there to read TMS's beside, not a
            # regression of TMS's (it was flagged "worse" whenever the burst got faster).
            lines.append(f"| {name} | {_fmt(before.value)} | {_fmt(figure.value)} | {change:+.0%} | - | reference |")
            continue
        if not same_machine and not is_ratio(name):
            # Runs a second and milliseconds of another machine say how it compares with this
            # one, not whether the code got worse: the same run's ratios to bare Celery do.
            lines.append(
                f"| {name} | {_fmt(before.value)} | {_fmt(figure.value)} | {change:+.0%} | - | other machine |"
            )
            continue
        bad = change > allowed if figure.better == "lower" else change < -allowed
        good = change < -allowed if figure.better == "lower" else change > allowed
        mark = "**WORSE**" if bad else ("better" if good else "")
        if bad:
            worse.append(name)
        lines.append(
            f"| {name} | {_fmt(before.value)} | {_fmt(figure.value)} | {change:+.0%} | +-{allowed:.0%} | {mark} |"
        )
    for name in sorted(set(recorded) - set(now)):
        lines.append(f"| {name} | {_fmt(recorded[name].value)} | - | - | - | not measured |")
    return lines, worse


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (a shared machine's figures depend on them)."""
    return [round(value, 2) for value in os.getloadavg()]
