"""The embedded default's broker: kombu's filesystem transport, with drains short enough for a
worker to see a stop at once.

A worker on a transport without an event loop (this one) runs Celery's blocking loop, which drains
for 2 seconds at a time, looks at its stop flag between drains, and drains once more after it has
seen it: an idle worker began to close its pool 2-4 seconds after SIGTERM, and on top of the pool's
own stop that left it past its shutdown grace (issue 34). Each drain here returns after at most
:data:`DRAIN_SLICE`; the loop simply starts the next one, so nothing else changes.
"""

from __future__ import annotations

from kombu import Connection
from kombu.transport import filesystem

#: Longest single drain, in seconds: how late an idle worker may see a stop.
DRAIN_SLICE = 0.25


class Transport(filesystem.Transport):
    """kombu's filesystem transport whose drains last at most :data:`DRAIN_SLICE`."""

    # The stubs of kombu type the base transport looser than the virtual one it derives (they ignore
    # it there too): the signature is the virtual transport's own.
    def drain_events(self, connection: Connection, timeout: float | None = None) -> None:  # type: ignore[override]
        # A caller that waits without a timeout keeps kombu's own wait: it may take a return for
        # a delivery. A caller with a timeout is told of it sooner, and loops (Celery's does).
        super().drain_events(connection, timeout=timeout if timeout is None else min(timeout, DRAIN_SLICE))
