"""A local asynchronous job endpoint that keeps a ledger of launches per idempotency key.

It behaves like a well-made job API: ``POST /runs`` with an ``Idempotency-Key`` header starts a
run (or, for a key it has seen, returns the existing run) and answers ``202`` with the run's
status URL; ``GET /runs/<id>`` reports ``running`` until the run's duration has passed, then
``succeeded``; ``DELETE /runs/<id>`` cancels it. The chaos harness and the tests point the
``http`` runner (async mode) at it and read the ledger afterwards: every key must have exactly
one run, however many times TMS asked.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class LedgerRun:
    run_id: str
    key: str
    started: float
    duration: float
    cancelled: bool = False

    def status(self) -> str:
        if self.cancelled:
            return "failed"
        return "succeeded" if time.monotonic() >= self.started + self.duration else "running"


class Ledger:
    """Thread-safe record of runs and start requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: dict[str, LedgerRun] = {}
        self.by_key: dict[str, LedgerRun] = {}
        #: Runs created per key: more than one is a duplicate launch.
        self.launches: Counter[str] = Counter()
        #: Start requests per key: more than one means a start was repeated and adopted.
        self.start_requests: Counter[str] = Counter()

    def start(self, key: str, duration: float) -> tuple[LedgerRun, bool]:
        with self._lock:
            self.start_requests[key] += 1
            existing = self.by_key.get(key)
            if existing is not None:
                return existing, False
            run = LedgerRun(uuid.uuid4().hex, key, time.monotonic(), duration)
            self.runs[run.run_id] = run
            self.by_key[key] = run
            self.launches[key] += 1
            return run, True

    def get(self, run_id: str) -> LedgerRun | None:
        with self._lock:
            return self.runs.get(run_id)

    def duplicate_launches(self) -> int:
        with self._lock:
            return sum(count - 1 for count in self.launches.values() if count > 1)

    def repeated_starts(self) -> int:
        with self._lock:
            return sum(count - 1 for count in self.start_requests.values() if count > 1)


class _Handler(BaseHTTPRequestHandler):
    server: LedgerServer

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        if not key:
            self._reply(400, {"error": "Idempotency-Key header required"})
            return
        duration = float(body.get("duration", self.server.default_duration)) if isinstance(body, dict) else 0.0
        run, _ = self.server.ledger.start(key, duration)
        url = f"http://127.0.0.1:{self.server.server_port}/runs/{run.run_id}"
        self._reply(202, {"run_id": run.run_id, "status_url": url}, {"Location": url, "X-Run-Id": run.run_id})

    def _run(self) -> LedgerRun | None:
        run = self.server.ledger.get(self.path.rstrip("/").rsplit("/", 1)[-1])
        if run is None:
            self._reply(404, {"error": "no such run"})
        return run

    def do_GET(self) -> None:
        if (run := self._run()) is not None:
            status = run.status()
            self._reply(200, {"status": status, "output": f"run {run.run_id} {status}", "error": ""})

    def do_DELETE(self) -> None:
        if (run := self._run()) is not None:
            run.cancelled = True
            self._reply(200, {"status": "failed", "error": "cancelled"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LedgerServer(ThreadingHTTPServer):
    """The ledger endpoint on 127.0.0.1; ``start()`` serves it from a daemon thread."""

    daemon_threads = True

    def __init__(self, *, default_duration: float = 0.5, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.ledger = Ledger()
        self.default_duration = default_duration
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/runs"

    def start(self) -> LedgerServer:
        self._thread = threading.Thread(target=self.serve_forever, name="ledger", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
