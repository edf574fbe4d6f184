"""The private-address policy and the guarded transport, without any runner on top.

Traffic only ever goes to 127.0.0.1, opened through ``allowed_networks`` where a test needs it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured

from runners.netguard import AddressPolicy, AddressRefused, Guard, address_refusal, guarded_session
from tests.runners.conftest import free_port

LOOPBACK = AddressPolicy.from_entries(["127.0.0.1/32"], alias="test")


# --------------------------------------------------------------------------------------------
# Address policy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("127.8.9.10", "127.8.9.10 is a loopback address"),
        ("::1", "::1 is a loopback address"),
        ("10.1.2.3", "10.1.2.3 is a private address"),
        ("172.16.0.1", "172.16.0.1 is a private address"),
        ("192.168.1.1", "192.168.1.1 is a private address"),
        ("fc00::1", "fc00::1 is a private address"),
        ("fd12:3456::1", "fd12:3456::1 is a private address"),
        ("169.254.1.1", "169.254.1.1 is a link-local address"),
        ("169.254.169.254", "169.254.169.254 is a cloud metadata address"),
        ("fd00:ec2::254", "fd00:ec2::254 is a cloud metadata address"),
        ("fe80::1", "fe80::1 is a link-local address"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address"),
        ("::", ":: is an unspecified address"),
        ("224.0.0.1", "224.0.0.1 is a multicast address"),
        ("ff02::1", "ff02::1 is a multicast address"),
        ("240.0.0.1", "240.0.0.1 is a reserved address"),
        ("255.255.255.255", "255.255.255.255 is a reserved address"),
        ("100.64.0.1", "100.64.0.1 is a shared (carrier-grade NAT) address"),
        ("192.0.2.1", "192.0.2.1 is a non-public address"),
        ("::ffff:10.0.0.1", "::ffff:a00:1 is an IPv4-mapped private address (10.0.0.1)"),
        ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe is an IPv4-mapped cloud metadata address (169.254.169.254)"),
        ("2002:7f00:1::", "2002:7f00:1:: is a 6to4 loopback address (127.0.0.1)"),
        ("64:ff9b::a00:1", "64:ff9b::a00:1 is a NAT64 private address (10.0.0.1)"),
        ("93.184.215.14", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:93.184.215.14", None),
    ],
)
def test_address_refusal_reasons(address: str, expected: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(address)) == expected


def test_allowed_networks_open_addresses_and_their_mapped_forms() -> None:
    policy = AddressPolicy.from_entries(["10.1.0.0/16", "fd00::/8", "*.svc.internal", "db.corp"], alias="http")

    assert policy.refusal("10.1.2.3", ipaddress.ip_address("10.1.2.3")) is None
    assert policy.refusal("x", ipaddress.ip_address("::ffff:10.1.2.3")) is None
    assert policy.refusal("x", ipaddress.ip_address("fd00::5")) is None
    assert policy.refusal("api.svc.internal", ipaddress.ip_address("10.9.9.9")) is None
    assert policy.refusal("DB.corp.", ipaddress.ip_address("192.168.0.1")) is None
    assert policy.refusal("svc.internal", ipaddress.ip_address("10.9.9.9")) is not None
    assert policy.refusal("10.2.0.1", ipaddress.ip_address("10.2.0.1")) == "10.2.0.1 is a private address"


def test_allowed_networks_entries_must_be_networks_or_host_names() -> None:
    with pytest.raises(ImproperlyConfigured, match="neither a network"):
        AddressPolicy.from_entries(["not a host!"], alias="http")
    with pytest.raises(ImproperlyConfigured, match="list of strings"):
        AddressPolicy.from_entries("10.0.0.0/8", alias="http")


# --------------------------------------------------------------------------------------------
# Guarded transport
# --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            # One byte every 50 ms: each read is quick, the whole is not. The client hangs up early.
            with contextlib.suppress(OSError):
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_guarded_session_refuses_a_blocked_address_before_connecting(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connects: list[Any] = []
    real_connect = socket.socket.connect

    def spy(sock: socket.socket, address: Any) -> None:
        connects.append(address)
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", spy)

    with (
        Guard(AddressPolicy(), 2.0) as guard,
        guarded_session(guard) as session,
        # Not wrapped in a ConnectionError, which requests and urllib3 would retry.
        pytest.raises(AddressRefused, match=r"127\.0\.0\.1 is a loopback address"),
    ):
        session.get(f"{server}/", allow_redirects=False, timeout=2)

    assert connects == []


def test_guarded_session_connects_where_the_policy_allows(server: str) -> None:
    with Guard(LOOPBACK, 2.0) as guard, guarded_session(guard) as session:
        response = session.get(f"{server}/", allow_redirects=False, timeout=2)

    assert (response.status_code, response.content) == (200, b"ok")


def test_guarded_session_ignores_proxies_from_the_environment(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy would connect on our behalf, out of reach of the address check.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NO_PROXY", "")

    with Guard(LOOPBACK, 2.0) as guard, guarded_session(guard) as session:
        assert session.get(f"{server}/", allow_redirects=False, timeout=2).content == b"ok"


def test_guard_deadline_cuts_a_trickling_response(server: str) -> None:
    began = time.monotonic()
    with Guard(LOOPBACK, 0.5) as guard, guarded_session(guard) as session, pytest.raises(requests.RequestException):
        session.get(f"{server}/slow", allow_redirects=False, timeout=2).content  # noqa: B018

    assert guard.expired
    assert time.monotonic() - began < 2.0
