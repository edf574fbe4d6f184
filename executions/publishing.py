"""Publishing a batch of messages with one wait for the broker's confirms.

With ``confirm_publish`` every ``basic.publish`` waits for its own ``basic.ack``: one round
trip to RabbitMQ per message, which bounds a monitor to a few thousand messages a second on an
idle machine and far fewer on a loaded one. :func:`confirmed_batches` opens a channel of its
own in confirm mode on the producer's connection, publishes without waiting, and
:meth:`Confirms.wait` then waits once until the broker has confirmed everything published on it
(RabbitMQ acknowledges several deliveries in one ``basic.ack`` with ``multiple``). A message is
only counted as sent once confirmed, so a batch is published, or (on a nack, a timeout or a
broker error) the caller undoes it whole, as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from kombu import Producer

#: How long :meth:`Confirms.wait` waits for the broker's confirms of one batch.
CONFIRM_TIMEOUT = 30.0


class NotConfirmed(ConnectionError):
    """The broker refused (nack) or did not confirm a batch in time."""


class Confirms:
    """Tracks the delivery tags published on one confirm-mode channel and their acks. With no
    channel (a transport without confirms: the embedded default's filesystem broker), a
    publish returns once it is written and :meth:`wait` has nothing to wait for."""

    def __init__(self, channel: Any = None) -> None:
        self.channel = channel
        self.published = 0
        if channel is None:
            return
        #: Every tag up to this one is confirmed (a ``multiple`` ack), and single acks above it.
        self._upto = 0
        self._single: set[int] = set()
        self._nacked = False
        channel.confirm_select()
        # This channel was opened with the connection's confirm_publish, which makes each publish
        # wait for its ack; publish without waiting, count, and wait in wait().
        channel.basic_publish = self._publish_counted
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def _publish_counted(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("confirm_timeout", None)
        result = self.channel._basic_publish(*args, **kwargs)
        self.published += 1
        return result

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self._upto = max(self._upto, delivery_tag)
            self._single = {tag for tag in self._single if tag > self._upto}
        else:
            self._single.add(delivery_tag)
        while self._upto + 1 in self._single:
            self._upto += 1
            self._single.discard(self._upto)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._nacked = True

    def wait(self, timeout: float = CONFIRM_TIMEOUT) -> None:
        """Return once the broker has confirmed every message published so far; raise
        :class:`NotConfirmed` on a nack or after ``timeout`` seconds."""
        if self.channel is None:
            return
        deadline = time.monotonic() + timeout
        while self._upto < self.published and not self._nacked:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotConfirmed(f"{self.published - self._upto} messages not confirmed in {timeout:g}s")
            # A socket timeout here (TimeoutError) is a broker error to the caller, as a nack.
            self.channel.connection.drain_events(timeout=left)
        if self._nacked:
            raise NotConfirmed("the broker refused (nack) a message of the batch")


@contextlib.contextmanager
def confirmed_batches(producer: Producer) -> Iterator[tuple[Producer, Confirms]]:
    """A producer on a channel of its own (on ``producer``'s connection), publishing without a
    wait per message, and its :class:`Confirms`; the channel is closed afterwards."""
    if not hasattr(producer.channel, "confirm_select"):
        yield producer, Confirms()
        return
    connection = producer.connection
    assert connection is not None  # a pooled producer is bound to its connection
    channel: Any = connection.channel()
    try:
        confirms = Confirms(channel)
        yield (
            Producer(channel, exchange=producer.exchange, serializer=producer.serializer, auto_declare=False),
            confirms,
        )
    finally:
        with contextlib.suppress(Exception):  # a broken channel is closed with its connection
            channel.close()
