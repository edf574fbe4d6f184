"""OpenTelemetry tracing (issue 49): spans exported over real OTLP (HTTP/protobuf) to a receiver
started here, which decodes the wire messages (opentelemetry-proto) and checks their shape.

- One run through real web, monitor and worker processes: one trace, continued from the API call
  that created it; the run's spans in order, parents right; its pool process SIGKILLed inside the
  runner's launch, and the resumed run stays in the trace; the http runner's target receives a
  traceparent of the run's trace.
- A workflow run (in this process): its steps' runs are children of the workflow run's span.
- A run's tracestate (from the request that created it) reaches its http target and every runner.
- At a sampler that keeps nothing, a run makes no span and still hands its trace on (unsampled);
  SQL/client spans only under a sampled span, Celery's only for messages of a sampled trace.
- Tracing off: no opentelemetry module imported.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from rest_framework.test import APIClient

from executions import transitions, worker_services
from executions.callbacks import callback_token
from executions.materialiser import materialise_due
from executions.models import Execution
from executions.models import ExecutionStatus as S
from notifications import dispatch as notification_dispatch
from notifications import services as notification_services
from runners.aws_lambda import _metadata
from runners.base import RunSpec
from runners.function import AsyncHttpFunctionRunner
from runners.kubernetes import KubernetesRunner
from tasks_api.creation import task_create
from tests.conftest import account_key_for
from tests.factories import TaskFactory, UserFactory
from tests.notifications.receiver import webhook_receiver
from tests.processes import ROOT, process_env, running, start_monitor, start_worker, wait_for, wait_worker_ready
from tests.web import start_web
from tests.workflows import after
from tms_core import tracing

# --- the OTLP receiver ---------------------------------------------------------------------------


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent: str
    start: int
    end: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    #: (code, message): 0 unset, 1 ok, 2 error.
    status: tuple[int, str] = (0, "")
    trace_state: str = ""


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def decode(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        spans = []
        for resource_spans in message.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            name=span.name,
                            service=resource.get("service.name", ""),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent=span.parent_span_id.hex(),
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            status=(span.status.code, span.status.message),
                            trace_state=span.trace_state,
                        )
                    )
        with self.lock:
            self.requests += 1
            self.spans += spans

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def named(self, name: str, trace_id: str | None = None) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name and (trace_id is None or s.trace_id == trace_id)]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP traces receiver on 127.0.0.1: POST /v1/traces, protobuf bodies."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
            if ok:
                got.decode(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    got.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


# --- an async http endpoint that stalls its first launch ----------------------------------------


class Target:
    """202 + a status URL; the first POST waits until :attr:`release` is set (the test kills the
    worker's pool process meanwhile); the status says running until :attr:`done` is set."""

    def __init__(self) -> None:
        self.traceparents: list[tuple[str, str]] = []
        self.posted = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any], location: str = "") -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if location:
                    self.send_header("Location", location)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target.traceparents.append(("POST", self.headers.get("traceparent", "")))
                first = not target.posted.is_set()
                target.posted.set()
                if first:
                    target.release.wait(30)
                self._answer(202, {"status": "accepted"}, location="/status/1")

            def do_GET(self) -> None:
                target.traceparents.append(("GET", self.headers.get("traceparent", "")))
                status = "succeeded" if target.done.is_set() else "running"
                self._answer(200, {"status": status, "output": "report ready"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


FAST = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "3", "TMS_MONITOR_MAX_SLEEP": "0.3"}
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _pool_pid(execution: Execution) -> int:
    """The pool process holding the run's lease (``host:pid:childpid``)."""
    return int(Execution.objects.get(pk=execution.pk).lease_owner.rsplit(":", 1)[1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_one_trace_per_run_across_web_monitor_and_worker_and_a_killed_pool_process(receiver):
    owner = UserFactory()
    key = account_key_for(owner)
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "TMS_PUBLIC_URL": "http://127.0.0.1:9",
    }
    target = Target()
    web, base = start_web(workers=1, **otel)
    worker = start_worker(concurrency=1, **FAST, **otel)
    try:
        with running(worker, start_monitor(**FAST, **otel)):
            wait_worker_ready(worker)
            # The caller's own trace: the API call continues it, and the run with it.
            response = requests.post(
                f"{base}/api/v1/tasks",
                json={
                    "name": "traced",
                    "runner": "http",
                    "config": {"url": target.url + "/job", "method": "POST", "json": {"day": 1}, "async": True},
                },
                headers={"Authorization": f"Token {key}", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
                timeout=30,
            )
            assert response.status_code == 201, response.text
            execution = Execution.objects.get(task_id=response.json()["id"])
            assert execution.traceparent.startswith(f"00-{CALLER_TRACE}-")
            # Kill the pool process inside the runner's launch: the run is resumed by the next
            # pool process, which launches again (same idempotency key), then polls.
            assert target.posted.wait(20), Execution.objects.values("status", "error", "output").get(pk=execution.pk)
            killed = _pool_pid(execution)
            os.kill(killed, signal.SIGKILL)
            target.release.set()
            wait_for(lambda: Execution.objects.get(pk=execution.pk).external_run_id, timeout=20, what="the relaunch")
            target.done.set()
            wait_for(lambda: Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED, timeout=20, what="SUCCEEDED")
            wait_for(lambda: receiver.named("tms.execution", CALLER_TRACE), timeout=10, what="the run's root span")
    finally:
        web.stop()
        target.close()
    execution.refresh_from_db()
    assert execution.attempt == 1 and execution.handbacks >= 1

    spans = receiver.trace(CALLER_TRACE)
    by_id = {span.span_id: span for span in spans}
    (request,) = [s for s in spans if s.service == "tms-web" and s.parent == CALLER_SPAN]
    (root,) = [s for s in spans if s.name == "tms.execution"]
    # The run's root: a child of the API call that created it, from its due time to its end.
    assert root.parent == request.span_id and root.service == "tms-worker"
    assert root.attributes["tms.execution_id"] == execution.pk and root.attributes["tms.status"] == "SUCCEEDED"
    children = {name: [s for s in spans if s.name == name and s.parent == root.span_id] for name in _RUN_SPANS}
    (taken,) = children["tms.execution.taken"]
    publishes = children["tms.execution.publish"]
    starts = [s for s in children["tms.runner.start"] if s.end]
    polls = children["tms.runner.poll"]
    (outcome,) = children["tms.execution.outcome"]
    claims = children["tms.execution.claim"]
    assert {s.service for s in [taken, *publishes]} == {"tms-monitor"}
    assert {s.service for s in [*claims, *starts, *polls, outcome]} == {"tms-worker"}
    # Leased again after the kill: the resume's claim, then its launch (the first claim may have
    # died with its process, before its span was exported).
    assert any(c.attributes["tms.resumed"] and not c.attributes["tms.worker"].endswith(f":{killed}") for c in claims)
    assert min(c.start for c in claims if c.attributes["tms.resumed"]) <= max(s.start for s in starts)
    # The launch that finished was the resumed one, in another pool process than the killed one.
    assert [s.attributes["tms.process"] for s in starts] and killed not in [s.attributes["tms.process"] for s in starts]
    assert publishes[0].attributes["tms.dispatch"] == "run"
    assert any(s.attributes["tms.dispatch"] == "poll" for s in publishes)  # the hand-back and the polls
    # In order: taken, published, launched, polled, recorded, ended.
    assert root.start <= taken.end <= publishes[0].start <= min(s.start for s in starts)
    assert max(s.end for s in starts) <= min(s.start for s in polls) <= max(s.end for s in polls) <= outcome.start
    assert outcome.end <= root.end
    assert polls[-1].attributes["tms.result"] == "succeeded"
    # The runner's HTTP calls (requests' instrumentation) are children of the launch and polls.
    http_parents = {by_id[s.parent].name for s in spans if s.name in ("POST", "GET") and s.parent in by_id}
    assert http_parents == {"tms.runner.start", "tms.runner.poll"}
    # The target got the run's trace with every request.
    assert target.traceparents and all(tp.split("-")[1] == CALLER_TRACE for _, tp in target.traceparents)
    # Its log lines meet the trace.
    assert f"trace_id={CALLER_TRACE}" in worker.log()
    # The monitor's passes are traces of their own, linked to the run.
    passes = receiver.named("tms.monitor.pass")
    assert passes and all(p.trace_id != CALLER_TRACE for p in passes)
    assert any((CALLER_TRACE, root.span_id) in p.links for p in passes)


_RUN_SPANS = (
    "tms.execution.taken",
    "tms.execution.publish",
    "tms.execution.claim",
    "tms.runner.start",
    "tms.runner.poll",
    "tms.execution.outcome",
)


@pytest.fixture
def traced(receiver) -> Iterator[Receiver]:
    """Tracing on in this process, exporting over OTLP to ``receiver`` (no instrumentations)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    tracing.setup(exporter=OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"), instrument=False, salt="test")
    try:
        yield receiver
    finally:
        tracing.reset()


def _run_due() -> int:
    ran = 0
    for dispatch in transitions.executions_take_due(limit=10, actor="monitor"):
        worker_services.execution_run(execution_id=dispatch.execution_id, attempt=dispatch.attempt, worker_id="w1")
        ran += 1
    return ran


@pytest.mark.django_db
def test_a_workflows_steps_are_children_of_its_workflow_run(traced, user):
    first = task_create(owner=user, runner="noop")
    second = task_create(owner=user, runner="noop", after=after((first, "success")))
    third = task_create(owner=user, runner="noop", after=after((second, "success")))
    assert [_run_due() for _ in range(4)] == [1, 1, 1, 0]
    tracing.flush()

    runs = {run.task_id: run for run in Execution.objects.all()}
    root_run = runs[first.pk]
    assert all(run.status == S.SUCCEEDED and run.workflow_run == root_run.pk for run in runs.values())
    roots = {span.attributes["tms.execution_id"]: span for span in traced.named("tms.execution")}
    (workflow,) = traced.named("tms.workflow_run")
    first_root = roots[root_run.pk]
    # One trace; the workflow run's span a child of its first run's; each step's run its child.
    assert {span.trace_id for span in [*roots.values(), workflow]} == {first_root.trace_id}
    assert workflow.parent == first_root.span_id and first_root.parent == ""
    for task in (second, third):
        assert roots[runs[task.pk].pk].parent == workflow.span_id
    assert workflow.start <= first_root.start and workflow.end >= max(span.end for span in roots.values())
    # Every span of a run is a child of its root; a scheduled run links its task.
    for span in traced.trace(first_root.trace_id):
        if span.name in _RUN_SPANS:
            assert span.parent in {root.span_id for root in roots.values()}
    assert len(first_root.links) == 1
    # Derived ids: the same run gives the same trace in any process.
    assert tracing.run_ids(root_run.pk).trace_hex == first_root.trace_id


@pytest.mark.django_db
def test_a_scheduled_run_starts_its_own_trace_linked_to_its_task(traced, user):
    task = task_create(owner=user, runner="noop", tracing_id="0af7651916cd43dd8448eb211c80319c")
    (run,) = Execution.objects.filter(task=task)
    assert run.traceparent == ""  # no traced request created it
    _run_due()
    tracing.flush()
    (root,) = traced.named("tms.execution")
    assert root.parent == "" and root.trace_id == tracing.run_ids(run.pk).trace_hex
    assert root.links[0][0] == "0af7651916cd43dd8448eb211c80319c"  # its task's tracing_id, as a trace id
    assert root.attributes["tms.tracing_id"] == "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.django_db
def test_a_runs_retries_stay_in_its_trace(traced, user):
    task = task_create(owner=user, runner="subprocess", config={"command": ["false"]}, max_attempts=2)
    assert _run_due() == 1
    (run,) = Execution.objects.filter(task=task)
    assert (run.status, run.attempt) == (S.SCHEDULED, 2)
    Execution.objects.filter(pk=run.pk).update(due_at=run.created_at)  # its backoff, skipped
    assert _run_due() == 1
    tracing.flush()

    trace = tracing.run_ids(run.pk).trace_hex
    (root,) = traced.named("tms.execution")
    outcomes = sorted(traced.named("tms.execution.outcome"), key=lambda span: span.start)
    starts = sorted(traced.named("tms.runner.start"), key=lambda span: span.start)
    assert {span.trace_id for span in [root, *outcomes, *starts]} == {trace}
    assert [span.attributes["tms.status"] for span in outcomes] == ["SCHEDULED", "FAILED"]
    assert [span.attributes["tms.attempt"] for span in starts] == [1, 2]
    assert root.attributes["tms.attempt"] == 2 and root.attributes["tms.status"] == "FAILED"
    assert root.status[0] == 2 and "exit" in root.status[1]  # an error, with the run's error
    assert all(span.parent == root.span_id for span in [*outcomes, *starts])


@pytest.mark.django_db
def test_a_subprocess_run_gets_the_launchs_traceparent_in_its_environment(traced, user):
    task = task_create(owner=user, runner="subprocess", config={"command": ["/usr/bin/env"]})
    assert _run_due() == 1
    (run,) = Execution.objects.filter(task=task)
    tracing.flush()
    (start,) = traced.named("tms.runner.start")
    assert run.status == S.SUCCEEDED
    assert f"TRACEPARENT=00-{start.trace_id}-{start.span_id}-01" in run.output.splitlines()
    assert start.trace_id == tracing.run_ids(run.pk).trace_hex


@pytest.mark.django_db
def test_a_materialiser_pass_is_a_trace_of_its_own_and_its_runs_start_their_own(traced, user):
    task = task_create(owner=user, runner="noop", interval=timedelta(seconds=10))
    before = Execution.objects.filter(task=task).count()
    with tracing.pass_span("tms.test.outer"):  # a traced caller (beat's Celery task, here)
        created = materialise_due(horizon=120)
    assert materialise_due(horizon=120) == 0  # nothing to do: no span
    tracing.flush()

    assert created > 0 and Execution.objects.filter(task=task).count() == before + created
    assert set(Execution.objects.filter(task=task).values_list("traceparent", flat=True)) == {""}
    (materialised,) = traced.named("tms.materialiser.pass")
    (outer,) = traced.named("tms.test.outer")
    assert materialised.attributes["tms.created"] == created and materialised.trace_id != outer.trace_id


@pytest.mark.django_db
def test_a_notification_delivery_is_a_trace_of_its_own_linked_to_its_run(traced):
    task = TaskFactory()
    with webhook_receiver() as hook:
        channel = notification_services.channel_create(
            owner=task.owner, data={"name": "ops", "kind": "webhook", "target": hook.url}
        )
        notification_services.rule_create(owner=task.owner, data={"task": task, "channel": channel, "on_failure": True})
        (run_id,) = transitions.executions_create(
            rows=[transitions.NewExecution(task.pk, task.created_at, task.priority)], actor="t"
        )
        transitions.executions_take_due(limit=10, actor="monitor")
        assert transitions.execution_claim_loaded(execution_id=run_id, attempt=1, worker_id="w", lease_seconds=60)
        transitions.execution_fail(
            execution_id=run_id, attempt=1, worker_id="w", error="boom", output="", retry_in=None, max_chars=100
        )
        notification_dispatch.dispatch_outbox()
        lease = notification_dispatch.lease_due()
        assert [notification_dispatch.deliver(pk, lease.token) for pk in lease.delivery_ids] == ["delivered"]
    tracing.flush()
    (delivery,) = traced.named("tms.notification.deliver")
    run = tracing.run_ids(run_id)
    assert delivery.parent == "" and delivery.trace_id != run.trace_hex
    assert delivery.links == [(run.trace_hex, f"{run.span_id:016x}")]
    assert delivery.attributes["tms.execution_id"] == run_id and delivery.attributes["tms.channel_kind"] == "webhook"


@pytest.mark.django_db
def test_a_callback_that_carries_a_traceparent_continues_the_runs_trace(traced, user):
    task = task_create(owner=user, runner="noop", max_attempts=1)
    (run,) = Execution.objects.filter(task=task)
    transitions.executions_take_due(limit=10, actor="monitor")
    assert transitions.execution_claim_loaded(execution_id=run.pk, attempt=1, worker_id="w:1:1", lease_seconds=60)
    assert transitions.execution_record_run(
        execution_id=run.pk, attempt=1, worker_id="w:1:1", external_run_id="job-1", run_handle={}, poll_in=60
    )
    trace = tracing.run_ids(run.pk)
    job_span = "1111222233334444"  # the job's own span, in the run's trace

    response = APIClient().post(
        f"/api/v1/executions/{run.pk}/callback",
        {"status": "succeeded", "output": "done"},
        format="json",
        headers={
            "X-TMS-Callback-Token": callback_token(execution_id=run.pk, attempt=1, timeout=300),
            "traceparent": f"00-{trace.trace_hex}-{job_span}-01",
        },
    )
    assert response.status_code == 202, response.content
    tracing.flush()

    (report,) = traced.named("tms.execution.report")
    (root,) = traced.named("tms.execution")
    (outcome,) = traced.named("tms.execution.outcome")
    assert report.trace_id == root.trace_id == outcome.trace_id == trace.trace_hex
    assert report.parent == job_span and report.attributes["tms.report"] == "succeeded"
    assert outcome.parent == root.span_id and root.attributes["tms.status"] == "SUCCEEDED"


@pytest.mark.django_db
def test_the_execution_page_links_its_trace(settings, client, user):
    task = task_create(owner=user, runner="noop")
    (run,) = Execution.objects.filter(task=task)
    client.force_login(user)
    page = client.get(f"/ui/executions/{run.pk}/")
    assert page.status_code == 200 and b'id="trace-link"' not in page.content  # no TMS_TRACE_URL: no link
    settings.TMS_TRACE_URL = "http://jaeger.example:16686/trace/{trace_id}"
    page = client.get(f"/ui/executions/{run.pk}/")
    # Tracing is off in this process: the link is derived all the same, as the workers derive it.
    assert f"http://jaeger.example:16686/trace/{tracing.run_ids(run.pk).trace_hex}".encode() in page.content


def test_runners_hand_the_trace_context_on():
    spec = RunSpec(
        execution_id=7, attempt=1, task_id="t", config={}, timeout=5, traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    )
    assert spec.environment()["TRACEPARENT"] == spec.traceparent  # subprocess runs, Kubernetes Jobs
    assert _metadata(spec)["traceparent"] == spec.traceparent  # Lambda's client context
    assert AsyncHttpFunctionRunner._tms_headers(spec)["traceparent"] == spec.traceparent  # function platforms
    assert "TRACEPARENT" not in RunSpec(execution_id=7, attempt=1, task_id="t", config={}, timeout=5).environment()
    job = KubernetesRunner("k8s", {"host": "http://127.0.0.1:9"}).job_manifest(
        replace(spec, config={"image": "ghcr.io/acme/report:1.4"}), "default"
    )
    assert job.metadata.annotations["tms.io/traceparent"] == spec.traceparent  # a Job: an annotation
    assert {"TRACEPARENT": spec.traceparent}.items() <= {
        e.name: e.value for e in job.spec.template.spec.containers[0].env
    }.items()


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "TMS_TRACING": "off"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ],
)
def test_the_standard_environment_turns_tracing_on(environ, on):
    assert tracing.wanted(environ) is on


_OFF_SCRIPT = """
import sys, django
django.setup()
import executions.worker_services, executions.monitor, executions.runs, executions.traces, notifications.dispatch
import backoffice.views, tms_project.celery
from tms_core import tracing
with tracing.run_span("x", tracing.run_trace(1)) as span, tracing.pass_span("y") as other:
    assert span is None and other is None
print(tracing.ON, sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def test_with_tracing_off_no_opentelemetry_module_is_imported():
    env = {key: value for key, value in process_env().items() if not key.startswith(("OTEL_", "TMS_TRACING"))}
    done = subprocess.run(
        [sys.executable, "-c", _OFF_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False []"
    # And on: the same process imports it (the check above can fail).
    env["OTEL_TRACES_EXPORTER"] = "console"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tms_core import tracing; tracing.setup(salt='x', instrument=False);"
            " print(tracing.ON and 'opentelemetry.sdk.trace' in sys.modules)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr


# --- tracestate, and what an unsampled run costs -------------------------------------------------

CALLER_STATE = "vendor=abc123,other=t61rcWkgMzE"


@pytest.mark.django_db
def test_a_runs_tracestate_is_kept_and_handed_to_its_http_target(traced, user):
    caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": CALLER_STATE}
    with webhook_receiver() as target:
        with tracing.continued(caller):  # the API request (or trigger) that creates the run
            task = task_create(owner=user, runner="http", config={"url": target.url, "method": "POST", "json": {}})
        (run,) = Execution.objects.filter(task=task)
        assert run.traceparent.startswith(f"00-{CALLER_TRACE}-") and run.tracestate == CALLER_STATE
        assert _run_due() == 1
        tracing.flush()
        (arrival,) = target.arrivals
    run.refresh_from_db()
    (start,) = traced.named("tms.runner.start")
    assert run.status == S.SUCCEEDED
    # The target gets the launch's context, and the caller's tracestate with it.
    assert arrival.headers["traceparent"] == f"00-{CALLER_TRACE}-{start.span_id}-01"
    assert arrival.headers["tracestate"] == CALLER_STATE
    # Every span of the run carries it, as a span made under the caller's context would.
    spans = traced.trace(CALLER_TRACE)
    assert {"tms.execution", "tms.execution.claim", "tms.runner.start"} <= {span.name for span in spans}
    assert {span.trace_state for span in spans} == {CALLER_STATE}


def test_runners_hand_the_tracestate_on():
    spec = RunSpec(
        execution_id=7,
        attempt=1,
        task_id="t",
        config={"url": "http://127.0.0.1:9/hook"},
        timeout=5,
        traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
        tracestate=CALLER_STATE,
    )
    assert spec.environment()["TRACESTATE"] == CALLER_STATE  # subprocess runs, Kubernetes Jobs
    assert _metadata(spec)["tracestate"] == CALLER_STATE
    assert AsyncHttpFunctionRunner._tms_headers(spec)["tracestate"] == CALLER_STATE
    job = KubernetesRunner("k8s", {"host": "http://127.0.0.1:9"}).job_manifest(
        replace(spec, config={"image": "ghcr.io/acme/report:1.4"}), "default"
    )
    assert job.metadata.annotations["tms.io/tracestate"] == CALLER_STATE
    assert "TRACESTATE" not in replace(spec, tracestate="").environment()
    # The longest kept: whole members left off from the right.
    long = ",".join(f"k{i}={'v' * 60}" for i in range(12))
    assert tracing.bounded_tracestate(long) == ",".join(long.split(",")[:8])  # 8 x 63 + 7 commas: 511


@pytest.fixture
def sampled_none(receiver, monkeypatch) -> Iterator[Receiver]:
    """Tracing on with a ratio sampler that keeps no trace (what 90 % of runs see at 10 %)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    tracing.setup(exporter=OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"), instrument=False, salt="test")
    try:
        yield receiver
    finally:
        tracing.reset()


@pytest.mark.django_db
def test_an_unsampled_run_makes_no_span_and_hands_its_trace_on_unsampled(sampled_none, user):
    task = task_create(owner=user, runner="subprocess", config={"command": ["/usr/bin/env"]})
    (run,) = Execution.objects.filter(task=task)
    trace = tracing.run_trace(run.pk)
    assert trace is not None and not trace.sampled
    assert tracing._decide is not None  # the environment's sampler, decided without asking it
    with tracing.pass_span("tms.monitor.pass"):  # an unsampled pass: nothing made for it either
        assert _run_due() == 1
    tracing.flush()
    run.refresh_from_db()
    assert run.status == S.SUCCEEDED
    assert sampled_none.spans == []
    # The external run still gets the run's trace (its root's context), flagged unsampled.
    assert f"TRACEPARENT=00-{trace.trace_hex}-{trace.span_id:016x}-00" in run.output.splitlines()


#: The SDK's own samplers, made in the test (no opentelemetry import when the tests are collected).
SDK_SAMPLERS = {
    "traceidratio 0.1": lambda sampling: sampling.TraceIdRatioBased(0.1),
    "parentbased_traceidratio 0.25": lambda sampling: sampling.ParentBasedTraceIdRatio(0.25),
    "parentbased of traceidratio 0.5": lambda sampling: sampling.ParentBased(sampling.TraceIdRatioBased(0.5)),
    "always_on": lambda sampling: sampling.ALWAYS_ON,
    "always_off": lambda sampling: sampling.ALWAYS_OFF,
    "parentbased_always_on": lambda sampling: sampling.DEFAULT_ON,
    "parentbased_always_off": lambda sampling: sampling.DEFAULT_OFF,
}


@pytest.mark.parametrize("name", list(SDK_SAMPLERS))
def test_a_runs_sampling_is_decided_as_its_sampler_would(name):
    """A run's sampling is a plain test of its trace id for the SDK's own samplers (asking the
    sampler cost a burst's every run a sampling result): for every run it is the sampler's own
    decision, the same in every process."""
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import sampling
    from opentelemetry.sdk.trace.sampling import Decision

    sampler = SDK_SAMPLERS[name](sampling)
    decide = tracing._root_decision(sampler)
    assert decide is not None
    trace_ids = [tracing.derived_trace_id("trace", n) for n in range(4000)]
    expected = [
        sampler.should_sample(Context(), trace_id, "tms.execution").decision is Decision.RECORD_AND_SAMPLE
        for trace_id in trace_ids
    ]
    assert [decide(trace_id) for trace_id in trace_ids] == expected
    rate = getattr(getattr(sampler, "_root", sampler), "rate", None)
    if rate is not None:  # the ratio kept, within a few percent of 4,000
        assert abs(sum(expected) - rate * len(trace_ids)) < 0.05 * len(trace_ids)


def test_the_monitors_test_of_a_runs_sampling_is_its_ids_own(receiver, monkeypatch):
    """The monitor tests each run it published for sampling without making its ids
    (``own_sampled``): the same answer as the ids every other process makes, for scheduled runs
    (their derived trace id) and runs created under a request (its traceparent's flag)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.3")
    tracing.setup(exporter=OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"), instrument=False, salt="test")
    try:
        parents = ["", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", "not-one"]
        answers = [
            (tracing.own_sampled(run, parent), tracing.own_run_ids(run, parent).sampled)
            for run in range(1, 2001)
            for parent in parents
        ]
        assert all(own == ids for own, ids in answers)
        scheduled = [own for own, _ in answers[::4]]
        assert 0.25 * len(scheduled) < sum(scheduled) < 0.35 * len(scheduled)
    finally:
        tracing.reset()


def test_a_sampler_the_sdk_does_not_ship_is_asked_itself():
    """A sampler the SDK does not ship (a subclass may decide otherwise) is asked itself."""
    from opentelemetry.sdk.trace import sampling

    class EveryOther(sampling.TraceIdRatioBased):
        def should_sample(self, parent_context, trace_id, *args: Any, **kwargs: Any) -> Any:
            keep = sampling.Decision.RECORD_AND_SAMPLE if trace_id % 2 else sampling.Decision.DROP
            return sampling.SamplingResult(keep)

    assert tracing._root_decision(EveryOther(1.0)) is None
    assert tracing._root_decision(sampling.ParentBased(EveryOther(1.0))) is None


def test_client_and_sql_spans_are_made_only_under_a_sampled_span(traced):
    tracer = tracing._ChildOnly(tracing._provider).get_tracer("test.sql")
    with tracer.start_as_current_span("SELECT") as alone:
        assert not alone.is_recording()  # outside any traced work: no trace of its own
    sampled = tracing.RunTrace(1, int(CALLER_TRACE, 16), int(CALLER_SPAN, 16))
    unsampled = tracing.RunTrace(2, int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), sampled=False)
    with tracing.run_span("tms.runner.start", unsampled), tracer.start_as_current_span("SELECT") as under:
        assert not under.is_recording()
        assert tracing.current_traceparent() == f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
    with tracing.run_span("tms.runner.start", sampled) as span, tracer.start_as_current_span("SELECT") as child:
        assert child.is_recording() and child.parent.span_id == span.get_span_context().span_id
    tracing.flush()
    assert [s.name for s in traced.spans] == ["SELECT", "tms.runner.start"]


def test_celery_spans_are_made_only_for_messages_of_a_sampled_trace(traced):
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from executions.tasks import run_execution

    instrumentor = tracing._celery_instrumentor(CeleryInstrumentor)()
    instrumentor.instrument(tracer_provider=tracing._provider)
    sampled = tracing.RunTrace(1, int(CALLER_TRACE, 16), int(CALLER_SPAN, 16))
    sent: dict[str, dict[str, str]] = {}

    def publish(message_id: str) -> None:
        headers = sent[message_id] = {"id": message_id}
        instrumentor._trace_before_publish(sender=run_execution.name, headers=headers, body=())
        instrumentor._trace_after_publish(sender=run_execution.name, headers=headers, body=())

    def run(message_id: str) -> None:
        run_execution.push_request(**sent[message_id])
        try:
            instrumentor._trace_prerun(task=run_execution, task_id=message_id)
            instrumentor._trace_postrun(task=run_execution, task_id=message_id)
        finally:
            run_execution.pop_request()

    try:
        publish("outside")  # no traced work current: no span, no context sent
        with tracing.run_span("tms.runner.start", sampled):
            publish("inside")
        run("outside")
        run("inside")
    finally:
        instrumentor.uninstrument()
    tracing.flush()
    assert set(sent["outside"]) == {"id"} and sent["inside"]["traceparent"].split("-")[1] == CALLER_TRACE
    names = sorted(span.name for span in traced.spans)
    assert names == ["apply_async/tms.run_execution", "run/tms.run_execution", "tms.runner.start"]
    assert {span.trace_id for span in traced.spans} == {CALLER_TRACE}


def test_tms_tracing_instrument_picks_the_instrumentations():
    assert tracing.instrumentations({}) == list(tracing.INSTRUMENTATIONS)
    assert tracing.instrumentations({"TMS_TRACING_INSTRUMENT": "django, requests"}) == ["django", "requests"]
    assert tracing.instrumentations({"TMS_TRACING_INSTRUMENT": "none"}) == []
    with pytest.raises(ValueError, match="psycopg3"):
        tracing.instrumentations({"TMS_TRACING_INSTRUMENT": "django,psycopg3"})


@pytest.mark.django_db
def test_sql_statements_make_spans_only_under_a_sampled_span(traced):
    import psycopg2
    from django.db import connection
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor

    tracing._gate_psycopg2_statements()
    instrumentor = Psycopg2Instrumentor()
    instrumentor.instrument(tracer_provider=tracing._ChildOnly(tracing._provider), skip_dep_check=True)
    db = connection.settings_dict
    sampled = tracing.RunTrace(1, int(CALLER_TRACE, 16), int(CALLER_SPAN, 16))
    unsampled = tracing.RunTrace(2, int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), sampled=False)
    try:
        conn = psycopg2.connect(
            dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"], port=db["PORT"]
        )
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")  # no traced work current
                with tracing.run_span("tms.execution.outcome", unsampled):
                    cursor.execute("SELECT 2")
                with tracing.run_span("tms.execution.outcome", sampled):
                    cursor.execute("SELECT 3")
                assert cursor.fetchone() == (3,)
        finally:
            conn.close()
    finally:
        instrumentor.uninstrument()
    tracing.flush()
    (statement,) = traced.named("SELECT")
    (outcome,) = traced.named("tms.execution.outcome")
    assert statement.parent == outcome.span_id and statement.trace_id == CALLER_TRACE


def test_the_monitor_publishes_outside_its_pass_s_span(traced):
    """A sampled monitor pass made Celery's publish span for each message it sent, and sent its
    context, so each run of a burst got message and SQL spans in the pass's trace whatever its own
    sampling: the publishes now run with no span current (a run's message is told by its own spans)."""
    import inspect

    from executions.monitor import Monitor

    with tracing.pass_span("tms.monitor.pass") as span:
        assert span.is_recording() and tracing.current_traceparent()
        with tracing.untraced():
            assert tracing.current_traceparent() == ""
            assert not tracing._sampled_parent()
        assert tracing.current_traceparent()
    assert "with tracing.untraced():" in inspect.getsource(Monitor._publish)
