"""The http runner against real HTTP servers on 127.0.0.1 (no database needed).

Rules kept by every test: traffic only ever goes to 127.0.0.1 (a socket-level spy fails any other
connect), sleeping handlers wake up when the server stops, and timeouts are well under a second.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import django
import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunHandle, RunSpec, RunState
from runners.http import HttpRunner

if not apps.ready:
    # Without pytest-django (``-p no:django``) nobody sets Django up; validation messages need it.
    django.setup()

LOOPBACK = ["127.0.0.1/32"]


# --------------------------------------------------------------------------------------------
# A small recording HTTP server
# --------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Route = Callable[["_Handler", Recorded], None]


class _Handler(BaseHTTPRequestHandler):
    server: _OwnedServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        recorded = Recorded(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=self.rfile.read(length),
        )
        with owner.lock:
            owner.requests.append(recorded)
        route = owner.routes.get(urlsplit(self.path).path)
        if route is None:
            self.reply(404, b"no such route")
        else:
            route(self, recorded)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    def reply(self, status: int, body: bytes | str = b"", headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def reply_json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        self.reply(status, json.dumps(document), {"Content-Type": "application/json", **(headers or {})})


class _OwnedServer(ThreadingHTTPServer):
    owner: TestServer


class TestServer:
    """ThreadingHTTPServer on 127.0.0.1:0 that records every request and serves per-path routes."""

    __test__ = False  # not a test class, whatever its name says

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = _OwnedServer(("127.0.0.1", 0), _Handler)
        self.httpd.owner = self
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.scheme = "https" if ssl_context else "http"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def route(self, path: str, handler: Route | None = None, **reply: Any) -> None:
        """Serve ``path`` with ``handler``, or with a fixed ``reply(status=..., body=..., headers=...)``."""
        self.routes[path] = handler or (lambda h, _r: h.reply(**reply))

    def to(self, path: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if urlsplit(r.path).path == path]

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[TestServer]:
    srv = TestServer()
    yield srv
    srv.stop()


@pytest.fixture
def other_server() -> Iterator[TestServer]:
    srv = TestServer()
    yield srv
    srv.stop()


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address a socket connects to; a connect to anything but loopback fails without traffic."""
    seen: list[str] = []
    real_connect = socket.socket.connect

    def spy(self: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        seen.append(host)
        if host not in ("127.0.0.1", "::1"):
            raise OSError(errno.ENETUNREACH, "the test suite forbids traffic to non-loopback addresses")
        real_connect(self, address)

    def forbidden(self: socket.socket, address: Any) -> int:
        raise AssertionError("connect_ex is not expected")

    monkeypatch.setattr(socket.socket, "connect", spy)
    monkeypatch.setattr(socket.socket, "connect_ex", forbidden)
    return seen


@dataclass
class FakeDns:
    """Names under ``.test`` resolve to the answers queued for them, one list per lookup."""

    answers: dict[str, list[list[str]]]
    lookups: list[str]


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> FakeDns:
    dns = FakeDns(answers={}, lookups=[])
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:
        if not (isinstance(host, str) and host.endswith(".test")):
            return real_getaddrinfo(host, port, family, type, proto, flags)
        dns.lookups.append(host)
        queue = dns.answers[host]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        result = []
        for address in addresses:
            if ipaddress.ip_address(address).version == 4:
                result.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port))))
            else:
                result.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, int(port), 0, 0)))
        return result

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return dns


def runner(**options: Any) -> HttpRunner:
    return HttpRunner("http", {"allowed_networks": LOOPBACK, **options})


def spec(
    http: HttpRunner,
    config: dict[str, Any],
    *,
    timeout: float = 5.0,
    attempt: int = 1,
    callback_url: str | None = None,
    validate: bool = True,
) -> RunSpec:
    return RunSpec(
        execution_id=42,
        attempt=attempt,
        task_id="task-1",
        config=http.validate_config(config) if validate else config,
        timeout=timeout,
        callback_url=callback_url,
    )


# --------------------------------------------------------------------------------------------
# Synchronous requests
# --------------------------------------------------------------------------------------------


def test_get_ping_succeeds_with_the_body_as_output(server: TestServer) -> None:
    server.route("/ping", status=200, body="pong")
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/ping")}))

    assert handle.result is not None
    assert handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == "pong"
    assert handle.external_run_id == "tms-42-1"
    [request] = server.to("/ping")
    assert request.method == "GET"
    assert request.body == b""


def test_post_json_arrives_as_sent_with_custom_headers(server: TestServer) -> None:
    server.route("/hook", status=201, body="created")
    http = runner()
    document = {"event": "nightly", "items": [1, 2.5, None, True], "name": "café"}

    handle = http.start(spec(http, {"url": server.url("/hook"), "json": document, "headers": {"X-Token": "s3cret"}}))

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    [request] = server.to("/hook")
    assert request.method == "POST"  # the default once a body is given
    assert request.json() == document
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-token"] == "s3cret"


def test_raw_body_and_headers_arrive_as_sent(server: TestServer) -> None:
    server.route("/upload", status=204)
    http = runner()
    body = "id;name\n1;héllo ✓\n"

    handle = http.start(
        spec(
            http,
            {
                "url": server.url("/upload?batch=7"),
                "method": "put",
                "body": body,
                "headers": {"Content-Type": "text/csv; charset=utf-8", "User-Agent": "nightly-export"},
            },
        )
    )

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    [request] = server.to("/upload")
    assert request.method == "PUT"
    assert request.path == "/upload?batch=7"
    assert request.body == body.encode()
    assert request.headers["content-type"] == "text/csv; charset=utf-8"
    assert request.headers["user-agent"] == "nightly-export"


def test_slack_style_incoming_webhook_is_a_plain_json_post(server: TestServer) -> None:
    server.route("/services/T000/B000/XXXX", status=200, body="ok")
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/services/T000/B000/XXXX"), "json": {"text": "Backup done"}}))

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == "ok"
    [request] = server.to("/services/T000/B000/XXXX")
    assert (request.method, request.json()) == ("POST", {"text": "Backup done"})


def test_every_request_carries_the_idempotency_key_and_callback_url(server: TestServer) -> None:
    server.route("/ping", status=200)
    http = runner(user_agent="TMS-test/1")
    run = spec(http, {"url": server.url("/ping")}, attempt=3, callback_url="https://tms.example/cb/42")

    http.start(run)

    [request] = server.to("/ping")
    assert request.headers["idempotency-key"] == run.idempotency_key == "tms-42-3"
    assert request.headers["x-tms-callback-url"] == "https://tms.example/cb/42"
    assert request.headers["user-agent"] == "TMS-test/1"


def test_head_request_succeeds_without_a_body(server: TestServer) -> None:
    server.route("/health", status=200, body="not sent for HEAD")
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/health"), "method": "HEAD"}))

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    assert server.to("/health")[0].method == "HEAD"


def test_expected_status_makes_a_404_a_success(server: TestServer) -> None:
    server.route("/gone", status=404, body="nothing here")
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/gone"), "expected_status": [404, 410]}))

    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED


def test_a_2xx_outside_expected_status_fails_without_retry(server: TestServer) -> None:
    server.route("/made", status=200, body="already there")
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/made"), "method": "POST", "expected_status": [201]}))

    assert handle.result is not None and handle.result.state is RunState.FAILED
    assert handle.result.retryable is False
    assert "HTTP 200" in handle.result.error


def test_server_error_fails_retryable_with_status_and_excerpt(server: TestServer) -> None:
    server.route("/boom", status=500, body="database   down\nplease retry")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/boom")})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is True
    assert "HTTP 500 Internal Server Error" in result.error
    assert "database down please retry" in result.error
    assert result.output == "database   down\nplease retry"


def test_too_many_requests_is_retryable(server: TestServer) -> None:
    server.route("/busy", status=429, body="slow down", headers={"Retry-After": "1"})
    http = runner()

    result = http.start(spec(http, {"url": server.url("/busy")})).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is True


def test_not_found_fails_without_retry(server: TestServer) -> None:
    http = runner()

    result = http.start(spec(http, {"url": server.url("/missing")})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is False
    assert "HTTP 404" in result.error
    assert "no such route" in result.error


def test_error_messages_never_quote_the_url_path(server: TestServer) -> None:
    server.route("/services/T1/B2/secret-token", status=500, body="")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/services/T1/B2/secret-token")})).result

    assert result is not None and "secret-token" not in result.error
    assert f"127.0.0.1:{server.port}" in result.error


def test_response_body_is_capped_by_the_option_and_by_the_task(server: TestServer) -> None:
    server.route("/big", status=200, body="x" * 5000)

    by_option = runner(max_response_bytes=100)
    result = by_option.start(spec(by_option, {"url": server.url("/big")})).result
    assert result is not None and result.state is RunState.SUCCEEDED
    assert result.output.startswith("x" * 100)
    assert "x" * 101 not in result.output
    assert "truncated" in result.output

    by_task = runner(max_response_bytes=100)
    result = by_task.start(spec(by_task, {"url": server.url("/big"), "max_response_bytes": 10})).result
    assert result is not None
    assert result.output.startswith("x" * 10)
    assert "x" * 11 not in result.output


def test_truncation_never_splits_a_utf8_character(server: TestServer) -> None:
    server.route("/accents", status=200, body="é" * 100)  # 200 bytes
    http = runner()

    result = http.start(spec(http, {"url": server.url("/accents"), "max_response_bytes": 51})).result

    assert result is not None
    assert result.output.startswith("é" * 25)
    assert "\ufffd" not in result.output


def test_invalid_utf8_is_replaced_not_fatal(server: TestServer) -> None:
    server.route("/binary", status=200, body=b"ok \xff\xfe end")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/binary")})).result

    assert result is not None and result.output == "ok \ufffd\ufffd end"


def test_slow_server_times_out_retryable_within_the_timeout(server: TestServer) -> None:
    server.route("/slow", lambda h, _r: (server.stopping.wait(5), h.reply(200, "late")))
    http = runner()

    started = time.monotonic()
    result = http.start(spec(http, {"url": server.url("/slow"), "timeout": "300ms"})).result
    elapsed = time.monotonic() - started

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is True
    assert "timed out after 0.3s" in result.error
    assert elapsed < 1.5


def test_task_timeout_caps_the_request_timeout(server: TestServer) -> None:
    server.route("/slow", lambda h, _r: (server.stopping.wait(5), h.reply(200, "late")))
    http = runner()

    started = time.monotonic()
    result = http.start(spec(http, {"url": server.url("/slow"), "timeout": "1h"}, timeout=0.3)).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is True
    assert time.monotonic() - started < 1.5


def _trickle_headers(server: TestServer) -> Route:
    def handler(h: _Handler, _r: Recorded) -> None:
        h.wfile.write(b"HTTP/1.0 200 OK\r\n")
        deadline = time.monotonic() + 5
        try:
            while time.monotonic() < deadline and not server.stopping.wait(0.05):
                h.wfile.write(b"X-Drip: .\r\n")
                h.wfile.flush()
        except OSError:
            pass  # the runner hung up, as it should

    return handler


def test_server_trickling_bytes_is_cut_off_at_the_deadline(server: TestServer) -> None:
    # Each read gets a byte well within the socket timeout: only the overall deadline stops it.
    server.route("/drip", _trickle_headers(server))
    http = runner()

    started = time.monotonic()
    result = http.start(spec(http, {"url": server.url("/drip"), "timeout": "400ms"})).result
    elapsed = time.monotonic() - started

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is True
    assert "timed out" in result.error
    assert elapsed < 1.5


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = runner()

    result = http.start(spec(http, {"url": f"http://127.0.0.1:{port}/"})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is True
    assert "Connection refused" in result.error


def test_external_run_id_comes_from_x_request_id(server: TestServer) -> None:
    server.route("/run", status=200, headers={"X-Request-Id": "req-981"})
    http = runner()

    handle = http.start(spec(http, {"url": server.url("/run")}))

    assert handle.external_run_id == "req-981"


def test_repeated_start_with_the_same_key_launches_once(server: TestServer) -> None:
    launches: dict[str, str] = {}

    def launch(h: _Handler, r: Recorded) -> None:
        key = r.headers["idempotency-key"]
        with server.lock:
            run_id = launches.setdefault(key, f"run-{len(launches) + 1}")
        h.reply_json(200, {"run": run_id}, {"X-Request-Id": run_id})

    server.route("/launch", launch)
    http = runner()
    run = spec(http, {"url": server.url("/launch"), "json": {"job": "report"}})

    first = http.start(run)
    again = http.start(run)  # a redelivered message, or a resumed execution

    assert len(server.to("/launch")) == 2
    assert launches == {"tms-42-1": "run-1"}
    assert first.external_run_id == again.external_run_id == "run-1"

    http.start(spec(http, {"url": server.url("/launch"), "json": {"job": "report"}}, attempt=2))
    assert len(launches) == 2  # a new attempt is a new run


# --------------------------------------------------------------------------------------------
# Redirects
# --------------------------------------------------------------------------------------------


def test_redirect_is_followed_and_a_303_turns_post_into_get(server: TestServer) -> None:
    server.route("/submit", status=303, headers={"Location": "/result"})
    server.route("/result", status=200, body="done")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/submit"), "json": {"a": 1}})).result

    assert result is not None and result.state is RunState.SUCCEEDED and result.output == "done"
    [final] = server.to("/result")
    assert final.method == "GET"
    assert final.body == b""
    assert final.headers["idempotency-key"] == "tms-42-1"


def test_307_redirect_keeps_method_and_body(server: TestServer) -> None:
    server.route("/old", status=307, headers={"Location": server.url("/new")})
    server.route("/new", status=200)
    http = runner()

    http.start(spec(http, {"url": server.url("/old"), "method": "PUT", "body": "payload"}))

    [final] = server.to("/new")
    assert (final.method, final.body) == ("PUT", b"payload")


def test_redirect_to_another_origin_drops_every_header_meant_for_the_task_origin(
    server: TestServer, other_server: TestServer
) -> None:
    # A 303 turns the POST into a GET: nothing the task configured survives the hop.
    server.route("/start", status=303, headers={"Location": other_server.url("/elsewhere")})
    other_server.route("/elsewhere", status=200)
    http = runner(user_agent="TMS-test/1")
    secrets = {"Authorization": "Bearer t", "X-Api-Key": "k-123", "Private-Token": "p-456", "X-Keep": "1"}
    run = spec(
        http,
        {"url": server.url("/start"), "method": "POST", "json": {"a": 1}, "headers": secrets},
        callback_url="https://tms.example/cb/42",
    )

    result = http.start(run).result

    assert result is not None and result.state is RunState.SUCCEEDED
    [first] = server.to("/start")
    assert first.headers["x-api-key"] == "k-123" and first.headers["private-token"] == "p-456"
    assert first.headers["x-tms-callback-url"] == "https://tms.example/cb/42"
    [moved] = other_server.to("/elsewhere")
    assert (moved.method, moved.body) == ("GET", b"")
    for name in ("authorization", "x-api-key", "private-token", "x-keep", "x-tms-callback-url", "idempotency-key"):
        assert name not in moved.headers, name
    assert moved.headers["user-agent"] == "TMS-test/1"


@pytest.mark.parametrize(
    ("status", "method"), [(307, "POST"), (308, "POST"), (308, "PUT"), (301, "PUT"), (302, "PATCH")]
)
def test_a_redirect_to_another_origin_never_sends_the_body_again(
    server: TestServer, other_server: TestServer, status: int, method: str
) -> None:
    """Issue 27, finding 9: a secret JSON field reached the other origin."""
    server.route("/start", status=status, headers={"Location": other_server.url("/elsewhere")})
    other_server.route("/elsewhere", status=200)
    http = runner()
    run = spec(http, {"url": server.url("/start"), "method": method, "json": {"token": "s3cr3t-field"}})

    result = http.start(run).result

    assert result is not None and result.state is RunState.FAILED and not result.retryable
    assert f"not following the {status} redirect" in result.error and "another origin" in result.error
    assert [first.json() for first in server.to("/start")] == [{"token": "s3cr3t-field"}]
    assert other_server.to("/elsewhere") == []


def test_headers_dropped_on_leaving_the_origin_stay_dropped_when_a_hop_comes_back(
    server: TestServer, other_server: TestServer
) -> None:
    server.route("/start", status=302, headers={"Location": other_server.url("/bounce")})
    other_server.route("/bounce", status=302, headers={"Location": server.url("/back")})
    server.route("/back", status=200)
    http = runner()

    http.start(spec(http, {"url": server.url("/start"), "headers": {"X-Api-Key": "k-123"}}))

    [back] = server.to("/back")
    assert "x-api-key" not in back.headers


def test_same_origin_redirect_keeps_the_task_headers(server: TestServer) -> None:
    server.route("/start", status=302, headers={"Location": "/next"})
    server.route("/next", status=200)
    http = runner()

    http.start(
        spec(http, {"url": server.url("/start"), "headers": {"X-Api-Key": "k-123"}}, callback_url="https://t/cb")
    )

    [moved] = server.to("/next")
    assert moved.headers["x-api-key"] == "k-123"
    assert moved.headers["x-tms-callback-url"] == "https://t/cb"
    assert moved.headers["idempotency-key"] == "tms-42-1"


def test_a_status_url_on_another_origin_gets_no_task_header_nor_callback(
    server: TestServer, other_server: TestServer
) -> None:
    other_server.route("/jobs/7", lambda h, _r: h.reply_json(200, {"status": "succeeded"}))
    http = runner()
    run = spec(
        http,
        {"url": server.url("/jobs"), "async": True, "headers": {"X-Api-Key": "k-123"}},
        callback_url="https://tms.example/cb/42",
    )

    http.poll(run, RunHandle("job-7", {"status_url": other_server.url("/jobs/7")}))

    [poll] = other_server.to("/jobs/7")
    assert "x-api-key" not in poll.headers
    assert "x-tms-callback-url" not in poll.headers


def test_redirect_loop_stops_at_max_redirects_without_retry(server: TestServer) -> None:
    server.route("/loop", status=302, headers={"Location": "/loop"})
    http = runner(max_redirects=3)

    result = http.start(spec(http, {"url": server.url("/loop")})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is False
    assert "too many redirects" in result.error
    assert len(server.to("/loop")) == 4


def test_redirect_not_followed_when_disabled(server: TestServer) -> None:
    server.route("/moved", status=301, headers={"Location": "/new"})
    http = runner()

    result = http.start(spec(http, {"url": server.url("/moved"), "follow_redirects": False})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is False
    assert "HTTP 301" in result.error
    assert server.to("/new") == []


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://[::1]:{port}/", "::1 is a loopback address"),
        ("http://10.0.0.1/admin", "10.0.0.1 is a private address"),
    ],
)
def test_redirect_to_a_blocked_address_is_refused_before_connecting(
    server: TestServer, connects: list[str], location: str, reason: str
) -> None:
    # 127.0.0.1 is opened for the test servers; the redirect target is not.
    server.route("/jump", status=302, headers={"Location": location.format(port=server.port)})
    http = runner()

    result = http.start(spec(http, {"url": server.url("/jump")})).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is False
    assert result.error == f"refused: {reason}"
    assert connects == ["127.0.0.1"]  # the first hop only


def test_redirect_to_a_non_http_scheme_is_refused(server: TestServer) -> None:
    server.route("/jump", status=302, headers={"Location": "file:///etc/passwd"})
    http = runner()

    result = http.start(spec(http, {"url": server.url("/jump")})).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is False
    assert "Only http and https" in result.error


# --------------------------------------------------------------------------------------------
# SSRF guard
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:{port}/", "127.0.0.1 is a loopback address"),
        ("http://10.0.0.1/", "10.0.0.1 is a private address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://[::1]:{port}/", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]:{port}/", "::ffff:7f00:1 is an IPv4-mapped loopback address (127.0.0.1)"),
        ("http://[::ffff:169.254.169.254]/", "is an IPv4-mapped cloud metadata address (169.254.169.254)"),
        ("http://[fd00:ec2::254]/", "fd00:ec2::254 is a cloud metadata address"),
        ("http://0.0.0.0:{port}/", "0.0.0.0 is an unspecified address"),
        ("http://2130706433:{port}/", "127.0.0.1 is a loopback address"),  # 127.0.0.1 as one number
    ],
)
def test_blocked_addresses_are_refused_without_traffic(
    server: TestServer, connects: list[str], url: str, reason: str
) -> None:
    server.route("/", status=200)
    http = HttpRunner("http", {})  # no allowed networks
    run = spec(http, {"url": url.format(port=server.port), "method": "GET"}, validate=False)

    result = http.start(run).result

    assert result is not None and result.state is RunState.FAILED
    assert result.retryable is False
    assert result.error.startswith("refused: ")
    assert reason in result.error
    assert connects == []
    assert server.requests == []


def test_a_name_resolving_to_loopback_is_refused(server: TestServer, connects: list[str]) -> None:
    server.route("/", status=200)
    http = HttpRunner("http", {})

    result = http.start(spec(http, {"url": server.url("/", host="localhost")}, validate=False)).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is False
    assert "is a loopback address (resolved from localhost)" in result.error
    assert connects == []
    assert server.requests == []


def test_a_name_resolving_to_a_private_address_is_refused(connects: list[str], fake_dns: FakeDns) -> None:
    fake_dns.answers["intranet.test"] = [["10.20.30.40"]]
    http = HttpRunner("http", {})

    result = http.start(spec(http, {"url": "https://intranet.test/admin"})).result

    assert (
        result is not None and result.error == "refused: 10.20.30.40 is a private address (resolved from intranet.test)"
    )
    assert connects == []


def test_the_checked_address_is_the_connected_one(server: TestServer, connects: list[str], fake_dns: FakeDns) -> None:
    # DNS rebinding: a second lookup would answer 10.0.0.1. The runner resolves once, checks that
    # answer and connects to it, so the second answer is never used.
    server.route("/", status=200, body="hello")
    fake_dns.answers["rebind.test"] = [["127.0.0.1"], ["10.0.0.1"]]
    http = runner()

    result = http.start(spec(http, {"url": server.url("/", host="rebind.test")})).result

    assert result is not None and result.state is RunState.SUCCEEDED
    assert connects == ["127.0.0.1"]
    assert fake_dns.lookups == ["rebind.test"]  # one lookup: the second answer is never asked for
    assert server.requests[0].headers["host"] == f"rebind.test:{server.port}"


def test_only_allowed_addresses_of_a_name_are_tried(server: TestServer, connects: list[str], fake_dns: FakeDns) -> None:
    server.route("/", status=200)
    fake_dns.answers["mixed.test"] = [["10.0.0.1", "169.254.169.254", "127.0.0.1"]]
    http = runner()

    result = http.start(spec(http, {"url": server.url("/", host="mixed.test")})).result

    assert result is not None and result.state is RunState.SUCCEEDED
    assert connects == ["127.0.0.1"]


def test_allowed_host_name_opens_it_whatever_it_resolves_to(server: TestServer, connects: list[str]) -> None:
    server.route("/", status=200, body="local")
    http = HttpRunner("http", {"allowed_networks": ["localhost"]})

    result = http.start(spec(http, {"url": server.url("/", host="localhost")})).result

    assert result is not None and result.state is RunState.SUCCEEDED and result.output == "local"


def test_poll_applies_the_same_guard(connects: list[str]) -> None:
    http = HttpRunner("http", {})
    run = spec(http, {"url": "https://api.example.com/jobs", "async": True})

    result = http.poll(run, RunHandle("run-1", {"status_url": "http://169.254.169.254/latest/"}))

    assert result.state is RunState.FAILED and result.retryable is False
    assert "169.254.169.254 is a cloud metadata address" in result.error
    assert connects == []


# --------------------------------------------------------------------------------------------
# TLS over the guarded socket
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = str(directory / "cert.pem"), str(directory / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-days", "1",
         "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


def test_tls_sends_the_url_host_as_sni_and_verifies_the_certificate(self_signed: tuple[str, str]) -> None:
    names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*self_signed)
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)
    tls_server = TestServer(ssl_context=context)
    try:
        tls_server.route("/", status=200)
        http = HttpRunner("http", {"allowed_networks": ["localhost"]})

        result = http.start(spec(http, {"url": tls_server.url("/", host="localhost")})).result
    finally:
        tls_server.stop()

    assert names and set(names) == {"localhost"}
    # The certificate is self-signed: verification is on, so the handshake is rejected.
    assert result is not None and result.state is RunState.FAILED
    assert "TLS error" in result.error and "certificate verify failed" in result.error
    assert tls_server.requests == []


# --------------------------------------------------------------------------------------------
# Async mode
# --------------------------------------------------------------------------------------------


def _async_job(server: TestServer, documents: list[dict[str, Any]], *, accept: Route | None = None) -> None:
    def status(h: _Handler, r: Recorded) -> None:
        if r.method == "DELETE":
            h.reply(204)
            return
        with server.lock:
            document = documents.pop(0) if len(documents) > 1 else documents[0]
        h.reply_json(200, document)

    server.route("/jobs", accept or (lambda h, _r: h.reply_json(202, {"id": "job-7"}, {"Location": "/jobs/7"})))
    server.route("/jobs/7", status)


def test_async_start_returns_the_status_url_and_polls_until_succeeded(server: TestServer) -> None:
    _async_job(server, [{"status": "running"}, {"status": "running"}, {"status": "succeeded", "output": {"rows": 3}}])
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "json": {"report": "daily"}, "async": True})

    handle = http.start(run)

    assert handle.result is None
    assert handle.external_run_id == "job-7"
    assert handle.data == {"status_url": server.url("/jobs/7")}
    json.dumps(handle.data)  # stored as JSON by the worker
    assert http.poll(run, handle).state is RunState.RUNNING
    assert http.poll(run, handle).state is RunState.RUNNING
    final = http.poll(run, handle)
    assert final.state is RunState.SUCCEEDED
    assert json.loads(final.output) == {"rows": 3}
    polls = server.to("/jobs/7")
    assert [p.method for p in polls] == ["GET", "GET", "GET"]
    assert {p.headers["idempotency-key"] for p in polls} == {"tms-42-1"}
    assert len(server.to("/jobs")) == 1


def test_async_status_url_from_a_json_field_and_a_failed_run(server: TestServer) -> None:
    accept = lambda h, _r: h.reply_json(202, {"status_url": server.url("/jobs/7")})  # noqa: E731
    _async_job(server, [{"status": "failed", "error": "disk full", "output": "wrote 3 of 9"}], accept=accept)
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True, "method": "POST"})

    handle = http.start(run)
    result = http.poll(run, handle)

    assert handle.data == {"status_url": server.url("/jobs/7")}
    assert handle.external_run_id == "tms-42-1"
    assert result.state is RunState.FAILED
    assert result.error == "disk full"
    assert result.output == "wrote 3 of 9"
    assert result.retryable is True


def test_async_start_without_a_status_url_fails_without_retry(server: TestServer) -> None:
    server.route("/jobs", status=202, body="accepted")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/jobs"), "async": True, "method": "POST"})).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is False
    assert "without a status URL" in result.error


def test_async_start_rejected_by_the_endpoint_fails(server: TestServer) -> None:
    server.route("/jobs", status=503, body="maintenance")
    http = runner()

    result = http.start(spec(http, {"url": server.url("/jobs"), "async": True, "method": "POST"})).result

    assert result is not None and result.state is RunState.FAILED and result.retryable is True


def test_poll_treats_a_transient_status_error_as_still_running(server: TestServer) -> None:
    server.route("/jobs/7", status=502, body="bad gateway")
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True})

    result = http.poll(run, RunHandle("job-7", {"status_url": server.url("/jobs/7")}))

    assert result.state is RunState.RUNNING


def test_poll_rejects_a_body_that_is_not_a_status_document(server: TestServer) -> None:
    server.route("/jobs/7", status=200, body="<html>login</html>")
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True})

    result = http.poll(run, RunHandle("job-7", {"status_url": server.url("/jobs/7")}))

    assert result.state is RunState.FAILED and result.retryable is False
    assert "status document" in result.error


def test_cancel_sends_delete_to_the_status_url(server: TestServer) -> None:
    _async_job(server, [{"status": "running"}])
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True, "headers": {"Authorization": "Bearer t"}})
    handle = http.start(run)

    http.cancel(run, handle)

    [delete] = [r for r in server.to("/jobs/7") if r.method == "DELETE"]
    assert delete.headers["idempotency-key"] == "tms-42-1"
    assert delete.headers["authorization"] == "Bearer t"  # same origin as the task URL
    assert HttpRunner.supports_cancel is True


def test_cancel_is_best_effort_when_the_endpoint_is_down() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = runner()
    run = spec(http, {"url": f"http://127.0.0.1:{port}/jobs", "async": True})

    http.cancel(run, RunHandle("job-7", {"status_url": f"http://127.0.0.1:{port}/jobs/7"}))  # does not raise


def test_cancel_of_a_synchronous_run_sends_nothing(server: TestServer) -> None:
    server.route("/ping", status=200)
    http = runner()
    run = spec(http, {"url": server.url("/ping")})
    handle = http.start(run)

    http.cancel(run, handle)

    assert len(server.requests) == 1


# --------------------------------------------------------------------------------------------
# Config validation and options
# --------------------------------------------------------------------------------------------


def _errors(http: HttpRunner, config: Any) -> dict[str, Any]:
    with pytest.raises(serializers.ValidationError) as caught:
        http.validate_config(config)
    assert isinstance(caught.value.detail, dict)
    return caught.value.detail


def test_validation_fills_defaults() -> None:
    http = runner()

    assert http.validate_config({"url": "https://example.com/ping"}) == {
        "url": "https://example.com/ping",
        "method": "GET",
        "follow_redirects": True,
        "async": False,
    }
    config = http.validate_config({"url": "https://example.com/hook", "body": "x", "timeout": "2s"})
    assert config["method"] == "POST"
    assert config["timeout"] == timedelta(seconds=2)
    assert http.validate_config({"url": "http://example.com", "method": "patch", "json": []})["method"] == "PATCH"


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({"url": "ftp://example.com/file"}, "url", "Only http and https"),
        ({"url": "file:///etc/passwd"}, "url", "Only http and https"),
        ({"url": "example.com/ping"}, "url", "Only http and https"),
        ({"url": "https://user:pw@example.com/"}, "url", "user name or password"),
        ({"url": "http://example.com:99999/"}, "url", "valid URL"),
        ({"url": "http:///path"}, "url", "no host"),
        ({"url": "http://exa mple.com/"}, "url", "spaces"),
        ({"url": "https://example.com", "method": "TRACE"}, "method", "not a valid choice"),
        ({"url": "https://example.com", "method": "GET", "body": "x"}, "method", "cannot carry a body"),
        ({"url": "https://example.com", "headers": {"Host": "evil"}}, "headers", "set by the runner"),
        ({"url": "https://example.com", "headers": {"Idempotency-Key": "x"}}, "headers", "set by the runner"),
        ({"url": "https://example.com", "headers": {"Bad Name": "x"}}, "headers", "not a valid header name"),
        ({"url": "https://example.com", "headers": {"X-A": "a\r\nX-B: b"}}, "headers", "line breaks"),
        ({"url": "https://example.com", "expected_status": [200, 700]}, "expected_status", "less than or equal"),
        ({"url": "https://example.com", "expected_status": []}, "expected_status", "may not be empty"),
        ({"url": "https://example.com", "timeout": "soon"}, "timeout", "Invalid duration"),
        ({"url": "https://example.com", "timeout": 0}, "timeout", "at least"),
        ({"url": "https://example.com", "max_response_bytes": -1}, "max_response_bytes", "greater than or equal"),
        ({"url": "https://example.com", "async": "maybe"}, "async", "valid boolean"),
        ({"url": "https://example.com", "frobnicate": 1}, "frobnicate", "Unknown field"),
        ({"method": "GET"}, "url", "required"),
    ],
)
def test_config_errors_are_reported_per_field(config: dict[str, Any], field: str, message: str) -> None:
    errors = _errors(runner(), config)

    assert set(errors) == {field}
    assert message in str(errors[field])


def test_json_and_body_together_are_rejected_on_both_fields() -> None:
    errors = _errors(runner(), {"url": "https://example.com", "json": {"a": 1}, "body": "a=1"})

    assert set(errors) == {"json", "body"}
    assert "not both" in str(errors["json"])


def test_literal_blocked_address_is_rejected_at_validation_unless_allowed() -> None:
    strict = HttpRunner("http", {})

    errors = _errors(strict, {"url": "http://169.254.169.254/latest/meta-data/"})
    assert "169.254.169.254 is a cloud metadata address" in str(errors["url"])
    assert "loopback" in str(_errors(strict, {"url": "http://localhost:8000/"})["url"])
    assert runner().validate_config({"url": "http://127.0.0.1:8000/"})["url"] == "http://127.0.0.1:8000/"


def test_validation_does_not_resolve_host_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validation must not do DNS")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "gethostbyname", no_dns)

    assert HttpRunner("http", {}).validate_config({"url": "https://internal-looking.example/x"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"allowd_networks": []}, "unknown OPTIONS allowd_networks"),
        ({"allowed_networks": "10.0.0.0/8"}, "must be a list"),
        ({"allowed_networks": ["10.0.0.0/33"]}, "neither a network"),
        ({"allowed_networks": ["bad host!"]}, "neither a network"),
        ({"max_response_bytes": -5}, "max_response_bytes must be an integer"),
        ({"max_redirects": "5"}, "max_redirects must be an integer"),
        ({"user_agent": "a\r\nb"}, "user_agent"),
    ],
)
def test_bad_options_are_a_configuration_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        HttpRunner("http", options)


def test_status_document_output_is_bounded(server: TestServer) -> None:
    server.route("/jobs/7", lambda h, _r: h.reply_json(200, {"status": "succeeded", "output": "y" * 5000}))
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True, "max_response_bytes": 100})

    result = http.poll(run, RunHandle("job-7", {"status_url": server.url("/jobs/7")}))

    assert result.state is RunState.SUCCEEDED
    assert result.output.startswith("y" * 100) and "y" * 101 not in result.output


def test_the_registry_builds_the_configured_runner() -> None:
    from runners.registry import get_runner

    conf = {"http": {"BACKEND": "runners.http.HttpRunner", "OPTIONS": {"allowed_networks": LOOPBACK}}}
    with override_settings(TMS_RUNNERS=conf):
        assert isinstance(get_runner("http"), HttpRunner)


def test_async_status_url_is_found_even_with_a_tiny_output_cap(server: TestServer) -> None:
    accept = lambda h, _r: h.reply_json(202, {"padding": "z" * 500, "status_url": "/jobs/7"})  # noqa: E731
    _async_job(server, [{"status": "succeeded", "output": "all done"}], accept=accept)
    http = runner()
    run = spec(http, {"url": server.url("/jobs"), "async": True, "method": "POST", "max_response_bytes": 4})

    handle = http.start(run)

    assert handle.data == {"status_url": server.url("/jobs/7")}
    assert http.poll(run, handle).output.startswith("all ")
