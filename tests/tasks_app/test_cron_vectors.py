"""The cron engine against the published test vectors of cronsim and croniter (issue 26).

``cron_vectors/cronsim.json`` and ``cron_vectors/croniter.json`` hold the questions those two
libraries' own test suites ask, with the answers the libraries give (their source, commit and
how they were taken are in each file; ``cron_vectors/extract.py`` made them). Each vector is put
to :mod:`tasks_app.schedules` and the answers compared:

* a refused expression must be refused;
* fire times after (or before) an instant, in a time zone, must be the same instants;
* for an expression a test only parses, each field must select the same values.

A difference passes only if it is deliberate: the expression uses an extension TMS refuses (H, R,
a year field, L, W or # in a list, range or step), a croniter option TMS does not have
(``day_or=False``...), or its vector id is listed in ``cron_vectors/deliberate.json`` with a
reason. Every listed id must still differ, and docs/cron-compatibility.md must list every
difference (``python -m tests.tasks_app.test_cron_vectors`` prints its table). No database: pure and quick.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tasks_app.schedules import MAX_WALK, Schedule, ScheduleError, WalkTooLong, parse_cron

HERE = Path(__file__).resolve().parent / "cron_vectors"
DOC = Path(__file__).resolve().parents[2] / "docs" / "cron-compatibility.md"
SOURCES = ("cronsim", "croniter")


@functools.cache
def load(source: str) -> dict[str, Any]:
    return json.loads((HERE / f"{source}.json").read_text())


@functools.cache
def deliberate() -> dict[str, Any]:
    return json.loads((HERE / "deliberate.json").read_text())


# --------------------------------------------------------------------------- reading a vector

#: croniter options TMS has no equivalent of: their vectors are answered "not applicable".
_FOREIGN_OPTIONS = {
    "day_or": "croniter's day_or=False (both day fields must always match); TMS has no such switch",
    "implement_cron_bug": "croniter's implement_cron_bug option",
    "expand_from_start_time": "croniter's expand_from_start_time option (steps counted from the start time)",
    "hash_id": "croniter's H (hash) extension",
}
#: Month and weekday names: any other letter (L, W, H, R) or a "#" is an extension TMS refuses.
_NAMES = re.compile(r"jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|sun|mon|tue|wed|thu|fri|sat", re.IGNORECASE)


def _uses_extension(expression: str) -> bool:
    return bool(re.search(r"[A-Za-z#]", _NAMES.sub("", expression))) or len(expression.split()) == 7


def tms_expression(source: str, vector: dict[str, Any]) -> str:
    """The vector's expression written in TMS's field order (croniter's six fields are seconds last)."""
    expression = vector["expression"]
    options = vector.get("options", {})
    parts = expression.split()
    if source == "croniter" and len(parts) == 6 and not options.get("second_at_beginning"):
        return " ".join([parts[5], *parts[:5]])
    return expression


def zone_of(vector: dict[str, Any]) -> ZoneInfo | None:
    """The vector's zone as an IANA zone (a whole-hour fixed offset as Etc/GMT-N); None if none fits."""
    name = vector.get("zone", "UTC")
    if name.startswith("offset:"):
        sign, hours, minutes = name[7], int(name[8:10]), int(name[11:13])
        if minutes:
            return None
        return ZoneInfo("UTC" if not hours else f"Etc/GMT{'-' if sign == '+' else '+'}{hours}")
    return ZoneInfo(name)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _next_times(schedule: Schedule, after: datetime, count: int) -> tuple[list[datetime], bool]:
    """Up to ``count`` fire times strictly after ``after``, and whether the walk ended before them."""
    times: list[datetime] = []
    with contextlib.suppress(WalkTooLong):  # fewer than asked for within the walk: "then none"
        times = list(islice(schedule.fire_times(after + timedelta(microseconds=1)), count))
    return times, len(times) < count


def _prev_times(expression: str, zone: ZoneInfo, before: datetime, count: int) -> tuple[list[datetime], bool]:
    """Up to ``count`` fire times strictly before ``before``, nearest first: TMS walks forward
    only, so a walk from ever further back, until enough are found or 100 years are searched."""
    span = timedelta(hours=2)
    while True:
        low = before - span
        schedule = Schedule(start_at=low, cron=expression, timezone=zone.key)
        found: list[datetime] = []
        try:
            for when in schedule.fire_times():
                if when >= before:
                    break
                found.append(when)
        except WalkTooLong:
            pass
        if len(found) >= count or span >= MAX_WALK:
            return found[::-1][:count], len(found) < count
        span = min(span * 8, MAX_WALK)


@dataclass(frozen=True)
class Outcome:
    theirs: str
    ours: str
    #: Why the two may differ without failing: a category, a listed reason, or "" (they must agree).
    excuse: str = ""

    @property
    def differs(self) -> bool:
        return self.theirs != self.ours


def _full(field: str) -> set[int]:
    return {
        "seconds": set(range(60)),
        "minutes": set(range(60)),
        "hours": set(range(24)),
        "days": set(range(1, 32)),
        "months": set(range(1, 13)),
        "weekdays": set(range(7)),
    }[field]


def _ours_parsed(expression: str) -> dict[str, set[Any]]:
    """What TMS reads in each field; the day extensions as text ("L", "L-3", "15W", "LW", "5#3", "5L")."""
    cron = parse_cron(expression)
    days: set[Any] = set(cron.days) | {"L" if n == 0 else f"L-{n}" for n in cron.month_days.last_offsets}
    days |= {f"{n}W" for n in cron.month_days.nearest_weekdays} | ({"LW"} if cron.month_days.last_weekday else set())
    weekdays: set[Any] = set(cron.weekdays) | {f"{d}#{n}" for d, n in cron.month_weekdays.nth_weekdays}
    weekdays |= {f"{d}L" for d in cron.month_weekdays.last_weekdays}
    return {
        "seconds": set(cron.seconds),
        "minutes": set(cron.minutes),
        "hours": set(cron.hours),
        "days": days,
        "months": set(cron.months),
        "weekdays": weekdays,
    }


#: cronsim's readings of the day extensions: its markers for "last day" and "last weekday".
_CRONSIM_LAST, _CRONSIM_LAST_WEEKDAY = -1000, -1001


def _cronsim_day(value: Any) -> Any:
    return {_CRONSIM_LAST: "L", _CRONSIM_LAST_WEEKDAY: "LW"}.get(value, value)


def _cronsim_weekday(value: Any) -> Any:
    """cronsim's "(weekday, n)" (written down as text): the n-th such weekday of the month, or the last."""
    if isinstance(value, str) and (pair := re.fullmatch(r"\((\d+), (-?\d+)\)", value)):
        weekday, nth = int(pair.group(1)) % 7, int(pair.group(2))
        return f"{weekday}L" if nth == _CRONSIM_LAST else f"{weekday}#{nth}"
    return value


def _theirs_parsed(source: str, vector: dict[str, Any]) -> dict[str, set[Any]]:
    if source == "cronsim":
        parsed = {name: set(values) for name, values in vector["parsed"].items()}
        parsed["days"] = {_cronsim_day(value) for value in parsed["days"]}
        parsed["weekdays"] = {_cronsim_weekday(value) for value in parsed["weekdays"]}
    else:
        names = ["minutes", "hours", "days", "months", "weekdays", "seconds", "years"]
        if vector.get("options", {}).get("second_at_beginning"):
            names = ["seconds", "minutes", "hours", "days", "months", "weekdays", "years"]
        parsed = {}
        for name, values in zip(names, vector["expanded"], strict=False):
            if name != "years":
                parsed[name] = _full(name) if values == ["*"] else set(values)
        parsed.setdefault("seconds", {0})
        parsed.pop("years", None)
        parsed["days"] = {"L" if value == "l" else value for value in parsed["days"]}
        nth = vector.get("nth_weekday_of_month") or {}
        if nth:  # croniter lists the weekday among the plain ones too, and its n's (or "l") apart
            parsed["weekdays"] = (parsed["weekdays"] - {int(day) for day in nth}) | {
                f"{int(day) % 7}L" if n == "l" else f"{int(day) % 7}#{n}" for day, ns in nth.items() for n in ns
            }
    parsed["weekdays"] = {0 if value == 7 else value for value in parsed["weekdays"]}
    return parsed


_FIELD_NAMES = ("seconds", "minutes", "hours", "days", "months", "weekdays")


def _show(parsed: dict[str, set[Any]]) -> str:
    """``{"minutes": {0..59}, "hours": {1, 2, 3}}`` -> "minutes=0-59 hours=1-3": one text per reading."""

    def one(values: set[Any]) -> str:
        ints, items = sorted(v for v in values if isinstance(v, int)), []
        while ints:
            run = 1
            while run < len(ints) and ints[run] == ints[0] + run:
                run += 1
            items.append(f"{ints[0]}-{ints[run - 1]}" if run > 2 else ",".join(map(str, ints[:run])))
            ints = ints[run:]
        return ",".join(items) + "".join(f"+{v}" for v in sorted(map(str, values)) if not v.isdigit())

    return " ".join(f"{name}={one(parsed[name])}" for name in _FIELD_NAMES)


def outcome(source: str, vector: dict[str, Any]) -> Outcome:
    """What the vector says (theirs) and what TMS answers (ours), each as a short text."""
    # Parse the vector first: a refusal by both is agreement whatever the reason.
    options = vector.get("options", {})
    foreign = [why for option, why in _FOREIGN_OPTIONS.items() if option in options]
    expression = tms_expression(source, vector)
    listed = deliberate()["vectors"].get(f"{source}:{vector['id']}", "")
    if "expect_error" in vector:
        theirs = "refused"
    elif "expect" in vector:
        theirs = " ".join(vector["expect"]) + (" then none" if vector.get("then") else "")
    else:
        theirs = _show(_theirs_parsed(source, vector))
    try:
        parse_cron(expression)
    except ScheduleError:
        excuse = "extension" if _uses_extension(expression) else ""
        return Outcome(theirs, "refused", excuse or listed)
    excuse = "option" if foreign else listed
    if "expect_error" in vector:
        return Outcome(theirs, "accepted", excuse)
    if "expect" not in vector:
        return Outcome(theirs, _show(_ours_parsed(expression)), excuse)
    zone = zone_of(vector)
    if zone is None:
        return Outcome(theirs, "no IANA zone for a fixed offset", "fixed-offset")
    start, count = _instant(vector["start"]), len(vector["expect"]) + (1 if vector.get("then") else 0)
    if vector["direction"] == "next":
        schedule = Schedule(start_at=start, cron=expression, timezone=zone.key)
        times, ended = _next_times(schedule, start, count)
    else:
        times, ended = _prev_times(expression, zone, start, count)
    expected = [_instant(text) for text in vector["expect"]]
    if vector.get("then") and ended and len(times) == len(expected):
        ours_text = theirs  # the same times, then none within the walk
    else:
        shown = [when.astimezone(zone).isoformat() for when in times[: len(expected)]]
        ours_text = " ".join(shown)
        if vector.get("then"):
            ours_text += " then none" if ended and len(times) == len(expected) else ""
        if times[: len(expected)] == expected and not vector.get("then"):
            ours_text = theirs  # the same instants, perhaps written with another offset
    return Outcome(theirs, ours_text, excuse)


def all_vectors() -> Iterator[tuple[str, dict[str, Any]]]:
    for source in SOURCES:
        for vector in load(source)["vectors"]:
            yield source, vector


@functools.cache
def results() -> dict[str, tuple[str, dict[str, Any], Outcome]]:
    return {f"{source}:{vector['id']}": (source, vector, outcome(source, vector)) for source, vector in all_vectors()}


# --------------------------------------------------------------------------- the tests


def test_vector_files_name_their_source_and_hold_the_published_cases():
    for source in SOURCES:
        data = load(source)
        assert re.fullmatch(r"[0-9a-f]{40}", data["source"]["commit"]), source
        assert data["source"]["repository"].startswith("https://github.com/") and data["source"]["files"]
    assert len(load("cronsim")["vectors"]) > 450 and len(load("croniter")["vectors"]) > 450


def test_every_difference_from_cronsim_and_croniter_is_deliberate():
    unexplained = [
        f"{key}\n    expression {vector['expression']!r} -> TMS {tms_expression(source, vector)!r}\n"
        f"    theirs: {result.theirs}\n    ours:   {result.ours}"
        for key, (source, vector, result) in results().items()
        if result.differs and not result.excuse
    ]
    assert not unexplained, f"{len(unexplained)} differences are neither fixed nor listed:\n" + "\n".join(unexplained)


def test_every_listed_difference_still_differs():
    listed = deliberate()["vectors"]
    stale = [key for key in listed if key not in results() or not results()[key][2].differs]
    assert not stale, f"listed in deliberate.json but no longer different (or gone): {stale}"
    unknown = {reason for reason in listed.values() if reason not in deliberate()["reasons"]}
    assert not unknown, unknown


def test_agreement_figures(capsys):
    counts = {"agree": 0, "differ": 0}
    for _, _, result in results().values():
        counts["differ" if result.differs else "agree"] += 1
    with capsys.disabled():
        print(f"\ncron vectors: {len(results())}, agreeing {counts['agree']}, kept differences {counts['differ']}")
    assert counts["agree"] > counts["differ"]
    scheduling = (DOC.parent / "scheduling.md").read_text()
    said = f"({len(results())} cases"
    assert (
        said in scheduling and f"{counts['agree']} agree" in scheduling and f"other {counts['differ']} is" in scheduling
    ), (
        "docs/scheduling.md's Cron compatibility figures are out of date",
        counts,
    )


def difference_table() -> str:
    """The tables of docs/cron-compatibility.md: the reasons, then one row per differing vector
    reading (expression, theirs, ours), each with its reason's name."""
    reasons = {**_CATEGORY_REASONS, **deliberate()["reasons"]}
    rows: dict[str, set[str]] = {}
    count: dict[str, int] = {}
    for source, vector, result in results().values():
        if not result.differs:
            continue
        options = "".join(f" ({name}={value})" for name, value in vector.get("options", {}).items())
        expression = f"`{vector['expression'].strip()}`".replace("|", "\\|")
        theirs, ours = _short(result.theirs), _short(result.ours)
        row = f"| {source} | {expression}{options} | {theirs} | {ours} | {result.excuse} |"
        rows.setdefault(result.excuse, set()).add(row)
        count[result.excuse] = count.get(result.excuse, 0) + 1
    lines = ["| reason | vectors | why |", "|---|---|---|"]
    lines += [
        f"| {name} | {count[name]} | {reasons.get(name, 'NOT EXPLAINED')} |"
        for name in sorted(count, key=lambda n: -count[n])
    ]
    lines += ["", "| library | expression | theirs | ours | reason |", "|---|---|---|---|---|"]
    for name in sorted(count, key=lambda n: -count[n]):
        lines += sorted(rows[name])
    return "\n".join(lines) + "\n"


_CATEGORY_REASONS = {
    "extension": "An extension TMS refuses (H, R, a year field, or L, W and # in a list, range or step, which Quartz "
    "refuses too): a 400 that names it, never a guess.",
    "option": "A croniter option TMS does not have (the vector asks for croniter's non-default behaviour).",
    "fixed-offset": "A fixed UTC offset that is not a whole hour: TMS takes IANA zone names only.",
}


def _short(text: str) -> str:
    """A reading cut to fit a table cell: times without their seconds' zeros, at most 3 of them."""
    text = text.replace("|", "\\|").replace(":00+", "+")
    if re.match(r"\d{4}-", text):
        times = text.split(" ")
        text = " ".join(times[:3]) + (" ..." if len(times) > 3 else "")
    return text if len(text) <= 100 else text[:97] + "..."


def test_the_documentation_lists_every_difference():
    table = difference_table()
    assert table in DOC.read_text(), (
        "docs/cron-compatibility.md is out of date: replace its table with the output of "
        "`python -m tests.tasks_app.test_cron_vectors`"
    )


@pytest.mark.parametrize(
    ("source", "vector_id"),
    [
        ("cronsim", "test_cronsim.TestIterator.test_it_handles_dow_star#1"),
        ("cronsim", "test_cronsim.TestDstTransitions.test_001_every_hour_oct#1"),
        ("croniter", "test_croniter.CroniterTest.test_dom_dow_vixie_cron_bug#1"),
    ],
)
def test_named_vectors_are_read_as_published(source, vector_id):
    # A few of the vectors by name, so that a change of the files cannot quietly drop them.
    (vector,) = [v for v in load(source)["vectors"] if v["id"] == vector_id]
    result = outcome(source, vector)
    assert not result.differs or result.excuse, result


if __name__ == "__main__":
    print(difference_table(), end="")
