"""How the ``subprocess`` runner isolates a run from the worker and from other runs.

Modes (``TMS_SUBPROCESS_SANDBOX``):

``bwrap``
    The command runs as a run user of its own (not the worker's) inside bubblewrap: new user,
    PID, IPC, UTS, mount and network namespaces. It sees ``/usr`` (and the ``/bin``, ``/sbin``,
    ``/lib*`` links or folders), a few files of ``/etc``, a fresh ``/proc`` of its own PID
    namespace (no other process of the host, the worker's included), a private read-only
    ``/dev`` and ``/run``, size-limited ``/tmp`` and ``/dev/shm`` (``tmp_bytes`` each), its own
    work folder (read-write), its artifact (read-only) and the operator's ``read_only_paths``;
    nothing else of the host: no other run folder, no artifact cache, no project files.
``user``
    The command runs as a run user of its own, with the host's file system, in a network
    namespace of its own: the worker's ``/proc/<pid>/environ`` is closed to it (another
    user's), its run folder's control files (``run.json`` with the task's secrets and callback
    token) are root-only, its work folder is 0700 and its own, other runs run as other users.
    World-readable files of the host stay readable (Unix sockets of the host included), and
    ``/tmp`` is shared.
``none``
    Explicit opt-in, **not a sandbox**: the command runs as the worker's own user, with the
    worker's network (only the resource limits and the scrubbed environment apply).
``auto`` (default)
    ``bwrap`` when the worker can switch users (root or ``CAP_SETUID``) and ``bwrap`` is
    installed, ``user`` when it can switch users only, and otherwise a configuration error.

Run users form a pool, ``<prefix>0 .. <prefix>N-1`` (``manage.py tms_sandbox_setup`` creates
them). Each concurrent run on a host claims one for itself, with an ``O_EXCL`` file in the
host-wide, root-only ``SUBPROCESS_RUN_USER_LOCKS`` folder, and the supervisor gives it back when
the run is over, after killing every process left with that uid: two runs never share a uid at
the same time, so per-user limits (``RLIMIT_NPROC``) and signals stay within one run.

Network (``bwrap`` and ``user``): every run has a network namespace of its own, so it never has
the host's network, loopback included (no PostgreSQL, RabbitMQ, ``/metrics`` or Flower on
127.0.0.1, no host address, no abstract Unix socket of the host). With egress closed (the
default) that namespace has only its own loopback: bubblewrap's own in bwrap mode, the
supervisor's (which moves itself into a new one before it starts the command) in user mode.
With the runner's ``egress`` option open, the supervisor's in both modes, and slirp4netns (a
user-mode TCP/IP stack, run with ``--disable-host-loopback`` and its own sandbox and seccomp
filter) gives the namespace a ``tap0`` whose traffic leaves as connections made by the host, and
nftables rules loaded into the namespace before the command starts decide what it may reach
(:func:`nft_ruleset`): never the host's own addresses, the database and broker hosts of the
settings, cloud metadata addresses or slirp4netns' gateway (the host); the operator's ``allow``
list; the rest of the non-public ranges never; public addresses when ``internet`` is on. The
command has no capability in that namespace (an unprivileged user; inside bubblewrap, a user
namespace of its own), so it cannot change the rules.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runners.supervisor import kill_user, start_ticks
from tms_core.conf import tms_settings

MODES = ("bwrap", "user", "none")
#: Files of /etc a run sees in bwrap mode (those that exist): name lookups, TLS roots, time zone.
ETC_FILES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "localtime",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "mime.types",
)
#: Top-level folders (or merged-/usr links) of the system a run sees in bwrap mode.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: coreutils' env (>= 8.31 for --default-signal), run inside the sandbox in front of the command.
ENV = "/usr/bin/env"


def privileged() -> bool:
    """Whether this process can switch to another user (root, or CAP_SETUID and CAP_SETGID)."""
    if os.geteuid() == 0:
        return True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << 7)) and bool(caps & (1 << 6))  # CAP_SETUID, CAP_SETGID
    except OSError:
        pass
    return False


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/local/bin:/usr/bin:/bin")


def run_user_names() -> list[str]:
    conf = tms_settings()
    return [f"{conf.SUBPROCESS_RUN_USER_PREFIX}{i}" for i in range(conf.SUBPROCESS_RUN_USERS)]


def missing_run_users() -> list[str]:
    missing = []
    for name in run_user_names():
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(name)
    return missing


def resolve_mode(configured: str | None = None) -> str:
    """The mode runs get on this host, or ImproperlyConfigured saying what is missing."""
    mode = configured or tms_settings().SUBPROCESS_SANDBOX
    if mode == "none":
        return mode
    can_switch = privileged()
    if mode == "auto":
        if not can_switch:
            raise ImproperlyConfigured(
                "TMS_SUBPROCESS_SANDBOX=auto: the worker can neither switch to a run user (it is not root and "
                "has no CAP_SETUID) nor sandbox runs otherwise; run the worker as root (it drops privileges "
                "for each run), or set TMS_SUBPROCESS_SANDBOX=none to run commands as the worker's own user "
                "(not a sandbox)."
            )
        mode = "bwrap" if bwrap_path() else "user"
    elif not can_switch:
        raise ImproperlyConfigured(
            f"TMS_SUBPROCESS_SANDBOX={mode}: the worker must be root (or have CAP_SETUID and CAP_SETGID) to "
            "run commands as a run user."
        )
    if mode == "bwrap" and not bwrap_path():
        raise ImproperlyConfigured(
            "TMS_SUBPROCESS_SANDBOX=bwrap: bubblewrap is not installed (apt-get install -y bubblewrap)."
        )
    missing = missing_run_users()
    if missing:
        raise ImproperlyConfigured(
            f"TMS_SUBPROCESS_SANDBOX={mode}: run users missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); create them with `python manage.py tms_sandbox_setup` (as root)."
        )
    return mode


@dataclass(frozen=True)
class RunUser:
    name: str
    uid: int
    gid: int
    #: The claim file; the supervisor removes it when the run is over.
    lock: str


class NoFreeRunUser(RuntimeError):
    """Every run user of the pool is busy with a run on this host."""


def _lock_dir() -> Path:
    path = Path(tms_settings().SUBPROCESS_RUN_USER_LOCKS)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _claim_is_stale(lock: Path) -> bool:
    """A claim whose run has ended (exit written, folder gone) or whose supervisor is gone."""
    try:
        data = json.loads(lock.read_text())
    except FileNotFoundError:
        return False
    except ValueError:
        # Half-written by a launcher that died: stale once it is old enough.
        return time.time() - lock.stat().st_mtime > 60
    run_dir = Path(str(data.get("run_dir", "")))
    # First: a claim younger than a minute is never taken, even before its run folder has its
    # launch marker (the claim comes first), or a run starting beside it would be killed.
    if time.time() - float(data.get("at", 0)) < 60:
        return False  # the launcher is still starting the supervisor
    if not (run_dir / "launch").exists():
        return True
    # Only a dead supervisor's claim is taken over: a live one gives it back itself, after
    # killing what the run left behind (an exit record alone does not mean it has done so).
    try:
        info = json.loads((run_dir / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return True
    pid, start = info.get("pid"), info.get("start")
    return not isinstance(pid, int) or start_ticks(pid) is None or (start is not None and start_ticks(pid) != start)


def claim_run_user(run_dir: Path) -> RunUser:
    """Claim a free run user of the pool for the run in ``run_dir`` (NoFreeRunUser if none is)."""
    folder = _lock_dir()
    for name in run_user_names():
        lock = folder / name
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                if not _claim_is_stale(lock):
                    break
                # Moved aside first: of two workers reclaiming it, one wins the rename.
                aside = folder / f".stale.{name}.{os.getpid()}.{time.monotonic_ns()}"
                with contextlib.suppress(FileNotFoundError):
                    os.rename(lock, aside)
                    _reclaim(aside, pwd.getpwnam(name).pw_uid)
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"run_dir": str(run_dir), "at": time.time()}, fh)
            entry = pwd.getpwnam(name)
            return RunUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, lock=str(lock))
    raise NoFreeRunUser(f"all {len(run_user_names())} run users are busy on this host")


def _reclaim(claim: Path, uid: int) -> None:
    """Tidy what a dead supervisor left: the user's processes, its run folder's access."""
    kill_user(uid)
    with contextlib.suppress(OSError, ValueError):
        run_dir = json.loads(claim.read_text()).get("run_dir")
        if run_dir:
            os.chmod(run_dir, 0o700)
    claim.unlink(missing_ok=True)


def bwrap_argv(
    *, work: str, read_only: list[str], cwd: str, executable: str, argv: list[str], tmp_bytes: int,
    resolv_conf: str | None = None,
) -> list[str]:  # fmt: skip
    """The bubblewrap command that runs ``argv`` with the view of the host described above.

    With ``resolv_conf`` (egress open) it keeps the network namespace it is started in
    (``--share-net``), the supervisor's own, never the host's, and that file replaces the host's
    ``/etc/resolv.conf`` (slirp4netns' DNS forwarder); without, bubblewrap gives the run a new
    network namespace with nothing but its loopback.
    """
    bwrap = bwrap_path()
    assert bwrap is not None
    args = [bwrap, "--unshare-all"]
    if resolv_conf is not None:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--dir", "/etc"]
    for name in ETC_FILES:
        if name == "resolv.conf" and resolv_conf is not None:
            args += ["--ro-bind", resolv_conf, "/etc/resolv.conf"]
        else:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # /tmp and /dev/shm are tmpfs of the sandbox's own, in RAM that no memory limit counts: each
    # gets a size. /dev (device nodes stay usable) and /run are read-only, or they would be
    # unbounded tmpfs too.
    size = str(int(tmp_bytes))
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]  # noqa: S108
    args += ["--size", size, "--tmpfs", "/tmp", "--tmpfs", "/run", "--remount-ro", "/run"]  # noqa: S108
    for path in read_only:
        args += ["--ro-bind-try", path, path]
    # The bwrap processes ignore SIGTERM (the supervisor sets that before exec; see
    # ``ignore_sigterm`` in run.json) so that a cancel's SIGTERM to the group reaches the command
    # and not only bwrap, which would take the command down at once; ``env`` gives the command
    # back the default disposition.
    args += ["--bind", work, work, "--chdir", cwd, "--", ENV, "--default-signal=TERM", executable, *argv[1:]]
    return args


# --------------------------------------------------------------------------------------------
# Network: what a run may reach
# --------------------------------------------------------------------------------------------

#: IPv4 networks that are not the public internet: IANA's IPv4 Special-Purpose Address Registry
#: (this network, private, shared/CGNAT, loopback, link-local, IETF protocol assignments,
#: documentation, benchmarking), multicast and the reserved 240/4 with broadcast.
NON_PUBLIC_V4 = tuple(
    ipaddress.IPv4Network(network)
    for network in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    )
)  # fmt: skip
#: Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS ECS, Alibaba): refused even
#: when an ``allow`` entry covers them.
METADATA_V4 = ("169.254.169.254", "169.254.170.2", "100.100.100.200")
#: slirp4netns' fixed addresses in the run's namespace: the gateway (the host itself, refused;
#: ``--disable-host-loopback`` refuses its loopback too) and the DNS forwarder.
SLIRP_GATEWAY, SLIRP_DNS = "10.0.2.2", "10.0.2.3"
_HOST_NAME = re.compile(r"^([a-z0-9_]([a-z0-9_-]*[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$")
#: How long resolved names (``allow`` hosts, the database and broker hosts) are reused.
RESOLVE_TTL = 60.0


@dataclass(frozen=True)
class Egress:
    """Where a run may connect beyond its own loopback (the runner's ``egress`` option)."""

    #: Public (global) IPv4 addresses.
    internet: bool = False
    #: Networks and addresses opened explicitly, private ones included.
    networks: tuple[ipaddress.IPv4Network, ...] = ()
    #: Host names opened explicitly, resolved when a run is planned.
    hosts: tuple[str, ...] = ()

    @property
    def open(self) -> bool:
        return self.internet or bool(self.networks) or bool(self.hosts)


def parse_egress(alias: str, value: Any) -> Egress:
    """The ``egress`` option: None or ``{"internet": bool, "allow": [network | address | host]}``."""
    where = f"TMS_RUNNERS[{alias!r}]: egress"
    if value is None or value is False:
        return Egress()
    if not isinstance(value, Mapping) or set(value) - {"internet", "allow"}:
        raise ImproperlyConfigured(
            f'{where} must be null (no network) or a dict with "internet" (true/false) and "allow" (a list of '
            "IPv4 networks, addresses or host names)."
        )
    internet = value.get("internet", False)
    allow = value.get("allow", [])
    if not isinstance(internet, bool):
        raise ImproperlyConfigured(f'{where}["internet"] must be true or false.')
    if not isinstance(allow, list | tuple) or not all(isinstance(item, str) and item for item in allow):
        raise ImproperlyConfigured(f'{where}["allow"] must be a list of IPv4 networks, addresses or host names.')
    networks: list[ipaddress.IPv4Network] = []
    hosts: list[str] = []
    for entry in allow:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            name = entry.strip().lower().rstrip(".")
            if not _HOST_NAME.match(name) or name.replace(".", "").isdigit():
                raise ImproperlyConfigured(
                    f'{where}["allow"]: {entry!r} is not an IPv4 network, address or host name.'
                ) from None
            hosts.append(name)
            continue
        if not isinstance(network, ipaddress.IPv4Network):
            raise ImproperlyConfigured(f'{where}["allow"]: {entry!r}: runs have IPv4 only (no IPv6 route).')
        networks.append(network)
    return Egress(internet=internet, networks=tuple(networks), hosts=tuple(hosts))


def slirp4netns_path() -> str | None:
    return shutil.which("slirp4netns", path="/usr/local/bin:/usr/bin:/bin")


def nft_path() -> str | None:
    return shutil.which("nft", path="/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin")


def check_egress_tools() -> None:
    """ImproperlyConfigured naming what is missing for runs with egress open."""
    missing = [name for name, found in (("slirp4netns", slirp4netns_path()), ("nftables", nft_path())) if not found]
    if missing:
        raise ImproperlyConfigured(
            f"the runner's egress option is open but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            f"not installed (apt-get install -y {' '.join(missing)}; make sandbox does it)."
        )


def host_addresses() -> set[str]:
    """Every IPv4 address of this host (of the network namespace that reads it), from the kernel's
    routing table: ``/proc/net/fib_trie`` lists each local address as a ``host LOCAL`` leaf."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return found
    previous = ""
    for line in lines:
        text = line.strip()
        if text.endswith("host LOCAL") and previous.startswith(("|-- ", "+-- ")):
            prefix = text.split()[0].lstrip("/")
            with contextlib.suppress(ValueError):
                found.add(str(ipaddress.IPv4Network(f"{previous[4:].split()[0]}/{prefix}", strict=False)))
        previous = text
    return found


_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}
_resolved_lock = threading.Lock()


def resolve_ipv4(name: str) -> tuple[str, ...]:
    """The IPv4 addresses of ``name`` (an address stays itself), cached for RESOLVE_TTL; () if unknown."""
    with contextlib.suppress(ValueError):
        return (str(ipaddress.IPv4Address(name)),)
    now = time.monotonic()
    with _resolved_lock:
        cached = _resolved.get(name)
    if cached is not None and now - cached[0] < RESOLVE_TTL:
        return cached[1]
    try:
        infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        addresses = tuple(sorted({str(info[4][0]) for info in infos}))
    except (OSError, UnicodeError):
        addresses = ()
    with _resolved_lock:
        _resolved[name] = (now, addresses)
    return addresses


def service_hosts() -> list[str]:
    """The database and message-broker hosts named in the settings (names or addresses)."""
    hosts: list[str] = []
    for database in getattr(settings, "DATABASES", {}).values():
        host = str(database.get("HOST") or "")
        if host and not host.startswith("/"):  # a Unix socket folder has no address
            hosts += [part.strip() for part in host.split(",") if part.strip()]
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        value = getattr(settings, name, None)
        if not isinstance(value, str):
            continue
        for url in re.split(r"[;,]\s*", value):
            with contextlib.suppress(ValueError):
                hostname = urlsplit(url.strip()).hostname
                if hostname:
                    hosts.append(hostname)
    return hosts


def refused_addresses() -> list[str]:
    """What a run never reaches, whatever ``allow`` says: the host's own addresses, the database
    and broker hosts of the settings, cloud metadata endpoints and slirp4netns' gateway."""
    refused = {*host_addresses(), *METADATA_V4, SLIRP_GATEWAY}
    for host in service_hosts():
        refused.update(resolve_ipv4(host))
    return sorted(refused)


def allowed_addresses(egress: Egress) -> list[str]:
    """The ``allow`` list as networks and addresses, its host names resolved now."""
    allowed = {str(network) for network in egress.networks}
    for host in egress.hosts:
        allowed.update(resolve_ipv4(host))
    return sorted(allowed)


def _nft_set(items: Iterable[str]) -> str:
    return ", ".join(items)


def nft_ruleset(egress: Egress, *, refused: Iterable[str], allowed: Iterable[str]) -> str:
    """The nftables rules loaded into a run's network namespace (egress open) before it starts.

    Output only (nothing can connect in: slirp4netns forwards no port). In order: the run's own
    loopback; no IPv6 (the namespace has no IPv6 route anyway); ``refused`` (never); DNS to
    slirp4netns' forwarder (any port-53 query is sent there, so the host's resolvers serve it
    whatever ``/etc/resolv.conf`` the run sees); ``allowed``; the non-public ranges (never); the
    rest, public addresses, only when ``internet`` is on. TCP is refused with a reset
    ("connection refused"), anything else with an ICMP "administratively prohibited".
    """
    refused = sorted(set(refused))
    allowed = sorted(set(allowed))
    non_public = _nft_set(str(network) for network in NON_PUBLIC_V4)
    lines = [
        "table ip tms_dns {",
        "  chain output {",
        "    type nat hook output priority -100; policy accept;",
        f"    ip daddr != 127.0.0.0/8 meta l4proto {{ tcp, udp }} th dport 53 dnat to {SLIRP_DNS}",
        "  }",
        "}",
        "table inet tms_egress {",
        "  set refused { type ipv4_addr; flags interval; auto-merge;"
        + (f" elements = {{ {_nft_set(refused)} }};" if refused else "")
        + " }",
        "  set allowed { type ipv4_addr; flags interval; auto-merge;"
        + (f" elements = {{ {_nft_set(allowed)} }};" if allowed else "")
        + " }",
        f"  set non_public {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {non_public} }}; }}",
        "  chain output {",
        "    type filter hook output priority 0; policy drop;",
        '    oif "lo" accept',
        "    meta nfproto ipv6 reject with icmpx type admin-prohibited",
        "    ip daddr @refused meta l4proto tcp reject with tcp reset",
        "    ip daddr @refused reject with icmpx type admin-prohibited",
        f"    ip daddr {SLIRP_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept",
        "    ip daddr @allowed accept",
        "    ip daddr @non_public meta l4proto tcp reject with tcp reset",
        "    ip daddr @non_public reject with icmpx type admin-prohibited",
    ]
    if egress.internet:
        lines.append("    accept")
    else:
        lines += ["    meta l4proto tcp reject with tcp reset", "    reject with icmpx type admin-prohibited"]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def network_plan(egress: Egress, mode: str) -> dict[str, Any] | None:
    """What the supervisor sets up for a run's network (run.json's ``network``): nothing in mode
    ``none`` (the worker's network) or in bwrap mode with egress closed (bubblewrap's namespace)."""
    if mode == "none" or (mode == "bwrap" and not egress.open):
        return None
    if not egress.open:
        return {"isolate": True, "egress": None}
    slirp, nft = slirp4netns_path(), nft_path()
    if slirp is None or nft is None:
        check_egress_tools()
    return {
        "isolate": True,
        "egress": {
            "slirp4netns": slirp,
            "nft": nft,
            "rules": nft_ruleset(egress, refused=refused_addresses(), allowed=allowed_addresses(egress)),
        },
    }
