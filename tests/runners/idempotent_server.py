"""An executor that follows the IETF Idempotency-Key draft, on 127.0.0.1, for runner tests.

The first request with a key launches the work (counted in ``launches``) and answers when it is
done; a request with the same key while the work is still going is answered 409 Conflict
(counted in ``conflicts``); one after it is done gets the stored answer. The work goes on when the
client that sent the first request disappears (a SIGKILLed worker), as on a real server.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The stored answer for a key: (status, JSON document).
Answer = Callable[[str, "IdempotentEndpoint"], tuple[int, Any]]


def done(key: str, _endpoint: IdempotentEndpoint) -> tuple[int, Any]:
    return 200, {"result": f"done {key}"}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        endpoint = self.server.endpoint
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key", "")
        with endpoint.lock:
            endpoint.requests += 1
            stored = endpoint.results.get(key)
            busy = key in endpoint.in_progress
            if stored is None and not busy:
                endpoint.in_progress.add(key)
                endpoint.launches[key] += 1
        if stored is not None:
            return self._reply(*stored)
        if busy:
            with endpoint.lock:
                endpoint.conflicts[key] += 1
            return self._reply(endpoint.busy_status, {"error": "a request with this Idempotency-Key is in progress"})
        endpoint.stopping.wait(endpoint.work_seconds)
        answer = endpoint.answer(key, endpoint)
        with endpoint.lock:
            endpoint.results[key] = answer
            endpoint.in_progress.discard(key)
        self._reply(*answer)

    def do_GET(self) -> None:  # status URLs of async runs: always finished
        self._reply(200, {"status": "succeeded", "output": f"status of {self.path}"})

    def _reply(self, status: int, document: Any) -> None:
        data = json.dumps(document).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client is gone (killed): the result stays stored for the next request


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: IdempotentEndpoint


class IdempotentEndpoint:
    """See the module docstring. ``work_seconds``: how long the launched work takes;
    ``busy_status``: the answer while it runs (409); ``answer``: the stored answer per key."""

    def __init__(self, *, work_seconds: float, busy_status: int = 409, answer: Answer = done) -> None:
        self.work_seconds = work_seconds
        self.busy_status = busy_status
        self.answer = answer
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests = 0
        self.launches: Counter[str] = Counter()
        self.conflicts: Counter[str] = Counter()
        self.in_progress: set[str] = set()
        self.results: dict[str, tuple[int, Any]] = {}
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.endpoint = self
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def url(self, path: str = "/job") -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self) -> IdempotentEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
