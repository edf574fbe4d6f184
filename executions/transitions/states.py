"""The state map: which status an execution may go to from which, and every transition's edge.

:data:`ALLOWED_SOURCES` is the execution lifecycle of docs/how-it-works.md (the package itself:
docs/architecture.md, "The transitions package"). Each transition of the package declares
its :class:`Edge` here (its target and the sources it accepts, a part of the map's sources for
that target), and the WHERE clause of its UPDATE is built from the edge
(:func:`executions.transitions.sql.write`), so no transition types a status list of its own.
At import, the edges of each target must together accept exactly the map's sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from executions.models import TERMINAL_STATUSES
from executions.models import ExecutionStatus as S

#: For each target status, the statuses an execution may come from.
ALLOWED_SOURCES: Mapping[str, frozenset[str]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.PENDING}),  # published (again) by a monitor
    S.RUNNING: frozenset({S.PENDING}),  # claimed by a worker
    S.SUCCEEDED: frozenset({S.RUNNING}),
    S.FAILED: frozenset({S.RUNNING}),
    S.SCHEDULED: frozenset({S.RUNNING, S.PENDING}),  # an attempt failed; or a take could not be published
    S.CANCELLED: frozenset({S.SCHEDULED, S.PENDING, S.RUNNING}),
}
assert not any(ALLOWED_SOURCES[target] & TERMINAL_STATUSES for target in ALLOWED_SOURCES), "terminal is final"


@dataclass(frozen=True)
class Edge:
    """One kind of transition: the status it writes and the statuses it may leave.

    ``keeps`` marks a write that changes no status (a lease, a poll, a hand-back): its row must
    be in ``target`` and stays there; such writes are outside the state map."""

    name: str
    target: str
    sources: frozenset[str]
    keeps: bool = False


#: Every edge, by name (the invariant test walks them all).
EDGES: dict[str, Edge] = {}


def _edge(name: str, target: str, *sources: str) -> Edge:
    edge = Edge(name, target, frozenset(sources))
    assert edge.sources <= ALLOWED_SOURCES[target], f"{name}: {set(edge.sources)} -> {target} is not in the map"
    EDGES[name] = edge
    return edge


def _keep(name: str, status: str) -> Edge:
    EDGES[name] = edge = Edge(name, status, frozenset({status}), keeps=True)
    return edge


# The monitor.
TAKE = _edge("take", S.PENDING, S.SCHEDULED)
REPUBLISH = _edge("republish", S.PENDING, S.PENDING)
UNTAKE = _edge("untake", S.SCHEDULED, S.PENDING)
# Workers (and jobs reporting through their callback URL).
CLAIM = _edge("claim", S.RUNNING, S.PENDING)
SUCCEED = _edge("succeed", S.SUCCEEDED, S.RUNNING)
FAIL = _edge("fail", S.FAILED, S.RUNNING)
RETRY_LATER = _edge("retry_later", S.SCHEDULED, S.RUNNING)
# A claim that may not start yet (overlap queue_one, max_concurrency): back to SCHEDULED.
WAIT = _edge("wait", S.SCHEDULED, S.PENDING)
# Dropped by a start rule (misfire or overlap policy), recorded as a skipped occurrence.
SKIP = _edge("skip", S.CANCELLED, S.SCHEDULED, S.PENDING)
# Users and the platform (cancel_previous too).
CANCEL = _edge("cancel", S.CANCELLED, S.SCHEDULED, S.PENDING, S.RUNNING)

# Writes to a RUNNING row that keep its status: the lease, the poll schedule, a hand-back.
LEASE = _keep("lease", S.RUNNING)
HANDBACK = _keep("handback", S.RUNNING)
RESUME = _keep("resume", S.RUNNING)
# A worker takes back its own claim whose answer it never got (the connection dropped after the
# claim committed: a PostgreSQL failover).
TAKE_BACK = _keep("take_back", S.RUNNING)
# A waiting SCHEDULED row made due now when a slot frees.
RELEASE_WAITING = _keep("release_waiting", S.SCHEDULED)

for _target, _sources in ALLOWED_SOURCES.items():
    _accepted = frozenset().union(*(e.sources for e in EDGES.values() if e.target == _target and not e.keeps))
    assert _accepted == _sources, f"edges into {_target} accept {set(_accepted)}, the map says {set(_sources)}"
