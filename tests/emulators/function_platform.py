"""An emulation of an asynchronous HTTP function platform (OpenFaaS-async / Knative-job style).

Protocol::

    POST   /async-function/{name}   body: JSON payload, header Idempotency-Key (required)
           -> 202 {"run_id", "status_url"} (+ Location); the same key returns the same run
    GET    /runs/{run_id}           -> 200 {"run_id", "status": queued|running|succeeded|failed|cancelled,
                                            "output", "error"}
    DELETE /runs/{run_id}           -> 202 {"run_id", "status": "cancelled"}; the handler is told to stop

Functions are Python callables ``handler(payload, run)`` run in a thread; ``run.sleep(seconds)``
returns early (raising :class:`Cancelled`) when the run is cancelled or the platform stops.
``launches`` counts handler starts per function: the launch count tests assert on.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.emulators.base import EmulatorServer, Request, Response


class Cancelled(Exception):
    """Raised by :meth:`Run.sleep` when the run was cancelled."""


@dataclass
class Run:
    run_id: str
    function: str
    key: str
    payload: Any
    headers: dict[str, str]
    status: str = "queued"
    output: Any = None
    error: str | None = None
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def sleep(self, seconds: float) -> None:
        if self.cancel_requested.wait(seconds):
            raise Cancelled

    def document(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "output": self.output, "error": self.error}


Handler = Callable[[Any, Run], Any]


class FunctionPlatformEmulator(EmulatorServer):
    """The platform on 127.0.0.1; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: dict[str, Handler] = {}
        self.runs: dict[str, Run] = {}
        self.by_key: dict[tuple[str, str], Run] = {}
        self.launches: Counter[str] = Counter()
        self.deletes: list[str] = []
        self._faults: deque[tuple[str, int]] = deque()
        #: Overrides the status URL the platform returns (tests of the runner's URL checks).
        self.status_url_override: str | None = None

    def register(self, name: str, handler: Handler) -> None:
        with self.lock:
            self.functions[name] = handler

    def fail_next(self, method: str, status: int) -> None:
        with self.lock:
            self._faults.append((method.upper(), status))

    def stop(self) -> None:
        for run in list(self.runs.values()):
            run.cancel_requested.set()
        super().stop()

    def function_url(self, name: str) -> str:
        return f"{self.url}/async-function/{name}"

    def handle(self, request: Request) -> Response:
        with self.lock:
            for index, (method, status) in enumerate(self._faults):
                if method == request.method:
                    del self._faults[index]
                    return Response.json(status, {"error": f"injected failure ({status})"})
        parts = request.path.strip("/").split("/")
        if request.method == "POST" and len(parts) == 2 and parts[0] == "async-function":
            return self._invoke(parts[1], request)
        if len(parts) == 2 and parts[0] == "runs":
            with self.lock:
                run = self.runs.get(parts[1])
            if run is None:
                return Response.json(404, {"error": "no such run"})
            if request.method == "GET":
                return Response.json(200, run.document())
            if request.method == "DELETE":
                with self.lock:
                    self.deletes.append(run.run_id)
                    if run.status in ("queued", "running"):
                        run.status = "cancelled"
                run.cancel_requested.set()
                return Response.json(202, {"run_id": run.run_id, "status": run.status})
        return Response.json(404, {"error": "not found"})

    def _invoke(self, name: str, request: Request) -> Response:
        key = request.header("idempotency-key")
        if not key:
            return Response.json(400, {"error": "Idempotency-Key header is required"})
        with self.lock:
            handler = self.functions.get(name)
            if handler is None:
                return Response.json(404, {"error": f"function {name!r} not found"})
            run = self.by_key.get((name, key))
            if run is None:
                run = Run(uuid.uuid4().hex, name, key, request.json(), dict(request.headers))
                self.runs[run.run_id] = run
                self.by_key[(name, key)] = run
                self.launches[name] += 1
                threading.Thread(target=self._execute, args=(handler, run), daemon=True).start()
        status_url = self.status_url_override or f"/runs/{run.run_id}"
        return Response.json(202, {"run_id": run.run_id, "status_url": status_url}, {"Location": status_url})

    def _execute(self, handler: Handler, run: Run) -> None:
        with self.lock:
            if run.status == "queued":
                run.status = "running"
        try:
            output = handler(run.payload, run)
        except Cancelled:
            with self.lock:
                run.status = "cancelled"
        except Exception as exc:  # noqa: BLE001 - a failing function is a failed run
            with self.lock:
                if run.status == "running":
                    run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            with self.lock:
                if run.status == "running":
                    run.status, run.output = "succeeded", output
        finally:
            run.finished.set()
