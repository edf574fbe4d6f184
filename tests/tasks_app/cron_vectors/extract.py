"""Turn the test suites of cronsim and croniter into the data files beside this script.

Not part of the test run (it needs the two projects' checkouts, which the suite does not have):
run it again to refresh the vectors from newer commits, then review the diff of the JSON.

    python tests/tasks_app/cron_vectors/extract.py --cronsim CHECKOUT --croniter CHECKOUT

Each library is imported from its checkout and its own unittest suite is run against it, with
the library's iterator wrapped so that every question the suite asks is written down with the
answer the library gives: "from this instant, the next (or previous) fire times of this
expression are ...", "this expression is refused", and for expressions a test only parses,
the values each field selects. The suites pass at the recorded commits, so every answer a test
asserts is the published one; answers the library gave that a test did not check are kept too
(they are that library's behaviour on its own test inputs). Nothing of either library's code is
copied into this repository: only its expressions, instants and answers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import unittest
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CURRENT_TEST = {"id": ""}


class _Recorder(unittest.TextTestResult):
    def startTest(self, test: unittest.TestCase) -> None:
        CURRENT_TEST["id"] = ".".join(test.id().split(".")[-3:])  # module.Class.test
        super().startTest(test)


def _zone_name(zone: tzinfo | None, sample: datetime | None = None) -> str:
    """An IANA name for ``zone`` (pytz, dateutil, zoneinfo), or "offset:+HH:MM" for a fixed offset."""
    if zone is None:
        return "UTC"
    for attribute in ("key", "zone"):
        name = getattr(zone, attribute, None)
        if isinstance(name, str):
            return name
    filename = getattr(zone, "_filename", None)
    if isinstance(filename, str) and filename:
        return filename.split("zoneinfo/")[-1]
    if type(zone).__name__ == "tzutc" or zone is UTC:
        return "UTC"
    offset = zone.utcoffset(sample or datetime(2000, 1, 1))
    if offset is not None:
        sign = "-" if offset < timedelta(0) else "+"
        minutes = abs(int(offset.total_seconds())) // 60
        return f"offset:{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    return f"unknown:{zone!r}"


def _iso(moment: datetime | float, zone: tzinfo | None) -> str:
    """An instant as ISO 8601 with its offset in the zone it was given in (naive: UTC)."""
    if isinstance(moment, int | float):
        moment = datetime.fromtimestamp(moment, UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment.astimezone(zone) if zone is not None else moment.astimezone(UTC)).isoformat()


def _commit(checkout: Path, fallback: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return fallback


def _run_suite(module_name: str) -> unittest.TestResult:
    suite = unittest.defaultTestLoader.loadTestsFromModule(importlib.import_module(module_name))
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=0, stream=open("/dev/null", "w"))  # noqa: SIM115
    return runner.run(suite)


def _ordered(values: Any) -> list[Any]:
    """Numbers in numeric order, then anything else (a library's markers for L, #) by its text."""
    return sorted(values, key=lambda value: (0, value, "") if isinstance(value, int) else (1, 0, str(value)))


def _dedupe(vectors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    counts: dict[str, int] = {}
    for vector in vectors:
        key = json.dumps({k: v for k, v in vector.items() if k != "id"}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        counts[vector["id"]] = counts.get(vector["id"], 0) + 1
        vector["id"] = f"{vector['id']}#{counts[vector['id']]}"
        out.append(vector)
    return out


# --------------------------------------------------------------------------- cronsim


def extract_cronsim(checkout: Path) -> dict[str, Any]:
    sys.path.insert(0, str(checkout))
    module = importlib.import_module("cronsim.cronsim")
    cronsim_class = module.CronSim
    vectors: list[dict[str, Any]] = []
    original_init, original_next = cronsim_class.__init__, cronsim_class.__next__

    def init(self: Any, expr: str, dt: datetime, reverse: bool = False) -> None:
        base = {"id": CURRENT_TEST["id"], "expression": expr}
        try:
            original_init(self, expr, dt, reverse)
        except module.CronSimError as exc:
            vectors.append({**base, "expect_error": str(exc)})
            raise
        zone = dt.tzinfo
        self._vector = {
            **base,
            "zone": _zone_name(zone, dt),
            "start": _iso(dt.replace(microsecond=0), zone),
            "direction": "prev" if reverse else "next",
            "expect": [],
        }
        self._parsed = {
            name: _ordered(getattr(self, name))
            for name in ("seconds", "minutes", "hours", "days", "months", "weekdays")
        }
        self._vector["parsed"] = {
            k: [v if isinstance(v, int) else str(v) for v in vs] for k, vs in self._parsed.items()
        }
        vectors.append(self._vector)

    def next_(self: Any) -> datetime:
        try:
            result = original_next(self)
        except StopIteration:
            self._vector["then"] = "stop"
            raise
        self._vector["expect"].append(_iso(result, result.tzinfo))
        return result

    cronsim_class.__init__, cronsim_class.__next__ = init, next_
    sys.path.insert(0, str(checkout / "tests"))
    result = _run_suite("test_cronsim")
    assert result.wasSuccessful(), result.failures + result.errors
    for vector in vectors:
        if vector.get("expect") or "then" in vector:
            vector.pop("parsed", None)  # the fire times say more; parsed sets are kept for parse-only tests
        elif "parsed" in vector:
            for key in ("zone", "start", "direction", "expect"):
                vector.pop(key, None)
    return {
        "source": {
            "repository": "https://github.com/cuu508/cronsim",
            "commit": _commit(checkout, "fd2e617787e94b15beee27fee6ebe6cbe79a72a2"),
            "files": ["tests/test_cronsim.py"],
            "licence": "BSD-3-Clause",
            "tests_run": result.testsRun,
        },
        "notes": (
            "Six fields are seconds FIRST in cronsim, as in TMS. 'start' is exclusive: 'next' lists the "
            "fire times after it, 'prev' (reverse=True) those before it, nearest first. 'then': 'stop' "
            "means the library found no further fire time. 'parsed' is what each field selects "
            "(weekday 7 is Sunday; L, LW, (weekday, n) are cronsim's extensions)."
        ),
        "vectors": _dedupe(vectors),
    }


# --------------------------------------------------------------------------- croniter

_CRONITER_DEFAULTS = {
    "day_or": True,
    "hash_id": None,
    "implement_cron_bug": False,
    "second_at_beginning": False,
    "expand_from_start_time": False,
    "max_years_between_matches": None,
}


#: croniter's test files not ported, and why (also written into croniter.json).
SKIPPED_CRONITER_FILES = {
    "test_croniter_speed.py": "timings, not answers",
    "test_croniter_hash.py": "the H (hash) extension, which TMS refuses (10,500 generated cases of it)",
    "test_croniter_random.py": "the R (random) extension, which TMS refuses",
}


def extract_croniter(checkout: Path) -> dict[str, Any]:
    sys.path.insert(0, str(checkout / "src"))
    module = importlib.import_module("croniter.croniter")
    croniter_class = module.croniter
    vectors: list[dict[str, Any]] = []
    original_init, original_get_next = croniter_class.__init__, croniter_class._get_next

    def init(self: Any, expr_format: Any, start_time: Any = None, *args: Any, **kwargs: Any) -> None:
        names = ["ret_type", "day_or", "max_years_between_matches", "is_prev", "hash_id", "implement_cron_bug"]
        names += ["second_at_beginning", "expand_from_start_time"]
        given = dict(zip(names, args, strict=False)) | kwargs
        options = {
            name: value if not isinstance(value, bytes) else value.decode()
            for name, value in given.items()
            if name in _CRONITER_DEFAULTS and value != _CRONITER_DEFAULTS[name]
        }
        base = {"id": CURRENT_TEST["id"], "expression": expr_format, "options": options}
        self._vector = None
        try:
            original_init(self, expr_format, start_time, *args, **kwargs)
        except module.CroniterError as exc:
            if isinstance(expr_format, str):
                vectors.append({**base, "expect_error": f"{type(exc).__name__}: {exc}"})
            raise
        self._base = base
        self._parse_only = {
            **base,
            "expanded": [_ordered(v) if isinstance(v, list) else v for v in self.expanded],
            "nth_weekday_of_month": {str(k): _ordered(v) for k, v in self.nth_weekday_of_month.items()},
        }
        vectors.append(self._parse_only)

    def get_next(
        self: Any, ret_type: Any = None, start_time: Any = None, is_prev: Any = None, update_current: Any = None
    ) -> Any:
        self.set_current(start_time, force=True)
        direction = "prev" if (self._is_prev if is_prev is None else is_prev) else "next"
        start = self.cur
        vector = self._vector
        if vector is None or start_time is not None or vector["direction"] != direction or vector["_cur"] != start:
            vector = {
                **self._base,
                "zone": _zone_name(self.tzinfo),
                "start": _iso(start, self.tzinfo),
                "direction": direction,
                "expect": [],
            }
            if self._parse_only in vectors:
                vectors.remove(self._parse_only)
            vectors.append(vector)
        try:
            result = original_get_next(self, ret_type, None, is_prev, update_current)
        except module.CroniterBadDateError:
            vector["then"] = "stop"
            vector.pop("_cur", None)
            self._vector = None
            raise
        moment = result if isinstance(result, datetime) else self.timestamp_to_datetime(result)
        vector["expect"].append(_iso(moment, self.tzinfo))
        vector["_cur"] = self.cur
        self._vector = vector if update_current in (None, True) else None
        return result

    croniter_class.__init__, croniter_class._get_next = init, get_next
    tests = checkout / "src" / "croniter" / "tests"
    results = []
    for name in sorted(tests.glob("test_*.py")):
        if name.name in SKIPPED_CRONITER_FILES:
            continue
        results.append((name.name, _run_suite(f"croniter.tests.{name.stem}")))
    failed = [(n, r.failures + r.errors) for n, r in results if not r.wasSuccessful()]
    assert not failed, failed
    for vector in vectors:
        vector.pop("_cur", None)
        if not vector.get("options"):
            vector.pop("options", None)
        if "expect" in vector and not vector["expect"] and "then" not in vector:
            vectors.remove(vector)
    return {
        "source": {
            "repository": "https://github.com/pallets-eco/croniter",
            "commit": _commit(checkout, "3dd4d14e971294c03d3fb9be3f5ca03ae1c25310"),
            "files": [f"src/croniter/tests/{n}" for n, _ in results],
            "not_ported": {f"src/croniter/tests/{n}": why for n, why in SKIPPED_CRONITER_FILES.items()},
            "licence": "MIT",
            "tests_run": sum(r.testsRun for _, r in results),
        },
        "notes": (
            "Six fields are seconds LAST in croniter (unless options.second_at_beginning); a seventh is the "
            "year. 'start' is exclusive: 'next' lists the fire times after it, 'prev' those before it, "
            "nearest first. 'then': 'stop' means the library found no further fire time. 'options' are "
            "croniter's constructor arguments that differ from their defaults. 'expanded' is what each "
            "field selects, for expressions a test only parses ('*' for every value)."
        ),
        "vectors": _dedupe(vectors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cronsim", type=Path, required=True, help="a checkout of cuu508/cronsim")
    parser.add_argument("--croniter", type=Path, required=True, help="a checkout of pallets-eco/croniter")
    arguments = parser.parse_args()
    for name, extract, checkout in (
        ("cronsim", extract_cronsim, arguments.cronsim),
        ("croniter", extract_croniter, arguments.croniter),
    ):
        data = extract(checkout.resolve())
        path = HERE / f"{name}.json"
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {len(data['vectors'])} vectors from {data['source']['tests_run']} tests")


if __name__ == "__main__":
    main()
