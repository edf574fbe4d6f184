"""A threaded HTTP server on 127.0.0.1 for emulators, with JSON helpers and request recording."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    """One request as the emulator saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def param(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, document: Any, headers: dict[str, str] | None = None) -> Response:
        return cls(status, json.dumps(document).encode(), {"Content-Type": "application/json", **(headers or {})})

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode(), {"Content-Type": "text/plain; charset=utf-8"})


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        emulator = self.server.emulator
        with emulator.lock:
            emulator.requests.append(request)
        try:
            response = emulator.handle(request)
        except Exception as exc:  # noqa: BLE001 - an emulator bug must show up as a 500, not a hang
            response = Response.text(500, f"emulator error: {exc!r}")
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, emulator: EmulatorServer) -> None:
        self.emulator = emulator
        super().__init__(("127.0.0.1", 0), _Handler)


class EmulatorServer:
    """Base class: subclasses implement :meth:`handle`. Use as a context manager."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: list[Request] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "emulator not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def handle(self, request: Request) -> Response:
        raise NotImplementedError

    def requests_matching(self, method: str, predicate: Callable[[Request], bool] = lambda _: True) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == method and predicate(r)]
