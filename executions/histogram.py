"""Fixed, log-spaced histogram buckets for lateness and run duration.

The buckets never change, so histograms of any minute, owner, runner or shard add up bucket
by bucket, and a percentile of any sum is read off the summed counts. Bucket ``i`` holds the
values in ``[EDGES[i - 1], EDGES[i])`` (seconds; bucket 0 everything below ``EDGES[0]``,
negative values included, the last bucket everything from ``EDGES[-1]`` up): exactly
PostgreSQL's ``width_bucket(value, EDGES)``, which the rollup trigger uses.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

#: Bucket bounds in seconds, 1 - 2.5 - 5 per decade from 10 ms to about 7 hours. Frozen in the
#: status trigger (executions/triggers.py): changing them needs a migration that installs it again,
#: and a rebuild.
EDGES: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    5000.0,
    10000.0,
    25000.0,
)
BUCKETS = len(EDGES) + 1


def bucket_of(seconds: float) -> int:
    """The bucket ``seconds`` falls in."""
    return bisect.bisect_right(EDGES, seconds)


def bucket_value(bucket: int) -> float:
    """What a percentile landing in ``bucket`` reports: the bucket's upper bound (the value is
    below it), or for the open last bucket its lower bound (the value is at least that)."""
    return EDGES[min(bucket, len(EDGES) - 1)]


#: The smallest and largest value a histogram was made of (None: not known, or no value).
Extremes = tuple[float | None, float | None]
NO_EXTREMES: Extremes = (None, None)


def widen(a: Extremes, b: Extremes) -> Extremes:
    """The extremes of two histograms' values together (each side None where unknown)."""
    lows = [v for v in (a[0], b[0]) if v is not None]
    highs = [v for v in (a[1], b[1]) if v is not None]
    return (min(lows) if lows else None, max(highs) if highs else None)


def percentile(counts: Sequence[int], q: float, extremes: Extremes = NO_EXTREMES) -> float | None:
    """The ``q`` percentile (0 < q <= 1) of a histogram, estimated by linear interpolation inside
    the bucket that holds it (as Prometheus's ``histogram_quantile`` does): the values of a bucket
    are taken as spread evenly between its bounds, so a percentile that falls a third of the way
    into a bucket's counts reads a third of the way from its lower to its upper bound. Bucket 0
    runs from 0 (lateness below zero counts as none); the open last bucket reports its lower
    bound (at least that). None for an empty histogram. An estimate: it is exact at the bounds,
    and a bucket's values all alike (every run 3.0 s) read anywhere in 2.5-5 s.

    ``extremes``: the smallest and largest value observed (kept beside the counts, per rollup
    row): the estimate is clamped to them, since no percentile lies outside the values it is
    a percentile of (a longest run of 102 s has no p99 of 3m47s; runs all of 3.0 s read 3.0 s)."""
    estimate = _interpolated(counts, q)
    if estimate is None:
        return None
    low, high = extremes
    if high is not None:
        estimate = min(estimate, high)
    if low is not None:
        estimate = max(estimate, low)
    return estimate


def _interpolated(counts: Sequence[int], q: float) -> float | None:
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for bucket, count in enumerate(counts):
        if count and seen + count >= rank:
            if bucket >= len(EDGES):
                return EDGES[-1]
            low = EDGES[bucket - 1] if bucket else 0.0
            return low + (EDGES[bucket] - low) * max(0.0, rank - seen) / count
        seen += count
    raise AssertionError("unreachable: the counts add up to total")  # pragma: no cover


def bucket_bounds(value: float) -> tuple[float, float | None]:
    """The bounds of the bucket ``value`` falls in (``None`` above the last edge)."""
    bucket = bucket_of(value)
    low = EDGES[bucket - 1] if bucket else 0.0
    return low, (EDGES[bucket] if bucket < len(EDGES) else None)
