"""The RabbitMQ queue type TMS's queues are declared with (TMS_QUEUE_TYPE), and the refusal a
declarer meets when an existing queue was declared otherwise."""

from __future__ import annotations

import re

from django.core.exceptions import ImproperlyConfigured

#: RabbitMQ's 406 to a declare whose arguments differ from the existing queue's ("inequivalent
#: arg 'x-queue-type'", "inequivalent arg 'x-max-priority'"), or that a quorum queue cannot take
#: ("invalid arg 'x-max-priority' ... of queue type rabbit_quorum_queue"). Other 406s (an ack of
#: an unknown delivery tag after a reconnect) are not about the queue's declaration.
_REFUSED_DECLARE = re.compile(r"(inequivalent|invalid) arg '([^']+)' for queue '([^']+)'")


class QueueTypeMismatch(ImproperlyConfigured):
    """An existing queue was declared with other arguments than TMS_QUEUE_TYPE gives it: every
    declare of it is refused until the setting or the queue changes, so a process stops at once
    with this message instead of retrying forever."""


def queue_type_mismatch(exc: BaseException, queue_type: str) -> QueueTypeMismatch | None:
    """The :class:`QueueTypeMismatch` that ``exc`` (a broker error) means, naming the setting and
    the way to migrate, or None when ``exc`` is not a refused declaration."""
    if getattr(exc, "reply_code", None) != 406:
        return None
    found = _REFUSED_DECLARE.search(str(exc))
    if found is None:
        return None
    argument, queue = found.group(2), found.group(3)
    other = "classic" if queue_type == "quorum" else "quorum"
    return QueueTypeMismatch(
        f"RabbitMQ refused to declare queue {queue!r} as a {queue_type} queue (TMS_QUEUE_TYPE={queue_type}): "
        f"it exists with other arguments ({argument}: {exc}). A queue keeps the type it was created with. "
        f"Either set TMS_QUEUE_TYPE={other} again, or migrate: give the new type new queue names "
        "(TMS_QUEUE, TMS_NOTIFY_QUEUE) in every process at once, or stop the monitors, let the workers "
        f"drain {queue!r}, delete it and start everything with the new setting "
        "(docs/operations.md, 'Changing the queue type')."
    )
