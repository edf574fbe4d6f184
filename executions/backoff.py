"""Exponential backoff with a cap and jitter, for retries and for polling external runs."""

from __future__ import annotations

import random


def exponential_backoff(*, attempt: int, base: float, factor: float = 2.0, cap: float, jitter: bool = True) -> float:
    """Seconds to wait before try number ``attempt + 1`` (``attempt`` starts at 1).

    ``base * factor ** (attempt - 1)``, capped at ``cap``. With ``jitter`` the delay is drawn
    uniformly from its upper half ("equal jitter"), which spreads a thundering herd but never
    retries sooner than half the nominal delay.
    """
    delay = min(cap, base * factor ** max(0, attempt - 1))
    if jitter and delay > 0:
        delay = random.uniform(delay / 2, delay)  # noqa: S311 - not cryptographic
    return max(0.0, delay)
