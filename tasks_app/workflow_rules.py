"""The rules of workflow links, pure (no database): a link's condition on its upstream's output,
and a step's join rule over its upstreams.

A **condition** is JSON, checked when it is written (:func:`condition_check`) and evaluated with no
``eval`` (:func:`condition_holds`)::

    {"path": "$.status", "op": "==", "value": "ok"}
    {"path": "$.items.length", "op": ">", "value": 0}
    {"path": "$.error", "op": "exists"}
    {"all": [<condition>, ...]}   {"any": [<condition>, ...]}   {"not": <condition>}

A path is ``$`` then ``.name`` keys (letters, digits, ``_``, ``-``), ``[n]`` list indexes (negative
from the end) and ``["any key"]``; ``.length`` of a list or a text is its length (of an object, its
key ``length``). It is read in the document the step would be given as its input from that
upstream (:func:`executions.transitions.follow.input_from`: the output's JSON object, or
``{"output": "<text>"}``; after a failure with its ``error``). A path that leads nowhere is
*missing*: ``exists`` is false and every comparison is false (``!=`` and ``not in`` too).
``==``/``!=`` compare JSON values (``1 == 1.0``, ``true != 1``); ``<``, ``<=``, ``>``, ``>=`` two
numbers or two texts (else false); ``in``/``not in`` a value against a list literal.

A **join rule** (:class:`tasks_app.models.JoinRule`) says when a step with several upstreams runs
and when it is skipped; :func:`join_decide` applies it to the upstreams' states. See
docs/workflows.md ("Conditions and join rules") for the table.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tasks_app.models import DependencyOn, JoinRule

#: Comparison operators a condition may use.
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not in", "exists")
#: Bounds of a condition: nesting of all/any/not, tests in all, characters of a path, of its JSON.
MAX_DEPTH = 5
MAX_TESTS = 50
MAX_PATH = 200
MAX_CONDITION_CHARS = 4096

_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_\-]*)|\[(-?\d{1,6})\]|\[("(?:[^"\\]|\\.)*")\]')
_MISSING = object()


class ConditionError(ValueError):
    """A condition that is not well formed: the message says where and why."""


def path_parse(path: Any) -> list[str | int]:
    """The steps of a path (keys and indexes); :class:`ConditionError` if it is not one."""
    if not isinstance(path, str) or not path.startswith("$"):
        raise ConditionError(f"path must be a text starting with $, like $.status: got {path!r}.")
    if len(path) > MAX_PATH:
        raise ConditionError(f"path is longer than {MAX_PATH} characters.")
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        match = _STEP.match(path, at)
        if match is None:
            raise ConditionError(f'path {path!r}: cannot read {path[at:]!r} (use .key, [0] or ["key"]).')
        key, index, quoted = match.groups()
        if key is not None:
            steps.append(key)
        elif index is not None:
            steps.append(int(index))
        else:
            steps.append(str(json.loads(quoted)))
        at = match.end()
    return steps


def condition_check(condition: Any, *, depth: int = 0) -> int:
    """Check that ``condition`` is well formed; return how many tests it has. Raises
    :class:`ConditionError` naming the problem."""
    if depth == 0 and len(json.dumps(condition, default=str)) > MAX_CONDITION_CHARS:
        raise ConditionError(f"a condition is at most {MAX_CONDITION_CHARS} characters of JSON.")
    if depth > MAX_DEPTH:
        raise ConditionError(f"all/any/not nest at most {MAX_DEPTH} deep.")
    if not isinstance(condition, Mapping):
        raise ConditionError('expected an object: {"path": "$.x", "op": "==", "value": 1}, {"all": [...]}, '
                             '{"any": [...]} or {"not": {...}}.')  # fmt: skip
    keys = set(condition)
    for combinator in ("all", "any"):
        if combinator in keys:
            if keys != {combinator}:
                raise ConditionError(f"{combinator} stands alone in its object.")
            parts = condition[combinator]
            if not isinstance(parts, list) or not parts:
                raise ConditionError(f"{combinator} takes a non-empty list of conditions.")
            tests = sum(condition_check(part, depth=depth + 1) for part in parts)
            if tests > MAX_TESTS:
                raise ConditionError(f"a condition has at most {MAX_TESTS} tests.")
            return tests
    if "not" in keys:
        if keys != {"not"}:
            raise ConditionError("not stands alone in its object.")
        return condition_check(condition["not"], depth=depth + 1)
    unknown = keys - {"path", "op", "value"}
    if unknown:
        raise ConditionError(f"unknown key {sorted(unknown)[0]!r} (path, op, value; or all, any, not).")
    if "path" not in keys or "op" not in keys:
        raise ConditionError("a test needs a path and an op.")
    path_parse(condition["path"])
    op = condition["op"]
    if op not in OPS:
        raise ConditionError(f"unknown op {op!r}: one of {', '.join(OPS)}.")
    if op == "exists":
        if "value" in keys and not isinstance(condition["value"], bool):
            raise ConditionError("exists takes no value, or true / false.")
        return 1
    if "value" not in keys:
        raise ConditionError(f"op {op} needs a value.")
    value = condition["value"]
    if op in ("in", "not in") and not isinstance(value, list):
        raise ConditionError(f"op {op} needs a list value.")
    if op in ("<", "<=", ">", ">=") and not (_number(value) or isinstance(value, str)):
        raise ConditionError(f"op {op} needs a number or a text value.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConditionError("value must be a finite number.")
    return 1


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read(document: Any, steps: Sequence[str | int]) -> Any:
    value = document
    for step in steps:
        if isinstance(step, int):
            if isinstance(value, list) and -len(value) <= step < len(value):
                value = value[step]
            else:
                return _MISSING
        elif isinstance(value, dict) and step in value:
            value = value[step]
        elif step == "length" and isinstance(value, list | str):
            value = len(value)
        else:
            return _MISSING
    return value


def path_read(document: Any, path: str) -> tuple[bool, Any]:
    """The value at ``path`` (checked: :class:`ConditionError`) in ``document``: (found, value)."""
    value = _read(document, path_parse(path))
    return (False, None) if value is _MISSING else (True, value)


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: numbers by value, a boolean equal only to a boolean."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def condition_holds(condition: Mapping[str, Any] | None, document: Any) -> bool:
    """Whether ``condition`` (checked when written) holds on ``document``; no condition holds."""
    if condition is None:
        return True
    if "all" in condition:
        return all(condition_holds(part, document) for part in condition["all"])
    if "any" in condition:
        return any(condition_holds(part, document) for part in condition["any"])
    if "not" in condition:
        return not condition_holds(condition["not"], document)
    try:
        found = _read(document, path_parse(condition["path"]))
    except ConditionError:
        return False
    op, value = condition["op"], condition.get("value")
    if op == "exists":
        return (found is not _MISSING) == (value is not False)
    if found is _MISSING:
        return False
    if op == "==":
        return json_equal(found, value)
    if op == "!=":
        return not json_equal(found, value)
    if op in ("in", "not in"):
        inside = isinstance(value, list) and any(json_equal(found, item) for item in value)
        return inside if op == "in" else not inside
    if (_number(found) and _number(value)) or (isinstance(found, str) and isinstance(value, str)):
        return bool({"<": found < value, "<=": found <= value, ">": found > value, ">=": found >= value}.get(op, False))
    return False


def condition_words(condition: Mapping[str, Any] | None) -> str:
    """A condition as people read it: ``$.status == "ok"``, ``($.a > 1 or $.b exists)``."""
    if not condition:
        return ""
    for combinator, joiner in (("all", " and "), ("any", " or ")):
        if combinator in condition:
            return "(" + joiner.join(condition_words(part) for part in condition[combinator]) + ")"
    if "not" in condition:
        return f"not {condition_words(condition['not'])}"
    if condition.get("op") == "exists":
        return f"{condition.get('path')} {'does not exist' if condition.get('value') is False else 'exists'}"
    return f"{condition.get('path')} {condition.get('op')} {json.dumps(condition.get('value'))}"


# --- join rules --------------------------------------------------------------------------------

#: The joins that consult neither a link's ``on`` nor its condition.
JOINS_WITHOUT_GATES = frozenset({JoinRule.ALL_DONE, JoinRule.NONE_FAILED})

#: For each end, the ``on`` values it satisfies.
SATISFIES: Mapping[str, frozenset[str]] = {
    "SUCCEEDED": frozenset({DependencyOn.SUCCESS, DependencyOn.COMPLETION}),
    "FAILED": frozenset({DependencyOn.FAILURE, DependencyOn.COMPLETION}),
}


def join_check(join: str, links: Sequence[tuple[str, str, Any]]) -> str:
    """Why ``links`` ``(upstream label, on, condition)`` do not go with ``join`` ("" if they do):
    a join that consults no ``on`` or no condition refuses one that would be ignored."""
    for label, on, condition in links:
        if join in JOINS_WITHOUT_GATES | {JoinRule.ONE_FAILED} and on != DependencyOn.SUCCESS:
            return f"join {join} does not read a link's on: the link to {label} has on {on} (leave it success)."
        if join in JOINS_WITHOUT_GATES and condition is not None:
            return (
                f"join {join} does not read conditions: the link to {label} has one (remove it, or use another join)."
            )
    return ""


@dataclass(frozen=True)
class Upstream:
    """How one upstream of a step stands in a workflow run.

    ``state``: ``"pending"`` (not ended yet, running, or cancelled: a cancelled run is no end),
    ``"skipped"`` (it will not run in this workflow run), or the status of its run's end
    (``SUCCEEDED`` / ``FAILED``); ``document``: what its condition reads (the ended run's input
    document); ``run``: whatever the caller wants back for the runs a step is created from."""

    task: Any
    name: str
    on: str
    condition: Mapping[str, Any] | None
    state: str
    document: Any = None
    run: Any = None

    @property
    def done(self) -> bool:
        return self.state != "pending"

    @property
    def ended(self) -> bool:
        return self.state in SATISFIES

    @property
    def met(self) -> bool:
        """Its run ended as the link's ``on`` asks and the link's condition holds."""
        return self.ended and self.on in SATISFIES[self.state] and condition_holds(self.condition, self.document)

    @property
    def failed_as_asked(self) -> bool:
        """Its run failed for good and the link's condition holds (what ``one_failed`` counts)."""
        return self.state == "FAILED" and condition_holds(self.condition, self.document)

    def unmet_words(self) -> str:
        if self.state == "skipped":
            return f"{self.name} did not run"
        if self.ended and self.on not in SATISFIES[self.state]:
            return f"{self.name} {self.state.lower()}; it runs on {self.on}"
        return f"the condition on {self.name}'s output is false ({condition_words(self.condition)})"


@dataclass(frozen=True)
class Decision:
    """``run``: the step runs now, from ``sources`` (the upstreams whose runs it follows);
    ``skip``: it will not run (``reason`` says why); neither: it waits."""

    run: bool = False
    skip: bool = False
    reason: str = ""
    sources: tuple[Upstream, ...] = ()


WAIT = Decision()


def _first_of(chosen: tuple[Upstream, ...], upstreams: Sequence[Upstream], everyone: bool, none_did: str) -> Decision:
    """The decision of a join that runs on the first upstream to qualify (one_success,
    one_failed): run with the ``chosen`` ones as soon as there is one; once every upstream is done
    and none qualified, skip ("none of ... ``none_did``"); else wait."""
    if chosen:
        return Decision(run=True, sources=chosen)
    if everyone:
        return Decision(skip=True, reason=f"none of {_names(upstreams)} {none_did}")
    return WAIT


def join_decide(join: str, upstreams: Sequence[Upstream]) -> Decision:
    """Apply ``join`` to a step's ``upstreams`` (each link and how its upstream stands)."""
    everyone = all(upstream.done for upstream in upstreams)
    ended = tuple(upstream for upstream in upstreams if upstream.ended)
    if join == JoinRule.ONE_SUCCESS:
        met = tuple(upstream for upstream in upstreams if upstream.met)
        return _first_of(met, upstreams, everyone, "ended as asked (join one_success)")
    if join == JoinRule.ONE_FAILED:
        failed = tuple(upstream for upstream in upstreams if upstream.failed_as_asked)
        return _first_of(failed, upstreams, everyone, "failed as asked (join one_failed)")
    if join == JoinRule.ALL_DONE:
        return Decision(run=True, sources=ended) if everyone else WAIT
    if join == JoinRule.NONE_FAILED:
        failures = [upstream for upstream in upstreams if upstream.state == "FAILED"]
        if failures:
            return Decision(skip=True, reason=f"{failures[0].name} failed (join none_failed)")
        return Decision(run=True, sources=ended) if everyone else WAIT
    # all_success: every link met; skipped as soon as one cannot be.
    for upstream in upstreams:
        if upstream.done and not upstream.met:
            return Decision(skip=True, reason=upstream.unmet_words())
    if everyone:
        return Decision(run=True, sources=tuple(upstreams))
    return WAIT


def _names(upstreams: Sequence[Upstream]) -> str:
    names = sorted(upstream.name for upstream in upstreams)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
