"""docker/compose.ha.yaml, the opt-in highly available stack (issue 45): it passes the Compose
specification's schema, its topology is the one tests/ha runs (etcd, a Patroni pair behind
HAProxy, three clustered RabbitMQ nodes, quorum queues), its TMS roles are compose.yaml's with
other addresses, and each role's own configuration is accepted by the program that runs it:
``haproxy -c`` for docker/haproxy/haproxy.cfg, ``patroni --validate-config`` and a real start of a
Patroni node for docker/patroni/. (No Docker engine here: tests/ha runs the same HAProxy file and
Patroni timings under load.)"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import yaml

from tests.ops.test_docker_files import APP_ROLES, DOCKER, _tool
from tooling.harness.servers import free_ports, kill_session, listening

PATRONI_DIR = DOCKER / "patroni"
#: The variables that are secrets, and the services each may reach.
SECRETS = {
    "POSTGRES_PASSWORD": {"patroni1", "patroni2", "migrate", "web", "worker", "beat", "monitor"},
    "POSTGRES_SUPERUSER_PASSWORD": {"patroni1", "patroni2"},
    "POSTGRES_REPLICATION_PASSWORD": {"patroni1", "patroni2"},
    "RABBITMQ_PASSWORD": {"rabbit1", "rabbit2", "rabbit3", "migrate", "web", "worker", "beat", "monitor", "flower"},
    "RABBITMQ_ERLANG_COOKIE": {"rabbit1", "rabbit2", "rabbit3"},
    "FLOWER_BASIC_AUTH": {"flower"},
    "TMS_METRICS_TOKEN": {"web"},
    "DJANGO_SECRET_KEY": APP_ROLES,
    "TMS_SECRET_KEYS": APP_ROLES,
}
#: What a TMS role of the HA stack may differ in from compose.yaml's: the addresses it is given.
ADDRESSES = {"DATABASE_URL", "CELERY_BROKER_URL", "TMS_QUEUE_TYPE"}


def _load(name: str) -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


@pytest.fixture(scope="module")
def ha() -> dict:
    return _load("compose.ha.yaml")


def test_the_ha_compose_file_validates_against_the_compose_specification_schema():
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DOCKER / "compose.ha.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_the_ha_topology(ha):
    services = ha["services"]
    assert set(services) == APP_ROLES | {
        *(f"etcd{n}" for n in (1, 2, 3)),
        "patroni1",
        "patroni2",
        "haproxy",
        *(f"rabbit{n}" for n in (1, 2, 3)),
    }
    assert ha["name"] != _load("compose.yaml")["name"]  # volumes of its own, beside the single stack
    # etcd: three members, each named in the initial cluster at its own address.
    cluster = services["etcd1"]["environment"]["ETCD_INITIAL_CLUSTER"]
    for n in (1, 2, 3):
        env = services[f"etcd{n}"]["environment"]
        assert env["ETCD_NAME"] == services[f"etcd{n}"]["hostname"] == f"etcd{n}"
        assert f"etcd{n}=http://etcd{n}:2380" in cluster and env["ETCD_INITIAL_CLUSTER"] == cluster
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == f"http://etcd{n}:2380"
    # Patroni: two nodes of one scope, on the three etcd members, each advertising its own name.
    for n in (1, 2):
        env = services[f"patroni{n}"]["environment"]
        assert env["PATRONI_NAME"] == services[f"patroni{n}"]["hostname"] == f"patroni{n}"
        assert env["PATRONI_SCOPE"] == "tms"
        assert env["PATRONI_ETCD3_HOSTS"] == "etcd1:2379,etcd2:2379,etcd3:2379"
        assert env["PATRONI_RESTAPI_CONNECT_ADDRESS"] == f"patroni{n}:8008"
        assert env["PATRONI_POSTGRESQL_CONNECT_ADDRESS"] == f"patroni{n}:5432"
        assert services[f"patroni{n}"]["build"] == {"context": "..", "dockerfile": "docker/patroni/Dockerfile"}
        assert services[f"patroni{n}"]["volumes"] == [f"patroni{n}-data:/var/lib/postgresql/data"]
    # HAProxy runs the file tests/ha runs, whose defaults are these names and ports.
    assert services["haproxy"]["volumes"] == ["./haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    config = (DOCKER / "haproxy" / "haproxy.cfg").read_text()
    for n in (1, 2):
        assert f'"${{PATRONI{n}_ADDR-patroni{n}:5432}}"' in config and f'"${{PATRONI{n}_REST-8008}}"' in config
    assert '"${WRITE_BIND-:5432}"' in config
    # RabbitMQ: three nodes, named as the peer discovery file names them, all given it.
    discovery = (DOCKER / "rabbitmq" / "cluster.conf").read_text()
    assert "cluster_formation.peer_discovery_backend = classic_config" in discovery
    for n in (1, 2, 3):
        service = services[f"rabbit{n}"]
        assert service["hostname"] == f"rabbit{n}"
        assert f"cluster_formation.classic_config.nodes.{n} = rabbit@rabbit{n}" in discovery
        assert "./rabbitmq/cluster.conf:/etc/rabbitmq/conf.d/20-tms-cluster.conf:ro" in service["volumes"]
        assert "-setcookie ${RABBITMQ_ERLANG_COOKIE" in service["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
        assert "-setcookie ${RABBITMQ_ERLANG_COOKIE" in service["environment"]["RABBITMQ_CTL_ERL_ARGS"]
    # TMS: the database through HAProxy, the broker as the three nodes' failover list, quorum queues.
    for role in APP_ROLES:
        env = services[role]["environment"]
        if role != "flower":
            assert re.fullmatch(r"postgres://tms:\$\{POSTGRES_PASSWORD[^}]*\}@haproxy:5432/tms", env["DATABASE_URL"])
        assert [url.split("@")[1] for url in env["CELERY_BROKER_URL"].split(";")] == [
            f"rabbit{n}:5672/tms" for n in (1, 2, 3)
        ]
        assert env["TMS_QUEUE_TYPE"] == "quorum"


def test_the_ha_tms_roles_are_compose_yamls_but_for_their_addresses(ha):
    """The HA file repeats the TMS roles (a second compose file cannot take a service away from a
    first): they must not drift from compose.yaml's."""
    single = _load("compose.yaml")["services"]
    for role in APP_ROLES:
        mine, theirs = dict(ha["services"][role]), dict(single[role])
        assert {k: v for k, v in mine["environment"].items() if k not in ADDRESSES} == {
            k: v for k, v in theirs["environment"].items() if k not in ADDRESSES
        }, role
        for service in (mine, theirs):
            del service["environment"]
            service.pop("depends_on", None)
        assert mine == theirs, role


def test_the_ha_start_up_order(ha):
    services = ha["services"]
    healthy = {"condition": "service_healthy"}
    assert services["migrate"]["depends_on"] == {"haproxy": healthy}
    for role in ("web", "worker", "beat", "monitor"):
        assert services[role]["depends_on"] == {
            "haproxy": healthy,
            **{f"rabbit{n}": healthy for n in (1, 2, 3)},
            "migrate": {"condition": "service_completed_successfully"},
        }, role
    for n in (1, 2):
        assert services[f"patroni{n}"]["depends_on"] == {f"etcd{m}": healthy for m in (1, 2, 3)}
    # HAProxy's health is "routes to the primary alone": its check reads the status page it serves.
    check = " ".join(services["haproxy"]["healthcheck"]["test"])
    assert "/dev/tcp/127.0.0.1/8404" in check and "GET /;csv" in check
    assert '"${STATS_BIND-:8404}"' in (DOCKER / "haproxy" / "haproxy.cfg").read_text()
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)
    declared = set(ha["volumes"])
    used = {v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if not v.startswith(".")}
    assert used == declared


def test_each_ha_service_gets_only_the_secrets_it_needs(ha):
    for name, service in ha["services"].items():
        files = service.get("env_file", [])
        paths = [entry if isinstance(entry, str) else entry["path"] for entry in files]
        assert set(paths) <= {"tms.env"}, (name, paths)
        text = yaml.safe_dump(service.get("environment") or {}) + " ".join(map(str, service.get("command", [])))
        given = {secret for secret in SECRETS if secret in (service.get("environment") or {})}
        given |= {secret for secret in SECRETS if f"${{{secret}" in text}
        wanted = {secret for secret, services in SECRETS.items() if name in services}
        assert given == wanted, (name, given ^ wanted)


def test_the_env_example_names_every_variable_the_ha_compose_file_needs():
    needed = set(re.findall(r"\$\{(\w+)", (DOCKER / "compose.ha.yaml").read_text()))
    given = set(re.findall(r"^#? ?(\w+)=", (DOCKER / ".env.example").read_text(), flags=re.MULTILINE))
    assert needed <= given, needed - given
    assert {"POSTGRES_SUPERUSER_PASSWORD", "POSTGRES_REPLICATION_PASSWORD", "RABBITMQ_ERLANG_COOKIE"} <= needed


def test_haproxy_accepts_its_configuration_with_the_compose_addresses(tmp_path):
    """``haproxy -c`` with no variable set: the compose stack's names (unresolvable here, so
    HAProxy warns that it will look them up at run time, as init-addr allows)."""
    env = {"PATH": os.environ["PATH"]}
    result = subprocess.run(
        ["/usr/sbin/haproxy", "-c", "-f", str(DOCKER / "haproxy" / "haproxy.cfg")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr


def test_the_patroni_image_pins_debians_patroni_and_passes_hadolint():
    text = (PATRONI_DIR / "Dockerfile").read_text()
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "patroni"], capture_output=True, text=True, check=True
    ).stdout
    assert f"patroni={installed} " in text  # the version tests/ha runs
    assert 'ENTRYPOINT ["patroni", "/etc/patroni/patroni.yml"]' in text and "USER 999:999" in text
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", str(PATRONI_DIR / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def _address() -> str:
    """An address of this machine that is not loopback (Patroni refuses loopback as the address
    its peers reach it at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: the route's source address
            address = sock.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback, which Patroni refuses")
    return address


@pytest.fixture
def patroni_node(ha) -> Iterator[dict]:
    """patroni1's environment from compose.ha.yaml, with this machine's addresses, free ports and
    a folder of its own in place of the container's, and a private etcd on a free port."""
    address = _address()
    etcd_port, etcd_peer, pg_port, rest_port = free_ports(4)
    root = Path(tempfile.mkdtemp(prefix="tms-docker-patroni-", dir="/tmp"))
    user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    secrets = {
        "POSTGRES_PASSWORD": "tms-password",
        "POSTGRES_SUPERUSER_PASSWORD": "super-password",
        "POSTGRES_REPLICATION_PASSWORD": "replication-password",
    }
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "LANG": "C.UTF-8"}
    for key, value in ha["services"]["patroni1"]["environment"].items():
        env[key] = re.sub(r"\$\{(\w+)[^}]*\}", lambda m: secrets[m.group(1)], str(value))
    env.update(
        PATRONI_ETCD3_HOSTS=f"127.0.0.1:{etcd_port}",
        PATRONI_RESTAPI_LISTEN=f"{address}:{rest_port}",
        PATRONI_RESTAPI_CONNECT_ADDRESS=f"{address}:{rest_port}",
        PATRONI_POSTGRESQL_LISTEN=f"{address}:{pg_port}",
        PATRONI_POSTGRESQL_CONNECT_ADDRESS=f"{address}:{pg_port}",
        PATRONI_POSTGRESQL_DATA_DIR=str(root / "pgdata"),
        PATRONI_POSTGRESQL_PGPASS=str(root / "pgpass"),
        PATRONI_LOG_DIR=str(root),
    )
    # The post_bootstrap script's path in the image, and the socket folder, are the container's
    # (here the latter is the shared server's): a copy of the configuration names this checkout's
    # script and a private socket folder, and nothing else changes.
    config = yaml.safe_load((PATRONI_DIR / "patroni.yml").read_text())
    config["bootstrap"]["post_bootstrap"] = str(PATRONI_DIR / "post_bootstrap.sh")
    config["postgresql"]["parameters"]["unix_socket_directories"] = str(root)
    (root / "patroni.yml").write_text(yaml.safe_dump(config))
    kwargs: dict = {}
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
        os.chown(root / "patroni.yml", user.pw_uid, user.pw_gid)
        env.update(USER="postgres", LOGNAME="postgres")
        kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
    etcd = subprocess.Popen(
        [
            "etcd",
            "--name=docker-test",
            f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=docker-test=http://127.0.0.1:{etcd_peer}",
            "--log-level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=root,
        **kwargs,
    )
    node: dict = {"env": env, "root": root, "kwargs": kwargs, "address": address, "pg_port": pg_port}
    try:
        deadline = time.monotonic() + 30
        while not listening(etcd_port):
            assert etcd.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.1)
        yield node
    finally:
        for popen in [node.get("patroni"), etcd]:
            if popen is not None:
                kill_session(popen.pid)
                popen.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_patroni_validates_its_configuration_and_bootstraps_the_tms_database(patroni_node):
    """docker/patroni/patroni.yml with patroni1's environment from the compose file passes
    ``patroni --validate-config``, and a node started with it initialises a primary on which the
    post_bootstrap script created the tms role (its password, over TCP with scram-sha-256) and
    database."""
    env, root, kwargs = patroni_node["env"], patroni_node["root"], patroni_node["kwargs"]
    config = str(root / "patroni.yml")
    result = subprocess.run(
        ["patroni", "--validate-config", config], env=env, capture_output=True, text=True, timeout=60, **kwargs
    )
    assert result.returncode == 0, result.stdout + result.stderr
    patroni_node["patroni"] = subprocess.Popen(
        ["patroni", config],
        env=env,
        cwd=root,
        stdout=open(root / "patroni.out", "wb"),  # noqa: SIM115 - the child keeps it
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **kwargs,
    )
    dsn = f"host={patroni_node['address']} port={patroni_node['pg_port']} dbname=tms user=tms connect_timeout=2"
    deadline = time.monotonic() + 90
    while True:
        try:
            conn = psycopg2.connect(dsn, password="tms-password")
            break
        except psycopg2.OperationalError as exc:
            error = str(exc)
        log = (root / "patroni.out").read_text(errors="replace")
        assert patroni_node["patroni"].poll() is None, log[-3000:]
        assert time.monotonic() < deadline, f"{error}\n{log[-3000:]}"
        time.sleep(0.5)
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT pg_is_in_recovery(), current_user, (SELECT datdba::regrole::text FROM pg_database"
                " WHERE datname = 'tms'), current_setting('password_encryption')"
            )
            assert cursor.fetchone() == (False, "tms", "tms", "scram-sha-256")
    finally:
        conn.close()
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(dsn, password="wrong")


class _FakePatroni:
    """An HTTP server answering ``GET /primary`` with a status a test sets, as a Patroni REST API
    does (200 on the primary, 503 elsewhere): enough for HAProxy's check."""

    def __init__(self) -> None:
        import http.server
        import threading

        owner = self
        self.status = 503

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(owner.status if self.path == "/primary" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        # Its "PostgreSQL": a listener that sends its own port to each connection, so a client of
        # HAProxy's write port can tell which server it reached.
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.pg_port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            # A peer that resets first (HAProxy dropping a connection it had opened while two
            # servers counted as up) must not end the loop: the next client would wait in the
            # backlog unanswered (a flaky timeout in CI on 2026-12-07).
            with conn, contextlib.suppress(OSError):
                conn.sendall(str(self.pg_port).encode())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.listener.close()


def _reached(port: int) -> int | None:
    """The fake server a connection to HAProxy's write ``port`` reached, None when HAProxy closed it."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            data = sock.recv(16)
    except ConnectionResetError:  # the reject rule: HAProxy resets the connection
        return None
    return int(data) if data else None


def test_haproxys_health_check_is_healthy_only_while_it_routes_to_one_primary(ha, tmp_path):
    """The compose health check of the haproxy service (bash reading the status page's CSV), run
    against HAProxy with docker/haproxy/haproxy.cfg in front of two fake Patroni nodes: healthy
    with one primary; unhealthy with none, and with two (a server HAProxy has not checked yet
    counts as up, so right after its start both would). The write port passes connections on to
    the one primary, and refuses them while no member or two count as up."""
    script = ha["services"]["haproxy"]["healthcheck"]["test"][3].replace("$$", "$")
    write, stats, dns = free_ports(3)
    fakes = [_FakePatroni(), _FakePatroni()]
    env = {"PATH": os.environ["PATH"], "WRITE_BIND": f"127.0.0.1:{write}", "STATS_BIND": f"127.0.0.1:{stats}"}
    env["RESOLVER"] = f"127.0.0.1:{dns}"
    for number, fake in enumerate(fakes, start=1):
        env[f"PATRONI{number}_ADDR"] = f"127.0.0.1:{fake.pg_port}"
        env[f"PATRONI{number}_REST"] = str(fake.port)
    haproxy = subprocess.Popen(
        ["/usr/sbin/haproxy", "-db", "-f", str(DOCKER / "haproxy" / "haproxy.cfg")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def healthy() -> bool:
        check = script.replace("/dev/tcp/127.0.0.1/8404", f"/dev/tcp/127.0.0.1/{stats}")
        return subprocess.run(["bash", "-c", check], capture_output=True, timeout=10).returncode == 0

    def becomes(wanted: bool) -> bool:
        deadline = time.monotonic() + 10
        while healthy() != wanted:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    try:
        deadline = time.monotonic() + 10
        while not listening(write):
            assert haproxy.poll() is None and time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)
        fakes[0].status = 200
        assert becomes(True)  # one primary: patroni1 UP, patroni2 DOWN
        assert {_reached(write) for _ in range(5)} == {fakes[0].pg_port}
        fakes[1].status = 200
        assert becomes(False)  # both answer 200: two servers would take connections
        assert _reached(write) is None
        fakes[0].status = 503
        assert becomes(True)  # the failover done: patroni2 alone
        assert {_reached(write) for _ in range(5)} == {fakes[1].pg_port}
        fakes[1].status = 503
        assert becomes(False)  # no primary
        # Refused once its checks have failed twice (fall 2), 250 ms apart (fastinter).
        deadline = time.monotonic() + 5
        while _reached(write) is not None:
            assert time.monotonic() < deadline, "still passed on with no primary"
            time.sleep(0.05)
    finally:
        haproxy.kill()
        haproxy.wait(10)
        for fake in fakes:
            fake.close()
