"""After a pass fails on the database (a PostgreSQL failover: the primary gone, libpq finding the
promoted standby a second or two later) the monitor retries at once, then in short steps, not
after 1, 2 and 4 s: that backoff added about 3 s to the resume time of a failover (issue 45)."""

from __future__ import annotations

from django.db import OperationalError

from executions import monitor as monitor_module
from executions.monitor import Monitor


def _delays_after(failures: int, exc: Exception, monkeypatch) -> list[float]:
    monitor = Monitor(publish=lambda *a, **k: None, publish_many=lambda *a, **k: None)
    delays: list[float] = []
    calls = iter(range(failures + 1))

    def dispatch_once(*, housekeeping: bool):
        if next(calls) < failures:
            raise exc
        monitor.stop()
        return 0, None

    monkeypatch.setattr(monitor, "dispatch_once", dispatch_once)
    monkeypatch.setattr(monitor, "_sleep", delays.append)
    monkeypatch.setattr(monitor_module, "close_old_connections", lambda: None)
    monitor.run()
    return delays


def test_the_first_retry_after_a_database_error_is_immediate_and_the_next_ones_short(monkeypatch):
    delays = _delays_after(6, OperationalError("server closed the connection unexpectedly"), monkeypatch)
    assert delays[0] == 0.0
    # A failover takes 2-4 s: the monitor looks again at least every half second until then,
    # and never waits more than a second between looks however long the database is away.
    assert sum(delays[:4]) <= 1.0
    assert max(delays) <= monitor_module.DATABASE_ERROR_RETRY_MAX == 1.0
    assert delays == sorted(delays)


def test_a_broker_error_keeps_its_backoff(monkeypatch):
    delays = _delays_after(3, ConnectionRefusedError("broker down"), monkeypatch)
    assert delays == [1.0, 2.0, 4.0]
