"""The PENDING republish waits for the queue's backlog (executions.monitor.Backlog)."""

from __future__ import annotations

from executions.monitor import Backlog


def test_no_rate_no_backlog_keeps_the_fixed_age():
    backlog = Backlog()
    assert backlog.republish_after(120) == 120
    backlog.observe(depth=5000, published=5000, now=10.0)  # a deep queue, but no rate yet
    assert backlog.republish_after(120) == 120


def test_a_deep_queue_adds_its_drain_time():
    backlog = Backlog()
    backlog.observe(depth=5000, published=5000, now=10.0)
    # 1,000 more published, 2,000 left the queue in 10 s: 200/s, 4,000 queued = 20 s more.
    backlog.observe(depth=4000, published=6000, now=20.0)
    assert backlog.rate == 200
    assert backlog.republish_after(120) == 140


def test_an_empty_queue_and_a_stuck_estimate_are_bounded():
    backlog = Backlog()
    backlog.observe(depth=10, published=10, now=0.0)
    backlog.observe(depth=0, published=10, now=1.0)
    assert backlog.republish_after(120) == 120  # nothing queued: messages left are lost
    backlog.observe(depth=1_000_000, published=1_000_010, now=2.0)
    assert backlog.republish_after(120) == 1200  # at most ten times the base
