"""A real local webhook receiver (an HTTP server thread) that records every request, checks
signatures and dedupes by Idempotency-Key the way a receiver of TMS notifications should."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Arrival:
    key: str
    headers: dict[str, str]
    body: bytes

    @property
    def payload(self) -> Any:
        return json.loads(self.body)

    def signature_valid(self, secret: str) -> bool:
        expected = hmac.new(
            secret.encode(), self.headers["X-TMS-Timestamp"].encode() + b"." + self.body, hashlib.sha256
        ).hexdigest()
        return hmac.compare_digest(expected, self.headers.get("X-TMS-Signature", ""))


@dataclass
class Receiver:
    url: str = ""
    arrivals: list[Arrival] = field(default_factory=list)
    #: Payloads accepted once per Idempotency-Key (what a deduping receiver acts on).
    accepted: dict[str, Any] = field(default_factory=dict)
    #: While set, the very first request is held open until ``release`` is set.
    hold_first: bool = False
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    status: int = 200
    #: Seconds each answer waits (a slow target).
    delay: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def events(self) -> list[str]:
        with self.lock:
            return [payload["event"] for payload in self.accepted.values()]


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key", "")
            with receiver.lock:
                first = not receiver.arrivals
                receiver.arrivals.append(Arrival(key, dict(self.headers.items()), body))
            if receiver.hold_first and first:
                receiver.held.set()
                receiver.release.wait(60)  # the sender is killed meanwhile; this answer goes nowhere
                return
            if receiver.delay:
                time.sleep(receiver.delay)
            with receiver.lock:
                if key not in receiver.accepted:
                    receiver.accepted[key] = json.loads(body)
            self.send_response(receiver.status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()


def deliver_queued() -> list[str]:
    """Send the queued test deliveries here, as the notification queue's sender would (what
    ``notify_deliver`` runs): a test without a notify worker (and whose transaction never
    commits, so nothing was published) sends them this way. Answers each outcome."""
    from notifications import dispatch
    from notifications.models import Delivery, DeliveryStatus

    queued = Delivery.objects.filter(status=DeliveryStatus.PENDING, event="test").exclude(lease_token="")
    return [dispatch.deliver(pk, token) for pk, token in queued.order_by("id").values_list("pk", "lease_token")]


class ExplodingBackend:
    """A Django e-mail backend whose sends raise ``EXPLODE`` (a class attribute a test sets):
    what a broken backend, or a header Django refuses, does to a sender."""

    EXPLODE: type[Exception] = RuntimeError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def send_messages(self, messages: Any) -> int:
        raise self.EXPLODE("the backend exploded")
