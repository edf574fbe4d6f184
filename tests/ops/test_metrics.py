"""/metrics: protection, values that follow executions driven through the real worker and
monitor (counts match the database), and metrics written by other processes (multiprocess mode)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from executions import transitions
from executions.models import Execution, SkippedOccurrence, SkipReason
from executions.models import ExecutionStatus as S
from tests.factories import ExecutionFactory, TaskFactory
from tests.ops import prometheus
from tests.processes import (
    LOG_DIR,
    ROOT,
    ManagedProcess,
    process_env,
    run_command,
    running,
    start_monitor,
    start_worker,
    wait_for,
    wait_worker_ready,
)
from tests.web import free_port
from tms_core.conf import TmsSettings


def scrape(client: Client | None = None, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, keyed by (name, sorted labels)."""
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- protection -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_without_configuration_only_loopback(settings):
    assert Client().get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert refused.status_code == 403 and refused.json()["type"] == "permission_denied"
    assert Client().post("/metrics").status_code == 405


@pytest.mark.django_db
def test_token(settings):
    settings.TMS = {**settings.TMS, "METRICS_TOKEN": "s3cret-metrics-token"}
    remote = Client(REMOTE_ADDR="10.1.2.3")  # a token alone admits any address
    missing = remote.get("/metrics")
    assert missing.status_code == 401 and missing["WWW-Authenticate"].startswith("Bearer")
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Basic czNjcmV0").status_code == 401
    assert Client().get("/metrics").status_code == 401  # loopback needs it too once set
    samples = scrape(remote, HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert value(samples, "tms_metrics_database_up") == 1.0


@pytest.mark.django_db
def test_networks_and_token_together(settings):
    settings.TMS = {**settings.TMS, "METRICS_ALLOWED_NETWORKS": ("10.0.0.0/8",), "METRICS_TOKEN": "tok"}
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics", HTTP_AUTHORIZATION="Bearer tok").status_code == 200
    assert Client(REMOTE_ADDR="192.168.1.9").get("/metrics", HTTP_AUTHORIZATION="Bearer tok").status_code == 403
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 401
    # Loopback is not implied once networks are configured.
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer tok").status_code == 403


def test_a_bad_network_is_refused_at_start():
    with pytest.raises(ImproperlyConfigured, match="TMS_METRICS_ALLOWED_NETWORKS"):
        TmsSettings(METRICS_ALLOWED_NETWORKS=("10.0.0.0/33",))
    with pytest.raises(ImproperlyConfigured, match="TMS_METRICS_MAX_TASKS"):
        TmsSettings(METRICS_MAX_TASKS=-1)


@pytest.mark.django_db
def test_not_redirected_to_https_nor_host_checked(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["tms.example.com"]
    # Prometheus scrapes the container by name over plain HTTP.
    response = Client().get("/metrics", HTTP_HOST="web:8000")
    assert response.status_code == 200
    assert Client().get("/api/v1/tasks", HTTP_HOST="tms.example.com").status_code == 301  # the rest is


# --- values follow the platform ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_values_follow_executions_through_the_real_worker(api_client, settings):
    before = scrape()
    assert value(before, "tms_executions_total", runner="sleep", outcome="succeeded") == 0
    assert value(before, "tms_workers_alive") == 0

    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        ids = []
        for n in range(3):
            response = api_client.post(
                "/api/v1/tasks",
                {"name": f"ok-{n}", "runner": "sleep", "config": {"duration": "50ms"}, "expose_metrics": n == 0},
            )
            assert response.status_code == 201, response.data
            ids.append(response.data["id"])
        assert api_client.get(f"/api/v1/tasks/{ids[0]}").data["expose_metrics"] is True
        # One that fails for good: the subprocess runner, exit status 1, one attempt.
        response = api_client.post(
            "/api/v1/tasks",
            {"name": "bad", "runner": "subprocess", "config": {"command": ["false"]}, "max_attempts": 1},
        )
        assert response.status_code == 201, response.data
        wait_for(
            lambda: Execution.objects.filter(status__in=[S.SUCCEEDED, S.FAILED]).count() == 4,
            timeout=60,
            what="4 finished executions",
        )
        during = scrape()
        assert value(during, "tms_workers_alive") == 1
        # A pass of the monitor process shows up here (multiprocess mode).
        wait_for(
            lambda: value(scrape(), "tms_monitor_pass_duration_seconds_count") > 0, timeout=10, what="monitor passes"
        )
        assert value(scrape(), "tms_monitor_messages_published_total", kind="run") >= 4

    after = scrape()
    counts = dict(
        Execution.objects.values_list("task__runner", "status").annotate(n=Count("id")).values_list("status", "n")
    )
    assert counts == {S.SUCCEEDED: 3, S.FAILED: 1}
    assert value(after, "tms_executions_total", runner="sleep", outcome="succeeded") == 3
    assert value(after, "tms_executions_total", runner="subprocess", outcome="failed") == 1
    assert value(after, "tms_executions_total", runner="sleep", outcome="failed") == 0
    # Every finished attempt started: the histograms' +Inf buckets count them.
    assert value(after, "tms_execution_duration_seconds_bucket", runner="sleep", le="+Inf") == 3
    assert value(after, "tms_execution_lateness_seconds_bucket", runner="subprocess", le="+Inf") == 1
    # 50 ms sleeps: none under 10 ms, all under 25 s.
    assert value(after, "tms_execution_duration_seconds_bucket", runner="sleep", le="0.01") == 0
    assert value(after, "tms_execution_duration_seconds_bucket", runner="sleep", le="25.0") == 3
    for gauge in ("tms_executions_pending", "tms_executions_running", "tms_executions_due_backlog"):
        assert value(after, gauge) == 0
    # Only the task that opted in has a series, at its execution's finish time.
    exposed = {labels: v for (name, labels), v in after.items() if name == "tms_task_last_success_timestamp_seconds"}
    finished = Execution.objects.get(task_id=ids[0]).finished_at.timestamp()
    assert exposed == {(("task", "ok-0"), ("task_id", ids[0])): pytest.approx(finished, abs=1e-3)}
    assert value(after, "tms_tasks_metrics_opted_in") == 1

    # Other people's checkers on this scrape after real runs (issue 26). A skipped fire time too
    # (the row the materialiser writes for a missed one), so the dashboard's skipped panel has data.
    SkippedOccurrence.objects.create(
        task_id=ids[1], scheduled_for=timezone.now() - timedelta(minutes=1), reason=SkipReason.MISSED
    )
    text = Client().get("/metrics").content.decode()
    prometheus.promtool_check_metrics(text)
    # Every query of the shipped Grafana dashboard, against a real Prometheus fed by this scrape,
    # returns data: its metric names, labels and types are the ones served.
    with prometheus.prometheus_scraping(text) as base:
        empty = [expr for expr in prometheus.dashboard_queries() if not prometheus.query(base, expr)]
    assert not empty, f"dashboard queries without data: {empty}"


@pytest.mark.django_db
def test_the_cap_on_tasks_that_opt_in(settings):
    settings.TMS = {**settings.TMS, "METRICS_MAX_TASKS": 2}
    tasks = [TaskFactory(name=f"t{n}", expose_metrics=True) for n in range(3)]
    TaskFactory(name="quiet")  # not opted in: never a series
    samples = scrape()
    # No success yet: no series (never a made-up 0).
    assert not [k for k in samples if k[0] == "tms_task_last_success_timestamp_seconds"]
    for task in [*tasks, *TaskFactory._meta.model.objects.filter(name="quiet")]:
        ExecutionFactory(task=task, status=S.SUCCEEDED, finished_at=timezone.now())
    samples = scrape()
    series = sorted(dict(k[1])["task_id"] for k in samples if k[0] == "tms_task_last_success_timestamp_seconds")
    assert series == sorted(str(task.pk) for task in tasks)[:2]  # the cap, lowest ids first
    assert value(samples, "tms_tasks_metrics_opted_in") == 3


@pytest.mark.django_db(transaction=True)
def test_a_monitor_pass_in_another_process_shows_up():
    before = value(scrape(), "tms_monitor_pass_duration_seconds_count")
    result = run_command("run_monitor", "--passes", "3")
    assert result.returncode == 0, result.stderr
    assert value(scrape(), "tms_monitor_pass_duration_seconds_count") == before + 3


@pytest.mark.django_db
def test_the_grafana_dashboard_uses_only_metrics_that_exist():
    import json
    import re

    from tests.processes import ROOT

    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "tms.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\btms_[a-z_]+", expr)}
    # Families with no sample yet (no runner has run) are announced all the same.
    families = text_string_to_metric_families(Client().get("/metrics").content.decode())
    served = {family.name + suffix for family in families for suffix in ("", "_total", "_bucket", "_count")}
    assert used and used <= served, used - served


def _procfile_command(process: str) -> str:
    """The command `make run` starts for ``process`` (honcho runs it through the shell)."""
    (line,) = [
        line for line in (ROOT / "tms_project" / "Procfile").read_text().splitlines() if line.startswith(process + ":")
    ]
    return line.removeprefix(process + ":").strip()


def _family_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text) if family.samples}


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_flower_and_tms_each_export_only_their_own_metrics():
    """Flower as `make run` starts it (the Procfile's line, given the multiprocess folder the TMS
    processes share) watching a real worker: its /metrics has Flower's series and none of TMS's
    (issue 26: 58 tms_* series frozen at 0 under the Flower job), and TMS's /metrics has none of
    Flower's (they came through the shared folder)."""
    import requests

    port = free_port()
    flower = ManagedProcess(
        "flower-make-run",
        ["sh", "-c", _procfile_command("flower")],
        # make run's own environment (Makefile): the virtualenv first on PATH.
        process_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", FLOWER_PORT=str(port)),
        LOG_DIR,
    )
    worker = start_worker("flower-watched", concurrency=1)
    with running(flower, worker):
        wait_worker_ready(worker)

        def flower_sees_the_worker() -> str | None:
            assert flower.alive, flower.log()[-3000:]
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                return None
            return text if "flower_worker_online{" in text else None

        flower_text = str(wait_for(flower_sees_the_worker, timeout=60, interval=0.5, what="Flower to see the worker"))
        # Written by the worker process into the folder (a Celery worker imports TMS's metrics).
        tms_text = Client().get("/metrics").content.decode()

    flower_families, tms_families = _family_names(flower_text), _family_names(tms_text)
    assert "flower_worker_online" in flower_families
    assert not {name for name in flower_families if name.startswith("tms_")}, flower_families
    assert {"tms_monitor_messages_published", "tms_workers_alive"} <= tms_families
    assert not {name for name in tms_families if name.startswith("flower_")}, tms_families


@pytest.mark.django_db
def test_the_due_backlog_counts_runs_held_back_by_a_limit():
    base = timezone.now() - timedelta(minutes=2)
    task = TaskFactory(max_concurrency=1, start_at=base, interval=timedelta(seconds=10))

    def on_the_grid(k: int) -> Execution:
        return ExecutionFactory(
            task=task, scheduled_for=base + timedelta(seconds=10 * k), status=S.PENDING, exclusive=True, message_id="m"
        )

    def claim(execution: Execution, worker: str) -> str:
        return transitions.execution_claim_exclusive(
            execution_id=execution.pk, attempt=1, worker_id=worker, lease_seconds=60
        ).outcome

    assert claim(on_the_grid(0), "w0") == "claimed"
    held = [on_the_grid(1), on_the_grid(2)]
    assert [claim(e, f"w{k}") for k, e in reversed(list(enumerate(held, 1)))] == ["waiting", "waiting"]
    assert not Execution.objects.filter(status=S.SCHEDULED, due_at__lte=timezone.now()).exists()  # re-checks ahead
    assert value(scrape(), "tms_executions_due_backlog") == 2
