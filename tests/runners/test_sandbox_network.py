"""What a sandboxed run can reach over the network (issue 27, finding 1), against real services.

Each test runs a real command through the ``subprocess`` runner that tries to open TCP connections
to: the suite's PostgreSQL and RabbitMQ (trust authentication and guest/guest here, as on many
developers' machines), a web server of the test on the host (through loopback and through the
host's own address), the cloud metadata address 169.254.169.254 and a private address. Nothing
of that may leave this machine, so the test builds what the addresses lead to itself: a network
namespace joined to the host by a veth pair, holding 10.251.N.2 (the allowed server), 10.251.N.3
(a private server nobody allowed) and 169.254.169.254 (a stand-in metadata service), with a host
route for that /32. The test first checks that the host itself reaches every one of them, so a
refusal inside the sandbox means the sandbox refused it.

In every mode that claims isolation (``bwrap`` and ``user``): with egress closed (the default) a
run reaches none of them; with egress open (``internet`` and the allowed server) it reaches the
allowed server and still none of the others.
"""

from __future__ import annotations

import fcntl
import http.server
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runners import sandbox
from runners.base import RunState
from tests.runners.conftest import wait_for_result
from tests.runners.test_sandbox import MODES, make_runner, make_spec

#: Errors a connection the sandbox refuses may end in (never a timeout: refusals are immediate).
REFUSED = {"ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "EACCES", "EPERM"}
#: Tries each "name host port" line of argv[1]: connects, and for the allowed server reads an answer.
PROBE = r"""
import errno, json, socket, sys
results = {}
for line in sys.argv[1].splitlines():
    name, host, port = line.split()
    sock = socket.socket()
    sock.settimeout(5)
    try:
        sock.connect((host, int(port)))
    except socket.timeout:
        results[name] = "timeout"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc))
    else:
        results[name] = "connected"
        if name == "allowed":
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            results[name] = "answered: " + answer.decode(errors="replace").split("\r\n\r\n", 1)[-1]
    finally:
        sock.close()
print(json.dumps(results))
"""
#: The test network's own server (run inside its namespace): answers every request with its address.
SERVER = r"""
import http.server, socketserver
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + self.connection.getsockname()[0]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 80), Hello).serve_forever()
"""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"


@pytest.fixture(scope="module")
def testnet() -> Iterator[dict[str, str]]:
    """The test network (see the module docstring): its addresses by role."""
    if shutil.which("ip") is None:
        pytest.fail("the network tests need iproute2's ip (apt-get install -y iproute2)")
    n = os.getpid() % 250 + 1
    name, host_if, peer_if = f"tmst{os.getpid()}", f"tmsh{os.getpid()}", f"tmsp{os.getpid()}"
    prefix = f"10.251.{n}"
    # One test process at a time owns the host route to 169.254.169.254 (pytest-xdist runs two).
    lock = open(Path("/tmp") / "tms-test-metadata-route.lock", "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    server = None
    try:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        _ip("netns", "add", name)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", name)
        _ip("addr", "add", f"{prefix}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for address in (f"{prefix}.2/24", f"{prefix}.3/24", "169.254.169.254/32"):
            _ip("-n", name, "addr", "add", address, "dev", peer_if)
        _ip("-n", name, "link", "set", peer_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "route", "add", "default", "via", f"{prefix}.1")
        _ip("route", "replace", "169.254.169.254/32", "via", f"{prefix}.2", "dev", host_if)
        server = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", SERVER])
        yield {"allowed": f"{prefix}.2", "private": f"{prefix}.3", "metadata": "169.254.169.254"}
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "route", "del", "169.254.169.254/32", "dev", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A web server of the test on the host, on every address (loopback and the host's own)."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host web")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _host_address(testnet: dict[str, str]) -> str:
    """An address of this host that is not loopback and not the test network's side of it."""
    listing = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    ours = testnet["allowed"].rsplit(".", 1)[0] + "."
    for line in listing.splitlines():
        address = line.split()[3].split("/")[0]
        if not ipaddress.IPv4Address(address).is_loopback and not address.startswith(ours):
            return address
    pytest.fail("this host has no address besides loopback to try")


def _targets(testnet: dict[str, str], web: int) -> dict[str, tuple[str, int]]:
    database = settings.DATABASES["default"]
    broker = urlsplit(settings.CELERY_BROKER_URL)
    assert database["ENGINE"].endswith("postgresql") and broker.scheme.startswith("amqp"), "needs PostgreSQL and AMQP"
    return {
        "postgresql": (str(database["HOST"] or "127.0.0.1"), int(database["PORT"] or 5432)),
        "rabbitmq": (str(broker.hostname), int(broker.port or 5672)),
        "web-loopback": ("127.0.0.1", web),
        "web-host-address": (_host_address(testnet), web),
        "metadata": (testnet["metadata"], 80),
        "private": (testnet["private"], 80),
        "allowed": (testnet["allowed"], 80),
    }


def _probe_from_here(targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    script = "\n".join(f"{name} {host} {port}" for name, (host, port) in targets.items())
    done = subprocess.run([sys.executable, "-c", PROBE, script], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def targets(testnet: dict[str, str], web: int) -> dict[str, tuple[str, int]]:
    """Every target, checked reachable from the host first (else a refusal would prove nothing)."""
    found = _targets(testnet, web)
    deadline = time.monotonic() + 10
    while True:  # the test network's server may still be starting
        reached = _probe_from_here(found)
        if (
            all(value != "timeout" and value not in REFUSED for value in reached.values())
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.1)
    assert reached.pop("allowed") == f"answered: hello from {testnet['allowed']}", reached
    assert set(reached.values()) == {"connected"}, reached
    return found


def _probe_in_sandbox(tmp_path: Path, mode: str, targets: dict[str, tuple[str, int]], **options: Any) -> dict[str, str]:
    runner = make_runner(tmp_path, mode, **options)
    script = "\n".join(f"{name} {host} {port}" for name, (host, port) in targets.items())
    spec = make_spec(runner, {"command": ["/usr/bin/python3", "-c", PROBE, script]})
    result = wait_for_result(runner, spec, runner.start(spec), seconds=60)
    assert result.state is RunState.SUCCEEDED, result.error
    return json.loads(result.output)


@pytest.mark.parametrize("mode", MODES)
def test_with_egress_closed_a_run_reaches_nothing_but_its_own_loopback(
    tmp_path: Path, mode: str, targets: dict[str, tuple[str, int]]
) -> None:
    reached = _probe_in_sandbox(tmp_path, mode, targets)
    assert set(reached) == set(targets)
    assert {name: value for name, value in reached.items() if value not in REFUSED} == {}


@pytest.mark.parametrize("mode", MODES)
def test_with_egress_open_a_run_reaches_the_allowed_server_and_still_nothing_else(
    tmp_path: Path, mode: str, targets: dict[str, tuple[str, int]], testnet: dict[str, str]
) -> None:
    egress = {"internet": True, "allow": [f"{testnet['allowed']}/32", "169.254.169.254"]}
    reached = _probe_in_sandbox(tmp_path, mode, targets, egress=egress)
    assert reached.pop("allowed") == f"answered: hello from {testnet['allowed']}"
    # The metadata address stays refused even though the operator listed it.
    assert {name: value for name, value in reached.items() if value not in REFUSED} == {}


@pytest.mark.parametrize("mode", MODES)
def test_a_database_host_of_the_settings_stays_refused_inside_an_allowed_network(
    tmp_path: Path, mode: str, targets: dict[str, tuple[str, int]], testnet: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The settings name the test network's private server as the database host (a managed
    # database on the private network, say); the operator opens that whole network.
    monkeypatch.setitem(settings.DATABASES["default"], "HOST", testnet["private"])
    network = testnet["allowed"].rsplit(".", 1)[0] + ".0/24"
    chosen = {name: targets[name] for name in ("allowed", "private")}
    reached = _probe_in_sandbox(tmp_path, mode, chosen, egress={"allow": [network]})
    assert reached["allowed"] == f"answered: hello from {testnet['allowed']}"
    assert reached["private"] in REFUSED


def test_a_run_has_its_own_loopback(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "bwrap")
    code = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.socket(); "
        "c.connect(s.getsockname()); print('own loopback ok')"
    )
    spec = make_spec(runner, {"command": ["/usr/bin/python3", "-c", code]})
    assert wait_for_result(runner, spec, runner.start(spec), seconds=30).output == "own loopback ok\n"


# --------------------------------------------------------------------------------------------
# The option, checked at start-up, and the rules it makes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("egress", "message"),
    [
        ("yes", "must be null"),
        ({"internet": "yes"}, "internet"),
        ({"allow": "10.0.0.0/8"}, "allow"),
        ({"allow": ["10.0.0.0/33"]}, "not an IPv4 network"),
        ({"allow": ["fd00::/8"]}, "IPv4 only"),
        ({"allow": ["bad host!"]}, "not an IPv4 network"),
        ({"allow": [], "ports": [80]}, "must be null"),
    ],
)
def test_bad_egress_options_are_a_configuration_error(tmp_path: Path, egress: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        make_runner(tmp_path, "user", egress=egress)


def test_the_old_network_option_is_gone_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="egress"):
        make_runner(tmp_path, "bwrap", network=True)


def test_egress_needs_slirp4netns_and_nft_checked_when_the_mode_is_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = make_runner(tmp_path, "bwrap", egress={"internet": True})
    monkeypatch.setattr(sandbox, "slirp4netns_path", lambda: None)
    with pytest.raises(ImproperlyConfigured, match=r"slirp4netns is not installed \(apt-get install -y slirp4netns"):
        runner.sandbox_mode()


def test_the_non_public_ranges_agree_with_what_python_calls_not_global() -> None:
    # Python's is_global leaves multicast aside; for everything else the two agree at every edge.
    def public(address: ipaddress.IPv4Address) -> bool:
        return address.is_global and not address.is_multicast

    for network in sandbox.NON_PUBLIC_V4:
        assert not public(network.network_address), network
        for edge in (int(network.network_address) - 1, int(network.broadcast_address) + 1):
            if 0 <= edge < 2**32:
                address = ipaddress.IPv4Address(edge)
                assert any(address in other for other in sandbox.NON_PUBLIC_V4) or public(address), address
    for address in ("8.8.8.8", "1.1.1.1", "151.101.1.1"):
        assert not any(ipaddress.IPv4Address(address) in n for n in sandbox.NON_PUBLIC_V4)


def test_the_rules_refuse_the_database_and_broker_hosts_of_the_settings(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(settings.DATABASES["default"], "HOST", "192.0.2.77")
    settings.CELERY_BROKER_URL = "amqp://guest:guest@198.51.100.8:5672//;amqp://guest@203.0.113.9//"
    refused = sandbox.refused_addresses()
    assert {"192.0.2.77", "198.51.100.8", "203.0.113.9", "169.254.169.254", "10.0.2.2"} <= set(refused)
    rules = sandbox.nft_ruleset(sandbox.Egress(internet=False), refused=refused, allowed=["192.0.2.77"])
    # Refused before allowed: listing the database's address does not open it.
    assert rules.index("@refused") < rules.index("@allowed")
    loaded = subprocess.run(["nft", "--check", "-f", "-"], input=rules, capture_output=True, text=True, check=False)
    assert loaded.returncode == 0, loaded.stderr


def test_allowed_host_names_are_resolved_when_a_run_is_planned() -> None:
    egress = sandbox.parse_egress("local", {"allow": ["LOCALHOST.", "10.9.0.0/16", "192.0.2.5"]})
    assert egress.hosts == ("localhost",) and egress.open and not egress.internet
    assert sandbox.allowed_addresses(egress) == ["10.9.0.0/16", "127.0.0.1", "192.0.2.5/32"]
    assert not sandbox.parse_egress("local", {"internet": False, "allow": []}).open
    assert not sandbox.parse_egress("local", None).open


@pytest.mark.parametrize("mode", MODES)
def test_a_network_that_cannot_be_set_up_fails_the_run_before_the_command_starts(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slirp4netns that exits at once never reports the tap ready: the command must not run
    # (with the host's network or without the rules), and the run fails saying why.
    monkeypatch.setattr(sandbox, "slirp4netns_path", lambda: "/bin/false")
    runner = make_runner(tmp_path, mode, egress={"internet": True})
    spec = make_spec(runner, {"command": ["/bin/sh", "-c", 'echo ran > "$HOME/ran"']})
    result = wait_for_result(runner, spec, runner.start(spec), seconds=30)
    assert result.state is RunState.FAILED
    assert result.error.startswith("the run's network could not be set up: slirp4netns did not configure"), result.error
    assert not (runner.work_dir / spec.idempotency_key / "work" / "ran").exists()


def test_egress_tools_missing_after_start_up_fail_the_run_not_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = make_runner(tmp_path, "user", egress={"internet": True})
    assert runner.sandbox_mode() == "user"  # resolved while slirp4netns was there
    monkeypatch.setattr(sandbox, "nft_path", lambda: None)
    spec = make_spec(runner, {"command": ["/bin/sh", "-c", "echo ran"]})
    result = wait_for_result(runner, spec, runner.start(spec), seconds=30)
    assert result.state is RunState.FAILED and result.retryable is False
    assert "nftables is not installed (apt-get install -y nftables" in result.error
