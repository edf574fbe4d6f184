"""Where outgoing HTTP may connect: the private-address policy and the guarded transport.

Task owners choose the URLs TMS calls, so by default nothing but public addresses may be reached:
no loopback, private, link-local / cloud metadata, multicast, reserved or unspecified addresses,
nor IPv4-mapped, 6to4 or NAT64 IPv6 forms of them (:func:`address_refusal`). Operators open
specific networks or host names with an :class:`AddressPolicy` built from their
``allowed_networks`` option.

The check runs on the address the socket actually connects to, inside the urllib3 connection,
after the one and only DNS resolution, so a name cannot resolve to a public address for the check
and to a private one for the connection. TLS still verifies the certificate against the URL's host
name. A :class:`Guard` carries the policy and a hard deadline for one operation; requests sent
through :func:`guarded_session` go through both. Redirects are the caller's business: it must
follow them one hop at a time (``allow_redirects=False``) so that each hop is checked again.

Used by the ``http`` runner; anything else that calls URLs chosen by users (webhooks) should
use it too. It never touches the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import requests
from django.core.exceptions import ImproperlyConfigured
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.poolmanager import PoolManager
from urllib3.util.connection import allowed_gai_family

from runners.base import RunnerError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOSTNAME = re.compile(r"^(\*\.)?([a-z0-9_]([a-z0-9_-]*[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$")

# --------------------------------------------------------------------------------------------
# Address policy (the SSRF guard's rules)
# --------------------------------------------------------------------------------------------

#: Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS ECS, AWS IPv6, Alibaba):
#: named in refusals because they are the classic SSRF target.
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(network) for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_SHARED_NETWORK = ipaddress.ip_network("100.64.0.0/10")
_NAT64_NETWORK = ipaddress.ip_network("64:ff9b::/96")


def parse_ip(text: str) -> IPAddress:
    """Parse an address as getaddrinfo returns it, dropping any IPv6 zone (``fe80::1%eth0``)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address stands for, with the name of the mapping, if any."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip in _NAT64_NETWORK:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0 and int(ip) > 1:  # deprecated IPv4-compatible form ::a.b.c.d
        return "IPv4-compatible", ipaddress.IPv4Address(int(ip))
    return None


def _address_kind(ip: IPAddress) -> str | None:
    """What makes ``ip`` non-public ("loopback address", ...), or None for a public address."""
    if ip in _METADATA_ADDRESSES:
        return "cloud metadata address"
    if ip.is_unspecified:
        return "unspecified address"
    if ip.is_loopback:
        return "loopback address"
    if ip.is_link_local:
        return "link-local address"
    if ip.is_multicast:
        return "multicast address"
    if any(ip in network for network in _PRIVATE_NETWORKS if network.version == ip.version):
        return "private address"
    if ip in _SHARED_NETWORK:
        return "shared (carrier-grade NAT) address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local address"
    if ip.is_reserved:
        return "reserved address"
    if not ip.is_global:
        return "non-public address"
    return None


def _with_article(phrase: str) -> str:
    return f"{'an' if phrase[0] in 'aeiouAEIOU' else 'a'} {phrase}"


def address_refusal(ip: IPAddress) -> str | None:
    """Why the guard refuses ``ip`` by default ("127.0.0.1 is a loopback address"), or None."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            mapping, ipv4 = embedded
            kind = _address_kind(ipv4)
            if kind is not None:
                return f"{ip} is {_with_article(f'{mapping} {kind}')} ({ipv4})"
            if mapping == "IPv4-mapped":
                return None  # a dual-stack socket connects to the (public) IPv4 address itself
    kind = _address_kind(ip)
    return None if kind is None else f"{ip} is {_with_article(kind)}"


def normalise_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def literal_ip(host: str) -> IPAddress | None:
    try:
        return parse_ip(host.strip("[]"))
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class AddressPolicy:
    """Where the runner may connect: public addresses, plus the operator's ``allowed_networks``."""

    networks: tuple[IPNetwork, ...] = ()
    #: Exact host names (lower case, no trailing dot) opened whatever they resolve to.
    hostnames: frozenset[str] = frozenset()
    #: Suffixes (``.example.internal``) from ``*.example.internal`` entries.
    domain_suffixes: tuple[str, ...] = ()

    @classmethod
    def from_entries(cls, entries: Any, *, alias: str) -> AddressPolicy:
        """Build the policy from the ``allowed_networks`` option: CIDRs, addresses or host names."""
        if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_networks must be a list of strings.")
        networks: list[IPNetwork] = []
        hostnames: set[str] = set()
        suffixes: list[str] = []
        for entry in entries:
            if not isinstance(entry, str):
                raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_networks entry {entry!r} is not a string.")
            text = entry.strip()
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = normalise_host(text)
            if not _HOSTNAME.match(name):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_networks entry {entry!r} is neither a network "
                    '(such as "10.1.0.0/16") nor a host name (such as "api.internal" or "*.svc.internal").'
                )
            if name.startswith("*."):
                suffixes.append(name[1:])
            else:
                hostnames.add(name)
        return cls(tuple(networks), frozenset(hostnames), tuple(suffixes))

    def host_is_allowed(self, host: str) -> bool:
        """Whether ``host`` (a name from a URL) is opened by name, whatever it resolves to."""
        name = normalise_host(host)
        return name in self.hostnames or any(name.endswith(suffix) for suffix in self.domain_suffixes)

    def refusal(self, host: str, ip: IPAddress) -> str | None:
        """Why connecting to ``ip``, resolved from ``host``, is refused; None when it is allowed."""
        if self.host_is_allowed(host):
            return None
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and (embedded := _embedded_ipv4(ip)) is not None:
            candidates.append(embedded[1])
        for candidate in candidates:
            if any(candidate in network for network in self.networks if network.version == candidate.version):
                return None
        reason = address_refusal(ip)
        if reason is not None and literal_ip(host) is None:
            reason = f"{reason} (resolved from {normalise_host(host)})"
        return reason


class AddressRefused(Exception):
    """The guard refused every address a host resolved to.

    Deliberately not an ``OSError``: urllib3 and requests would wrap and retry an ``OSError``,
    and a refusal must surface as is, without any further attempt.
    """


# --------------------------------------------------------------------------------------------
# Guarded transport: urllib3 connections that validate the address they connect to
# --------------------------------------------------------------------------------------------


class Guard:
    """State one runner operation shares with its connections: the policy and a hard deadline.

    Socket timeouts only bound each read, so a server trickling a byte at a time could hold the
    worker for ever; a watchdog timer shuts every socket of the operation down at the deadline.
    """

    def __init__(self, policy: AddressPolicy, seconds: float) -> None:
        self.policy = policy
        self.seconds = seconds
        self.expired = False
        self._deadline = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Guard:
        self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timer.cancel()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def track(self, sock: socket.socket) -> None:
        """Let the watchdog shut ``sock`` down at the deadline.

        Keeps a duplicate descriptor: ``shutdown`` on it stops the connection even after TLS
        wrapping has detached the original socket object.
        """
        duplicate = sock.dup()
        with self._lock:
            if not self.expired:
                self._sockets.append(duplicate)
                return
        duplicate.close()
        raise TimeoutError("deadline passed")

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                # Fails harmlessly when not connected (yet, or any more): nothing to interrupt then.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


# The mixin is only ever combined with urllib3's HTTPConnection (or HTTPSConnection): let the type
# checker see that base, so the attributes and errors it uses are checked against urllib3's own.
if TYPE_CHECKING:
    _ConnectionBase = HTTPConnection
else:
    _ConnectionBase = object


class _GuardedConnectionMixin(_ConnectionBase):
    """Replaces urllib3's socket creation: resolve once, check each address, connect to it."""

    def __init__(self, *args: Any, tms_guard: Guard, **kwargs: Any) -> None:
        self._tms_guard = tms_guard
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        guard = self._tms_guard
        try:
            infos = socket.getaddrinfo(self._dns_host, self.port, allowed_gai_family(), socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        refusals: list[str] = []
        last_error: OSError | None = None
        for family, socktype, proto, _canonname, sockaddr in infos:
            reason = guard.policy.refusal(self.host, parse_ip(str(sockaddr[0])))
            if reason is not None:
                refusals.append(reason)
                continue
            try:
                return self._connect_to(family, socktype, proto, sockaddr)
            except OSError as exc:
                last_error = exc
        if last_error is None:
            if refusals:
                raise AddressRefused(refusals[0])
            raise NewConnectionError(self, f"{self.host} resolved to no address")
        if isinstance(last_error, TimeoutError):
            raise ConnectTimeoutError(self, f"Connection to {self.host} timed out.") from last_error
        raise NewConnectionError(self, f"Failed to establish a new connection: {last_error}") from last_error

    def _connect_to(self, family: int, socktype: int, proto: int, sockaddr: tuple[Any, ...]) -> socket.socket:
        guard = self._tms_guard
        timeout = guard.remaining() if self.timeout is None else min(self.timeout, guard.remaining())
        if timeout <= 0:
            raise TimeoutError("deadline passed")
        sock = socket.socket(family, socktype, proto)
        try:
            for option in self.socket_options or ():
                sock.setsockopt(*option)
            if self.source_address:
                sock.bind(self.source_address)
            sock.settimeout(timeout)
            guard.track(sock)
            sock.connect(sockaddr)
        except BaseException:
            sock.close()
            raise
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock


class _GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    """TLS is set up by urllib3 on the checked socket, with SNI and certificate checks for ``host``."""


class _GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedPoolManager(PoolManager):
    def __init__(self, *args: Any, tms_guard: Guard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tms_guard = tms_guard
        self.pool_classes_by_scheme = {"http": _GuardedHTTPConnectionPool, "https": _GuardedHTTPSConnectionPool}

    def _new_pool(
        self, scheme: str, host: str, port: int, request_context: dict[str, Any] | None = None
    ) -> HTTPConnectionPool:
        context = dict(self.connection_pool_kw if request_context is None else request_context)
        context["tms_guard"] = self._tms_guard  # reaches the connection class through the pool's conn_kw
        return super()._new_pool(scheme, host, port, context)


class _GuardedAdapter(HTTPAdapter):
    def __init__(self, guard: Guard) -> None:
        self._tms_guard = guard  # before super().__init__, which builds the pool manager
        super().__init__(pool_connections=1, pool_maxsize=1, max_retries=0)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        self._pool_connections = connections
        self._pool_maxsize = maxsize
        self._pool_block = block
        self.poolmanager = _GuardedPoolManager(
            num_pools=connections, maxsize=maxsize, block=block, tms_guard=self._tms_guard, **pool_kwargs
        )

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        # A proxy would connect on our behalf, out of reach of the address check.
        raise RunnerError("the http runner does not use proxies", retryable=False)


@contextlib.contextmanager
def guarded_session(guard: Guard) -> Iterator[requests.Session]:
    """A requests session whose every connection goes through ``guard``'s address check and deadline.

    The session ignores the environment (no proxies, no ``.netrc``): a proxy would connect on the
    caller's behalf, out of reach of the check.
    """
    with requests.Session() as session:
        session.trust_env = False
        adapter = _GuardedAdapter(guard)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        yield session
