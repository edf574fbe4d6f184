"""OpenTelemetry tracing: off unless the standard environment asks for it, free when off.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is
set, or ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``), and neither
``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none`` nor ``TMS_TRACING=off`` says otherwise.
When it is off, no ``opentelemetry`` module is imported and every hook below returns at its first
line (one global read). When it is on, :func:`setup` (called by ``executions``' app at start-up,
in every process) makes a tracer provider exporting over OTLP (HTTP/protobuf), with the SDK's
standard settings (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ...), and turns
on the maintained instrumentations: Django, Celery, psycopg2, requests, botocore and urllib3 (the
Kubernetes client's HTTP calls).

One trace per run. A run's ids are derived, not stored, so that any process rebuilds them (a
worker resuming a run after its first worker's death, the web process applying a callback):

- its trace id is the trace of the API request or trigger that created it when there was one
  (the execution's ``traceparent``, stored when it is created under a traced request), else a
  function of its id (of its workflow run's first run's, for a workflow step);
- its root span (``tms.execution``: the run's life, from its due time to its end) has a span
  id that is a function of its id, and is written once, by whichever process records the end;
- every other span of the run (taken, published, claimed, runner launch, each poll, outcome) is
  a child of that root, with an explicit parent context.

The spans that took place before they are written (taken, published, claimed, the root) go to the
exporter as finished records (:func:`_finished`); the launch, each poll and the outcome are live
spans, current around their calls, so that the instrumented calls inside are their children.

The functions take plain values (ids, times, traceparent strings): the engine's side (which rows,
which moments) is ``executions/traces.py``.

What an unsampled run costs: a run's sampling is decided once, from its trace id (or its
creating request's ``traceparent`` flags), and kept on its :class:`RunTrace`. For a run the
sampler drops, every hook returns at once: no span object, no attributes, no id generated; a
block around a runner call only makes the run's root context current (so that the external run
and the client instrumentations propagate the run's trace, flagged unsampled). The client and
SQL instrumentations (psycopg2, requests, urllib3, botocore) make a span only as a child of a
sampled span (:class:`_ChildOnly`), and Celery's only for a message published inside a sampled
span (:class:`_celery_instrumentor`): a statement, a client call or a message outside any traced
work starts no trace of its own. ``TMS_TRACING_INSTRUMENT`` chooses the instrumentations.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypedDict, TypeGuard, Unpack

logger = logging.getLogger(__name__)

_OFF_WORDS = frozenset({"0", "off", "false", "no", "none", ""})


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (no import of opentelemetry)."""
    env = os.environ if environ is None else environ
    tms = env.get("TMS_TRACING")
    if tms is not None and tms.strip().lower() in _OFF_WORDS:
        return False
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER")
    if exporter is not None:
        return exporter.strip().lower() not in _OFF_WORDS
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


#: Whether tracing is on in this process: read by every hook first. Set by :func:`setup`.
ON = False
#: The OpenTelemetry API the hooks use, bound by :func:`setup` (an import inside a hook costs
#: more than the hook's own work for an unsampled run).
_otel: Any = None

_lock = threading.Lock()
_provider: Any = None
_tracer: Any = None
_salt: bytes = b""
#: The configured sampler's decision for a root span as a plain test of the trace id, when the
#: sampler is one of the SDK's own (always on or off, a trace id ratio, each alone or under
#: parent-based): asking the sampler builds a sampling result with its attributes and trace state
#: for each of a burst's thousands of runs, most of them dropped. None: ask the sampler.
_decide: Callable[[int], bool] | None = None


def _role() -> str:
    argv = " ".join(sys.argv)
    if "run_monitor" in argv:
        return "monitor"
    if "celery" in argv:
        for role in ("beat", "flower"):
            if f" {role}" in argv:
                return role
        return "worker"
    return "web"


def setup(*, exporter: Any = None, instrument: bool = True, salt: str | None = None) -> bool:
    """Turn tracing on in this process if the environment asks for it (or ``exporter`` is given:
    tests). Idempotent; returns whether tracing is on. ``salt``: what the derived ids are keyed
    with (default: the Django ``SECRET_KEY``, shared by every process of one installation)."""
    global ON, _provider, _tracer, _salt, _otel, _decide
    with _lock:
        if ON:
            return True
        if exporter is None and not wanted():
            return False
        names = instrumentations() if instrument else []  # an unknown name: an error, before anything
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if salt is not None:
            _salt = _salt_of(salt)
        service = os.environ.get("OTEL_SERVICE_NAME") or f"tms-{_role()}"
        # With OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) for the rest.
        resource = Resource.create({"service.name": service, "tms.role": _role()})
        provider = TracerProvider(resource=resource)
        if exporter is None:
            kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
            if kind == "console":
                exporter = ConsoleSpanExporter()
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()
        processor = BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import INVALID_SPAN, Link, NonRecordingSpan, SpanContext, TraceFlags, TraceState
        from opentelemetry.trace.status import Status, StatusCode

        _otel = SimpleNamespace(
            trace=trace,
            context=otel_context,
            empty=Context(),
            keep=Decision.RECORD_AND_SAMPLE,
            invalid=INVALID_SPAN,
            NonRecordingSpan=NonRecordingSpan,
            SpanContext=SpanContext,
            TraceFlags=TraceFlags,
            TraceState=TraceState,
            Link=Link,
            ReadableSpan=ReadableSpan,
            Status=Status,
            error=StatusCode.ERROR,
            unset=Status(StatusCode.UNSET),
            sampled=TraceFlags(TraceFlags.SAMPLED),
            processor=processor,
            resource=resource,
            scope=InstrumentationScope("tms"),
            span_id=provider.id_generator.generate_span_id,
        )
        trace.set_tracer_provider(provider)
        _provider, _tracer = provider, provider.get_tracer("tms")
        _decide = _root_decision(provider.sampler)
        _run_ids.cache_clear()
        ON = True
    if names:
        _instrument(provider, names)
    return True


#: The maintained instrumentations (``TMS_TRACING_INSTRUMENT`` names a subset, or ``none``).
INSTRUMENTATIONS = {
    "django": "opentelemetry.instrumentation.django:DjangoInstrumentor",
    "celery": "opentelemetry.instrumentation.celery:CeleryInstrumentor",
    "psycopg2": "opentelemetry.instrumentation.psycopg2:Psycopg2Instrumentor",
    "requests": "opentelemetry.instrumentation.requests:RequestsInstrumentor",
    "botocore": "opentelemetry.instrumentation.botocore:BotocoreInstrumentor",
    "urllib3": "opentelemetry.instrumentation.urllib3:URLLib3Instrumentor",
}
#: Client and SQL instrumentations: their spans are made only as children of a sampled span.
_CHILD_ONLY = frozenset({"psycopg2", "requests", "botocore", "urllib3"})


def instrumentations(environ: Mapping[str, str] | None = None) -> list[str]:
    """The instrumentations ``TMS_TRACING_INSTRUMENT`` asks for (comma-separated; default: all;
    ``none``: none). An unknown name is an error."""
    env = os.environ if environ is None else environ
    value = env.get("TMS_TRACING_INSTRUMENT", "").strip().lower()
    if not value:
        return list(INSTRUMENTATIONS)
    if value in _OFF_WORDS:
        return []
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted(set(names) - set(INSTRUMENTATIONS))
    if unknown:
        raise ValueError(f"TMS_TRACING_INSTRUMENT: unknown instrumentation(s) {', '.join(unknown)}")
    return names


def _instrument(provider: Any, names: Sequence[str]) -> None:
    """The maintained instrumentations ``names``, each skipped (with a warning) if it fails."""
    import importlib

    child_only = _ChildOnly(provider)
    for name in names:
        if name == "botocore" and _role() != "worker":
            continue  # boto3 is imported at first use (tms_core/lazy.py), and only workers call it
        module, _, attr = INSTRUMENTATIONS[name].partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
            instrumentor = _celery_instrumentor(cls)() if name == "celery" else cls()
            if not instrumentor.is_instrumented_by_opentelemetry:
                kwargs: dict[str, Any] = {"tracer_provider": child_only if name in _CHILD_ONLY else provider}
                if name == "psycopg2":
                    kwargs["skip_dep_check"] = True  # psycopg2-binary is psycopg2
                    _gate_psycopg2_statements()
                instrumentor.instrument(**kwargs)
        except Exception:
            logger.warning("tracing: the %s instrumentation could not be turned on", name, exc_info=True)


def _sampled_parent(context: Any = None) -> bool:
    """Whether the span current in ``context`` (default: now) is in a sampled trace."""
    return bool(_otel.trace.get_current_span(context).get_span_context().trace_flags & 1)


class _ChildOnly:
    """A tracer provider whose tracers make a span only as a child of a sampled span; otherwise
    they make nothing (the invalid span, nothing made current). Given to the client and SQL
    instrumentations: a statement (or a client call) outside any traced work starts no trace of
    its own, and one under an unsampled run costs no span."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _ChildOnlyTracer(self._provider.get_tracer(*args, **kwargs))


class _ChildOnlyTracer:
    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer

    def start_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not _sampled_parent(context):
            return _otel.invalid
        return self._tracer.start_span(name, context, *args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if not _sampled_parent(context):
            yield _otel.invalid
            return
        with self._tracer.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span


def _gate_psycopg2_statements() -> None:
    """Each statement on an instrumented connection goes straight to psycopg2 unless a sampled
    span is current: the instrumentation otherwise parses its operation name and times it for
    every statement before it learns that no span is made (its cursor factory takes the module's
    ``CursorTracer`` when a connection is made: this one skips that work)."""
    from opentelemetry.instrumentation import psycopg2 as instrumentation

    base = instrumentation.CursorTracer
    if getattr(base, "tms_gated", False):
        return

    class CursorTracer(base):  # type: ignore[misc, valid-type]
        tms_gated = True

        def traced_execution(self, cursor: Any, query_method: Any, *args: Any, **kwargs: Any) -> Any:
            if not _sampled_parent():
                return query_method(*args, **kwargs)
            return super().traced_execution(cursor, query_method, *args, **kwargs)

    instrumentation.CursorTracer = CursorTracer  # type: ignore[misc]


@functools.cache
def _celery_instrumentor(base: Any) -> Any:
    """Celery's instrumentation, made for messages published inside a sampled span only: a
    publish outside one makes no span and sends no context, and a message that carries no
    sampled ``traceparent`` is run without a span (with the stock instrumentation every message
    made spans, and one published outside a trace started one of its own)."""
    from opentelemetry.instrumentation.celery import utils

    class Instrumentor(base):
        _instance = None  # a singleton of its own (BaseInstrumentor's __new__)

        def _trace_before_publish(self, *args: Any, **kwargs: Any) -> None:
            if _sampled_parent():
                super()._trace_before_publish(*args, **kwargs)

        @staticmethod
        def _trace_after_publish(*args: Any, **kwargs: Any) -> None:
            task, task_id = utils.retrieve_task_from_sender(kwargs), utils.retrieve_task_id_from_message(kwargs)
            if task_id is not None and utils.retrieve_context(task, task_id, is_publish=True) is not None:
                base._trace_after_publish(*args, **kwargs)

        def _trace_prerun(self, *args: Any, **kwargs: Any) -> None:
            request = getattr(kwargs.get("task"), "request", None)
            parsed = parse_traceparent(getattr(request, "traceparent", None))
            if parsed is not None and parsed[2]:
                super()._trace_prerun(*args, **kwargs)

        def _trace_postrun(self, *args: Any, **kwargs: Any) -> None:
            task_id = kwargs.get("task_id")
            if task_id is not None and utils.retrieve_context(kwargs.get("task"), task_id) is not None:
                super()._trace_postrun(*args, **kwargs)

    Instrumentor.__name__ = Instrumentor.__qualname__ = "TmsCeleryInstrumentor"
    return Instrumentor


def flush(timeout_millis: int = 2000) -> None:
    """Export what is buffered now (a pool process about to exit, a test)."""
    if ON:
        _provider.force_flush(timeout_millis)


def reset() -> None:
    """Turn tracing off again in this process (tests): flush and forget the provider."""
    global ON, _provider, _tracer, _salt, _decide
    with _lock:
        if ON:
            _provider.shutdown()
        ON, _provider, _tracer, _salt, _decide = False, None, None, b"", None
        _run_ids.cache_clear()


# --- ids ---------------------------------------------------------------------------------------


def _salt_of(secret: str) -> bytes:
    return hashlib.sha256(f"tms-trace:{secret}".encode()).digest()[:16]


def _derive(kind: str, key: object) -> bytes:
    global _salt
    if not _salt:
        # Keyed with the installation's SECRET_KEY, which every process shares: two
        # installations' runs of the same id are not one trace.
        from django.conf import settings

        _salt = _salt_of(str(getattr(settings, "SECRET_KEY", "")))
    return hashlib.blake2b(f"{kind}:{key}".encode(), key=_salt, digest_size=16).digest()


def derived_trace_id(kind: str, key: object) -> int:
    return int.from_bytes(_derive(kind, key), "big") or 1


def derived_span_id(kind: str, key: object) -> int:
    return int.from_bytes(_derive(kind, key)[:8], "big") or 1


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of a W3C ``traceparent``; None if it is not one."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(flags & 1)


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


@dataclass(frozen=True)
class RunTrace:
    """The ids of one run's trace: its trace, its root span and that root's parent."""

    execution_id: int
    trace_id: int
    span_id: int
    #: The root span's parent: the creating request's span, or a workflow run's; 0: none.
    parent_span_id: int = 0
    #: Whether the sampler keeps the run's spans: decided once, from its trace id (a run created
    #: under a request: that request's ``traceparent`` flags). Every hook of an unsampled run
    #: returns at once.
    sampled: bool = True
    #: The W3C ``tracestate`` of the request that created the run ('' when none): handed on
    #: with the traceparent to the external run.
    tracestate: str = ""

    @functools.cached_property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @functools.cached_property
    def traceparent(self) -> str:
        """The root span's context as a W3C traceparent."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)

    @functools.cached_property
    def span_context(self) -> Any:
        """The root span's ``SpanContext``, as the parent of the run's other spans."""
        return _span_context(self.trace_id, self.span_id, self.sampled, self.tracestate)

    @functools.cached_property
    def context(self) -> Any:
        """The root span's context, as the parent of the run's other spans (made once a run)."""
        return _otel.trace.set_span_in_context(_otel.NonRecordingSpan(self.span_context))


def workflow_span_id(workflow_run: int) -> int:
    return derived_span_id("workflow", workflow_run)


class TraceSource(TypedDict, total=False):
    """What a run's trace ids are worked out from: ``traceparent`` (``tracestate``), the ones
    stored when it was created; a workflow step's ``workflow_run`` (not its own id) and that
    run's first ``workflow_traceparent`` (``workflow_tracestate``). Each defaults to empty."""

    traceparent: str
    tracestate: str
    workflow_run: int | None
    workflow_traceparent: str
    workflow_tracestate: str


def run_trace(execution_id: int, **source: Unpack[TraceSource]) -> RunTrace | None:
    """A run's trace ids (None when tracing is off): :func:`run_ids` in a process that traces."""
    return run_ids(execution_id, **source) if ON else None


def run_ids(execution_id: int, **source: Unpack[TraceSource]) -> RunTrace:
    """A run's trace ids whether or not tracing is on in this process (the back office's link to
    a run's trace; ``sampled`` is then only known for a run created under a traced request). A
    workflow step is in its workflow run's trace, its root a child of the workflow run's span.
    Computed once per process for the same arguments (a small cache)."""
    return _run_ids(
        execution_id,
        source.get("traceparent", ""),
        source.get("tracestate", ""),
        source.get("workflow_run"),
        source.get("workflow_traceparent", ""),
        source.get("workflow_tracestate", ""),
    )


def own_run_ids(execution_id: int, traceparent: str = "", tracestate: str = "") -> RunTrace:
    """:func:`run_ids` of a run that is not a workflow step, for the per-run hot paths (a
    burst's claims and launches: the keyword layers of :func:`run_ids` cost as much as its
    cache lookup)."""
    return _run_ids(execution_id, traceparent, tracestate, None, "", "")


def own_sampled(execution_id: int, traceparent: str = "") -> bool:
    """:func:`own_run_ids`' ``sampled``, without making the ids (tracing on): the monitor's test
    of each run it published, most of them dropped by a ratio sampler."""
    parsed = parse_traceparent(traceparent)
    return parsed[2] if parsed is not None else _sampled(derived_trace_id("trace", execution_id))


@functools.lru_cache(maxsize=4096)
def _run_ids(
    execution_id: int,
    traceparent: str,
    tracestate: str,
    workflow_run: int | None,
    workflow_traceparent: str,
    workflow_tracestate: str,
) -> RunTrace:
    if workflow_run is not None and workflow_run != execution_id:
        first = _run_ids(workflow_run, workflow_traceparent, workflow_tracestate, None, "", "")
        return RunTrace(
            execution_id,
            first.trace_id,
            derived_span_id("execution", execution_id),
            workflow_span_id(workflow_run),
            first.sampled,
            first.tracestate,
        )
    parsed = parse_traceparent(traceparent)
    span_id = derived_span_id("execution", execution_id)
    if parsed is not None:
        return RunTrace(execution_id, parsed[0], span_id, parsed[1], parsed[2], tracestate)
    trace_id = derived_trace_id("trace", execution_id)
    return RunTrace(execution_id, trace_id, span_id, 0, _sampled(trace_id) if ON else True)


def _sampled(trace_id: int) -> bool:
    """The sampler's decision for a trace with no parent: a ratio sampler decides on the trace id,
    so every process decides the same for a run."""
    decide = _decide
    if decide is not None:
        return decide(trace_id)
    # An empty context: a parent-based sampler must not follow the span current here.
    result = _provider.sampler.should_sample(_otel.empty, trace_id, "tms.execution")
    return result.decision is _otel.keep


def _root_decision(sampler: Any) -> Callable[[int], bool] | None:
    """:data:`_decide` for ``sampler`` (None when only the sampler itself can tell). Read from the
    SDK's samplers' own fields, some of them private: an SDK without them is asked instead."""
    from opentelemetry.sdk.trace import sampling

    def kinds(*names: str) -> tuple[type, ...]:
        return tuple(kind for name in names if isinstance(kind := getattr(sampling, name, None), type))

    parent_based = kinds("ParentBased", "ParentBasedTraceIdRatio", "_ParentBasedAlwaysOn", "_ParentBasedAlwaysOff")
    # Exact types: a subclass may decide otherwise.
    if type(sampler) in parent_based:
        sampler = getattr(sampler, "_root", None)
    if type(sampler) is sampling.TraceIdRatioBased:
        bound, limit = sampler.bound, sampler.TRACE_ID_LIMIT
        return lambda trace_id: trace_id & limit < bound
    decision = getattr(sampler, "_decision", None)
    if type(sampler) in kinds("StaticSampler", "_AlwaysOn", "_AlwaysOff") and isinstance(decision, sampling.Decision):
        keep = decision is sampling.Decision.RECORD_AND_SAMPLE
        return lambda trace_id: keep
    return None


def _span_context(trace_id: int, span_id: int, sampled: bool, tracestate: str = "") -> Any:
    """A span of another process (remote), as a parent."""
    o = _otel
    flags = o.sampled if sampled else o.TraceFlags(o.TraceFlags.DEFAULT)
    state = o.TraceState.from_header([tracestate]) if tracestate else None
    return o.SpanContext(trace_id, span_id, True, flags, state)


def _link(trace_id: int, span_id: int) -> Any:
    return _otel.Link(_span_context(trace_id, span_id, True))


def _finished(
    name: str,
    trace_id: int,
    span_id: int,
    parent: Any,
    *,
    start_ns: int,
    end_ns: int | None = None,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[Any] = (),
    error: str = "",
) -> None:
    """Hand the exporter a span that already took place (``parent``: a ``SpanContext``, or None
    for a root), as the finished record the SDK's own span hands it when it ends.

    Why not the tracer: a span started and ended at once goes through the sampler (a sampled
    run's child is kept whatever it says), attribute checks, a lock and a copy of itself at its
    end; 36 µs a span against 13 this way, and a sampled run's four after-the-fact spans were
    a tenth of a burst's run at a 10 % sampler (docs/operations.md, "What tracing costs"). The
    attributes are TMS's own (integers, strings, booleans), a handful a span, within the SDK's
    limits; the span is kept, and given the trace state, as the SDK would (its parent's).

    The SDK's docs expect a ``ReadableSpan`` to come from its tracer: it is made here with the
    SDK pinned (requirements.txt), and tests/tms_core/test_tracing.py decodes these spans from
    real OTLP (names, ids, parents, attributes, links, status, trace state), so an SDK that
    changes the record fails the suite, not the traces."""
    o = _otel
    state = parent.trace_state if parent is not None else None
    o.processor.on_end(
        o.ReadableSpan(
            name,
            o.SpanContext(trace_id, span_id, False, o.sampled, state),
            parent,
            o.resource,
            _attributes(attributes),
            links=tuple(links),
            status=o.Status(o.error, error[:200]) if error else o.unset,
            start_time=start_ns,
            end_time=end_ns if end_ns is not None else time.time_ns(),
            instrumentation_scope=o.scope,
        )
    )


def task_link(task_id: object, tracing_id: str = "") -> Any:
    """A link to the task a scheduled run belongs to: the task's ``tracing_id`` when it is a
    trace id (32 hex digits), else one derived from the task's id."""
    trace_id = 0
    if len(tracing_id) == 32:
        with contextlib.suppress(ValueError):
            trace_id = int(tracing_id, 16)
    return _link(trace_id or derived_trace_id("task", task_id), derived_span_id("task", task_id))


def now_ns() -> int:
    return time.time_ns()


def _attributes(values: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (values or {}).items() if value is not None and value != ""}


def recorded(run: RunTrace | None) -> TypeGuard[RunTrace]:
    """Whether ``run``'s spans are recorded: tracing on and the run sampled."""
    return run is not None and run.sampled and ON


@contextlib.contextmanager
def run_span(
    name: str, run: RunTrace | None, attributes: Mapping[str, Any] | None = None, *, join_current: bool = False
) -> Iterator[Any]:
    """A span of ``run`` (a child of its root) around the block, current inside it, so that the
    instrumented calls inside (HTTP, SQL, the Kubernetes API) are its children. Yields the span,
    or None when tracing is off. ``join_current``: a child of the current span instead when that
    span is in the run's trace (a callback request that carried the run's traceparent).

    An unsampled run gets no span: its root's context is made current (a span that records
    nothing, yielded), so that the calls inside hand the run's trace on, flagged unsampled."""
    if run is None or not ON:
        yield None
        return
    trace = _otel.trace
    if not run.sampled:
        token = _otel.context.attach(run.context)
        try:
            yield trace.get_current_span(run.context)
        finally:
            _otel.context.detach(token)
        return
    parent = None
    if join_current:
        current = trace.get_current_span().get_span_context()
        if current.is_valid and current.trace_id == run.trace_id:
            parent = trace.set_span_in_context(trace.get_current_span())
    if parent is None:
        parent = run.context
    with _tracer.start_as_current_span(
        name, context=parent, attributes=_attributes(attributes), record_exception=True
    ) as span:
        yield span


def record_run_span(
    name: str,
    run: RunTrace | None,
    *,
    start_ns: int,
    end_ns: int | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span of ``run`` that already took place (from ``start_ns`` to ``end_ns`` or now)."""
    if not recorded(run):
        return
    _finished(
        name, run.trace_id, _otel.span_id(), run.span_context, start_ns=start_ns, end_ns=end_ns, attributes=attributes
    )


def end_run(
    run: RunTrace | None,
    *,
    start_ns: int,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[Any] = (),
    error: str = "",
    name: str = "tms.execution",
) -> None:
    """Write a run's root span (``name``: ``tms.execution``), from ``start_ns`` (its due time)
    to now, with the run's derived ids."""
    if not recorded(run):
        return
    parent = None
    if run.parent_span_id:
        parent = _span_context(run.trace_id, run.parent_span_id, run.sampled, run.tracestate)
    _finished(
        name, run.trace_id, run.span_id, parent, start_ns=start_ns, attributes=attributes, links=links, error=error
    )


def end_workflow_run(run: RunTrace | None, *, workflow_run: int, start_ns: int, attributes: Mapping[str, Any]) -> None:
    """Write a workflow run's span: a child of its first run's root, parent of its steps' roots."""
    if not recorded(run):
        return
    workflow = RunTrace(
        workflow_run, run.trace_id, workflow_span_id(workflow_run), run.span_id, run.sampled, run.tracestate
    )
    end_run(workflow, start_ns=start_ns, attributes=attributes, name="tms.workflow_run")


@contextlib.contextmanager
def pass_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A span of its own trace (a monitor or materialiser pass, a notification delivery),
    current inside the block. Yields it (None when off); it is exported only if ``keep(span)`` is
    not set to False on it by the caller (:func:`drop`), so that idle passes cost no export."""
    if not ON:
        yield None
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context

    span = _tracer.start_span(name, context=Context(), attributes=_attributes(attributes))
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        span.record_exception(exc)
        raise
    finally:
        otel_context.detach(token)
        if not getattr(span, "_tms_drop", False):
            span.end()


def drop(span: Any) -> None:
    """Do not export ``span`` (a :func:`pass_span` that found nothing to do)."""
    if span is not None:
        span._tms_drop = True


def add_links(span: Any, runs: Sequence[RunTrace | None], most: int = 64) -> None:
    """Link a recorded ``span`` to the roots of the sampled ``runs`` (at most ``most``): an
    unsampled run has no trace to link to."""
    if span is None or not span.is_recording():
        return
    for run in [run for run in runs if run is not None and run.sampled][:most]:
        span.add_link(_link(run.trace_id, run.span_id).context)


#: The longest ``tracestate`` kept with a run (the W3C limit a vendor must be able to carry).
TRACESTATE_MAX = 512


def bounded_tracestate(value: str) -> str:
    """``value`` with its last list members left off until it fits :data:`TRACESTATE_MAX` (the
    W3C way to shorten one: whole members, from the right)."""
    if len(value) <= TRACESTATE_MAX:
        return value
    kept: list[str] = []
    for member in value.split(","):
        if len(",".join([*kept, member])) > TRACESTATE_MAX:
            break
        kept.append(member)
    return ",".join(kept)


def current_trace_context() -> tuple[str, str]:
    """The current span's context as a W3C ``traceparent`` and ``tracestate`` (both '' when off
    or there is none; the state '' when it has none): what a run created in this request or
    trigger stores, to join its trace, and what the runner hands the external run."""
    if not ON or _creating_outside.get():
        return "", ""
    context = _otel.trace.get_current_span().get_span_context()
    if not context.is_valid:
        return "", ""
    state = bounded_tracestate(context.trace_state.to_header()) if context.trace_state else ""
    return format_traceparent(context.trace_id, context.span_id, context.trace_flags.sampled), state


def handed_on(run: RunTrace | None) -> tuple[str, str]:
    """The trace context a runner call of ``run`` hands the external run, inside its
    :func:`run_span`: the current span's (the call's span); an unsampled run's root's, as it is."""
    if run is not None and not run.sampled:
        return run.traceparent, run.tracestate
    return current_trace_context()


def current_traceparent() -> str:
    """The current span's context as a W3C traceparent: :func:`current_trace_context`'s first."""
    return current_trace_context()[0]


#: Runs created inside this context start traces of their own (a materialiser pass, whose span is
#: current): :func:`current_traceparent` gives nothing.
_creating_outside: ContextVar[bool] = ContextVar("tms_creating_outside", default=False)


@contextlib.contextmanager
def own_traces() -> Iterator[None]:
    """Runs created inside the block start traces of their own (scheduled runs)."""
    token = _creating_outside.set(True)
    try:
        yield
    finally:
        _creating_outside.reset(token)


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """No span is current in the block (an empty context): what it does makes no span of the
    instrumentations and sends no trace context (the monitor's publishes: each run's message
    belongs to the run's trace, told by its own spans, not to the pass's)."""
    if not ON:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(otel_context.Context())
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the ``traceparent`` (and ``tracestate``) of an incoming request current in the block:
    a job's callback that carries one continues its trace."""
    if not ON or not headers.get("traceparent"):
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {key: value for key in ("traceparent", "tracestate") if (value := headers.get(key))}
    token = otel_context.attach(TraceContextTextMapPropagator().extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def trace_url(trace_id_hex: str) -> str:
    """The trace's page in the operator's trace viewer (``TMS_TRACE_URL``, with ``{trace_id}``)."""
    from django.conf import settings

    template = getattr(settings, "TMS_TRACE_URL", "") or os.environ.get("TMS_TRACE_URL", "")
    return template.replace("{trace_id}", trace_id_hex) if template and trace_id_hex else ""
