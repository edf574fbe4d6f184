"""The runner interface every backend implements.

A runner adapts one kind of external executor (an HTTP endpoint, a local process, a Kubernetes
Job, ...). It never touches the database: the worker-side services call it and record what it
returns. Backends are configured like Django's CACHES, as aliases in ``TMS_RUNNERS`` with a
dotted ``BACKEND`` path and ``OPTIONS``; see :mod:`runners.registry`.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from tms_core.lazy import LazyModule

#: Upper bound a task may set for a runner's ``max_output_bytes``: outputs end up in the database.
MAX_OUTPUT_BYTES_LIMIT = 1024 * 1024

#: Request headers no task may set: the runner sets them itself, or they would break the framing.
RESERVED_HEADERS = frozenset({"idempotency-key", "host", "content-length", "transfer-encoding", "connection"})
#: An HTTP header name (a ``token`` of RFC 9110).
HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

#: A re-sent launch answered "still in progress" is sent again after this many seconds, the
#: delay growing by RESEND_FACTOR up to RESEND_CAP (see :func:`resend_while_in_progress`).
RESEND_BASE, RESEND_FACTOR, RESEND_CAP = 0.25, 2.0, 5.0
#: What executors following the IETF Idempotency-Key draft (and Stripe) answer while a request
#: with the same key is still being processed: 409 Conflict.
DEFAULT_IN_PROGRESS_STATUSES = (409,)

T = TypeVar("T")


class RunState(enum.StrEnum):
    RUNNING = "running"  #: the external run is still going
    SUCCEEDED = "succeeded"  #: the external run finished and reported success
    FAILED = "failed"  #: the external run finished and reported failure (or could not start)


@dataclass(frozen=True)
class RunResult:
    """What a runner reports about a run: its state, a bounded output excerpt and an error."""

    state: RunState
    output: str = ""
    error: str = ""
    #: False when retrying cannot help (bad request, missing binary, ...): the attempt ends FAILED.
    retryable: bool = True
    #: For a run still going: when (epoch seconds) to poll it next, instead of the platform's
    #: exponential backoff (a sleep that wakes at a known time, a wait with a deadline). The
    #: task's timeout still bounds the wait: the poll is never later than the attempt's end.
    poll_at: float | None = None

    @classmethod
    def running(cls, output: str = "", *, poll_at: float | None = None) -> RunResult:
        return cls(RunState.RUNNING, output=output, poll_at=poll_at)

    @classmethod
    def succeeded(cls, output: str = "") -> RunResult:
        return cls(RunState.SUCCEEDED, output=output)

    @classmethod
    def failed(cls, error: str, *, output: str = "", retryable: bool = True) -> RunResult:
        return cls(RunState.FAILED, output=output, error=error, retryable=retryable)

    @property
    def finished(self) -> bool:
        return self.state is not RunState.RUNNING


def idempotency_key(execution_id: int, attempt: int) -> str:
    """The key every launch of this execution's attempt carries (also shown to operators)."""
    return f"tms-{execution_id}-{attempt}"


@dataclass(frozen=True)
class EventCheck:
    """What the platform found for a wait-for-event run (:mod:`runners.wait_event`), which cannot
    read the database itself: the payload of the first matching event received since the run
    started (None: none yet), how long the run has waited by the database clock, and a problem
    that ends the wait (the run's input has no correlation key)."""

    payload: Mapping[str, Any] | None = None
    waited: float = 0.0
    problem: str = ""


#: Looks up a named event for a waiting run: ``(event name, path in the run's input, path in the
#: event's payload)`` (both paths empty: any event of that name).
EventLookup = Callable[[str, str, str], EventCheck]


@dataclass(frozen=True)
class RunSpec:
    """Everything a runner needs to start one attempt of one execution."""

    execution_id: int
    attempt: int
    task_id: str
    #: The task's runner config, already validated by :meth:`BaseRunner.validate_config`.
    config: Mapping[str, Any]
    #: Seconds the attempt may take in all; the runner must not block for longer than this.
    timeout: float
    #: URL the external job may POST its status to (heartbeat, success, failure), if any.
    callback_url: str | None = None
    #: Makes the token the job sends with those reports (:attr:`callback_token`). Called only
    #: when a runner hands the job its token: a signature made for every run cost the workers
    #: about 5 % of their CPU on runs that never report back (noop, sleep, e-mail).
    token_minter: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    #: Local path of the task's uploaded artifact (binary or script), if it has one.
    artifact_path: str | None = None
    #: The artifact's recorded SHA-256: the runner checks the copy it runs against it.
    artifact_sha256: str | None = None
    tracing_id: str = ""
    #: The W3C trace context of the launch (or poll) span, when tracing is on (tms_core/tracing.py):
    #: HTTP runners send it as ``traceparent``, process runs get it as ``TRACEPARENT``.
    traceparent: str = ""
    #: The W3C tracestate that goes with it ('' when none): ``tracestate``, ``TRACESTATE``.
    tracestate: str = ""
    #: Finds the named event a wait-for-event run waits for (set by the worker-side services).
    event_lookup: EventLookup | None = field(default=None, repr=False, compare=False)
    #: This attempt was started before, by a worker that was lost before it recorded a run id:
    #: the executor may still be working on the first request with this idempotency key.
    resend: bool = False
    #: The run's input (a trigger's, or a workflow step's upstream output), or None: runners that
    #: pass it on (sleep, approval) or read a time from it.
    input: Any = None

    @functools.cached_property
    def callback_token(self) -> str | None:
        """The token the job sends with its reports (a header, never the URL); short-lived."""
        return self.token_minter() if self.token_minter is not None else None

    @property
    def idempotency_key(self) -> str:
        """Deterministic per execution and attempt: a repeated start must adopt, never relaunch."""
        return idempotency_key(self.execution_id, self.attempt)

    def attempt_facts(self) -> dict[str, Any]:
        """What a run carries about the attempt that made it, each runner under names of its own
        (environment variables, headers, invocation metadata): the ids, the idempotency key, and
        those of the callback URL and its token, the tracing id and the W3C traceparent (and tracestate) that are set.
        The token goes only with a URL to send it to."""
        facts: dict[str, Any] = {
            "idempotency_key": self.idempotency_key,
            "execution_id": self.execution_id,
            "attempt": self.attempt,
            "task_id": str(self.task_id),
        }
        if self.callback_url:
            facts["callback_url"] = self.callback_url
            if self.callback_token:
                facts["callback_token"] = self.callback_token
        if self.tracing_id:
            facts["tracing_id"] = self.tracing_id
        if self.traceparent:
            facts["traceparent"] = self.traceparent
            if self.tracestate:
                facts["tracestate"] = self.tracestate
        return facts

    def facts_named(self, names: Mapping[str, str]) -> dict[str, str]:
        """The :meth:`attempt_facts` that ``names`` names (fact -> the runner's name for it), as text."""
        return {names[fact]: str(value) for fact, value in self.attempt_facts().items() if fact in names}

    def environment(self) -> dict[str, str]:
        """The ``TMS_*`` variables a process-based run gets: ids, key, callback URL, tracing id."""
        return self.facts_named(ENVIRONMENT_NAMES)


#: :meth:`RunSpec.attempt_facts` as a process-based run's environment variables.
ENVIRONMENT_NAMES = {
    "execution_id": "TMS_EXECUTION_ID",
    "attempt": "TMS_ATTEMPT",
    "task_id": "TMS_TASK_ID",
    "idempotency_key": "TMS_IDEMPOTENCY_KEY",
    "callback_url": "TMS_CALLBACK_URL",
    "callback_token": "TMS_CALLBACK_TOKEN",
    "tracing_id": "TMS_TRACING_ID",
    "traceparent": "TRACEPARENT",
    "tracestate": "TRACESTATE",
}


@dataclass(frozen=True)
class RunHandle:
    """How to find a started run again, possibly from another worker process."""

    external_run_id: str
    #: Runner-private, JSON-serialisable data needed to poll or cancel the run.
    data: Mapping[str, Any] = field(default_factory=dict)
    #: Set when ``start`` already ran the work to completion (synchronous runners).
    result: RunResult | None = None
    #: For an asynchronous run: when (epoch seconds) to poll it first, instead of at once
    #: (:attr:`RunResult.poll_at`).
    poll_at: float | None = None


class RunnerError(Exception):
    """A runner could not talk to its executor (network error, API error, ...)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class BaseRunner:
    """Base class for runner backends.

    Subclasses declare the ``OPTIONS`` they accept in :attr:`option_defaults`, a DRF serializer
    for the per-task config in :attr:`config_serializer_class`, and implement :meth:`start`,
    :meth:`poll` and :meth:`cancel`.
    """

    #: Accepted OPTIONS and their defaults; any other option is a configuration error.
    option_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Shortest time, in seconds, between two fire times of a task on this runner, unless the
    #: alias sets ``MIN_INTERVAL`` in ``TMS_RUNNERS`` (see :mod:`runners.registry`).
    default_min_interval: ClassVar[float] = 1.0
    #: Validates a task's ``config`` for this runner; errors become per-field 400s.
    config_serializer_class: ClassVar[type[serializers.Serializer] | None] = None
    #: Whether ``cancel`` really stops the external run.
    supports_cancel: ClassVar[bool] = False
    #: Config fields (dot paths) whose every value is a secret: encrypted at rest, masked
    #: wherever a config is shown (tasks_app.secrets). Keys that look secret anywhere in a
    #: config (``token``, ``password``, ``api_key``, ...) and ``env`` mappings are secret for every runner.
    secret_config_fields: ClassVar[tuple[str, ...]] = ()
    #: Config fields that say where a run goes or what it runs (a URL, a command, an image, the
    #: recipients), for :meth:`destination`. None (a runner that declares nothing): the whole config.
    destination_config_fields: ClassVar[tuple[str, ...] | None] = None
    #: Modules that this runner's runs need and that are imported at first use
    #: (:class:`tms_core.lazy.LazyModule`): a large client SDK that most processes never call.
    lazy_modules: ClassVar[tuple[LazyModule, ...]] = ()

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: unknown OPTIONS {', '.join(unknown)} for "
                f"{type(self).__name__} (accepted: {', '.join(sorted(self.option_defaults)) or 'none'})"
            )
        self.alias = alias
        self.options = {**self.option_defaults, **options}
        #: Shortest time, in seconds, between two fire times a task on this runner may ask for.
        self.min_interval: float = self.default_min_interval

    def preload(self) -> None:
        """Import :attr:`lazy_modules` now. A Celery worker does so before it forks its pool
        (``executions.tasks``): its pool processes then share those modules instead of each
        importing its own copy at its first run. Web, beat and the monitor never do."""
        for module in self.lazy_modules:
            module.load()

    def launch_rate(self) -> tuple[int, float] | None:
        """At most ``(count, seconds)`` launches per owner in any window of that many seconds, or
        None for no limit. The worker-side services enforce it (through the database, which a
        runner never touches) before each :meth:`start`, deferring a launch that would exceed it.
        The window is at most an hour (the ledger keeps no use longer)."""
        return None

    def limit_key(self, config: Mapping[str, Any]) -> str:
        """The target a run of this config acts on, for named limits scoped ``host``: runs with
        the same key share one budget (``api.example.com``, a Lambda function, a Kubernetes
        namespace). The default is the runner's alias: every run of it targets the same thing.
        Must be cheap and never fail: it is called at each claim of a limited run."""
        return self.alias

    def destination(self, config: Any) -> Any:
        """Where a run of ``config`` goes, as a value to compare: a change of it between a task's
        stored config and an update drops every secret the update would keep from before unless
        it is sent again (tasks_app.secrets.config_carry_secrets): the owner's credentials never
        follow a run that someone else pointed elsewhere."""
        if self.destination_config_fields is None or not isinstance(config, Mapping):
            return config
        return tuple(config.get(name) for name in self.destination_config_fields)

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Return the normalised config, or raise ``serializers.ValidationError`` per field."""
        if self.config_serializer_class is None:
            if config not in (None, {}):
                raise serializers.ValidationError("This runner takes no config.")
            return {}
        if not isinstance(config, Mapping):
            raise serializers.ValidationError("Expected a JSON object.")
        serializer = self.config_serializer_class(data=config)
        serializer.is_valid(raise_exception=True)
        unknown = sorted(set(config) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return dict(serializer.validated_data)

    def timeout_problems(self, config: Mapping[str, Any], timeout: float) -> dict[str, list[str]]:
        """Per-field messages for a validated ``config`` that cannot work within the task's
        ``timeout`` (seconds): a pause longer than the run may last. None by default."""
        return {}

    def refuse(self, field: str, what: str, option: str, *, action: str = "add it to") -> None:
        """Raise the per-field error for a value this runner's operator has not allowed.

        Every refusal reads the same way: what is refused, then the option that would allow it
        ("... An operator can add it to the allowed_executables option of the 'local' runner.").
        """
        raise serializers.ValidationError(
            {field: [f"{what} An operator can {action} the {option} option of the {self.alias!r} runner."]}
        )

    def poll_again(self, log: logging.Logger, trouble: str, *args: object) -> RunResult:
        """Log transient trouble reading a run's state and report the run as still running.

        Failing the attempt instead would start a second run while the first may go on; the
        worker's own timeout ends a run whose state never comes back. ``trouble`` is a %-format
        for ``args`` ("polling %s failed: %s").
        """
        log.warning("%s %r: " + trouble + ", will poll again", type(self).__name__, self.alias, *args)
        return RunResult.running()

    def start(self, spec: RunSpec) -> RunHandle:
        """Start the attempt described by ``spec`` and return its handle.

        Must be idempotent on ``spec.idempotency_key``: if a run with that key already exists,
        adopt it and return its handle instead of launching a second one. A synchronous runner
        does the work here and returns the handle with ``result`` set.
        """
        raise NotImplementedError("subclasses of BaseRunner must provide a start() method")

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """Report the current state of a started run. Must not block for long."""
        raise NotImplementedError("subclasses of BaseRunner must provide a poll() method")

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """Stop the external run if it is still going; a no-op when it already ended."""
        raise NotImplementedError("subclasses of BaseRunner must provide a cancel() method")

    def output_so_far(self, spec: RunSpec, handle: RunHandle) -> str | None:
        """Optional: what a run still going has written so far (bounded, the end of it), for
        people watching it; None when this runner cannot tell. Reads only, never blocks for long
        and never changes the run. Pages call it on RUNNING executions (the output recorded in the
        database is the final one, written when the run ends)."""
        return None


# --------------------------------------------------------------------------------------------
# Checks and limits shared by backends
# --------------------------------------------------------------------------------------------


class UrlHostLimitKey:
    """For a runner (a :class:`BaseRunner`, named first) whose config's ``url`` is its target: a
    named limit scoped ``host`` has a budget per host of the URL (``api.example.com``)."""

    alias: str

    def limit_key(self, config: Mapping[str, Any]) -> str:
        """The host of the config's URL (the runner's alias when it has none)."""
        url = config.get("url")
        return (urlsplit(url).hostname or self.alias) if isinstance(url, str) else self.alias


class UrlLaunchRunner(UrlHostLimitKey, BaseRunner):
    """The base of the runners that launch a run with a request to the task's ``url`` carrying
    the attempt's Idempotency-Key (http, function): the URL is the task's destination and the
    host its named limits count by, its ``headers`` are secret, a run can be cancelled, and a
    re-sent launch answered with one of the ``in_progress_statuses`` is sent again
    (:meth:`resend_while_in_progress`). A subclass's ``option_defaults`` spread this class's."""

    option_defaults: ClassVar[Mapping[str, Any]] = {
        #: Status codes that answer a re-sent launch with "a request with this Idempotency-Key is
        #: still in progress": the launch is sent again after a backoff, never judged a failure.
        "in_progress_statuses": list(DEFAULT_IN_PROGRESS_STATUSES),
    }
    secret_config_fields = ("headers",)
    destination_config_fields = ("url",)
    supports_cancel = True
    #: How its log lines and errors name the runner's kind ("http runner"), before its alias.
    label: ClassVar[str]

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        self.in_progress_statuses = status_codes_option(alias, self.options, "in_progress_statuses")

    def resend_while_in_progress(
        self, send: Callable[[float], T], status_of: Callable[[T], int], *, spec: RunSpec, log: logging.Logger
    ) -> T:
        """:func:`resend_while_in_progress` with this runner's ``in_progress_statuses``."""
        return resend_while_in_progress(
            send,
            status_of,
            spec=spec,
            statuses=self.in_progress_statuses,
            log=log,
            runner=f"{self.label} {self.alias!r}",
        )


def status_codes_option(alias: str, options: Mapping[str, Any], name: str) -> frozenset[int]:
    """The OPTION ``name``, a list of HTTP status codes (``in_progress_statuses``), checked at start-up."""
    value = options[name]
    if not isinstance(value, list | tuple) or not all(
        isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 for code in value
    ):
        raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: {name} must be a list of HTTP status codes (100-599).")
    return frozenset(value)


def resend_while_in_progress(
    send: Callable[[float], T],
    status_of: Callable[[T], int],
    *,
    spec: RunSpec,
    statuses: frozenset[int],
    log: logging.Logger,
    runner: str,
) -> T:
    """Send a launch; while a re-sent one is answered "in progress", wait and send it again.

    ``send(seconds)`` sends the launch once (with ``spec``'s idempotency key, as always) within
    ``seconds`` and returns the reply, whose status ``status_of`` reads. When ``spec.resend`` is
    set (a lost worker may have sent the same launch, and the executor may still be running it)
    an answer in ``statuses`` means "a request with this key is still being processed": it is
    not the outcome of the attempt, so the launch is sent again, with the same key, after an
    exponential backoff, until the executor answers with the stored result of the first request.
    The attempt's timeout bounds the waiting; past it, :class:`RunnerError` (retryable) says so,
    as any other timeout. A first send is judged as it comes: there, a 409 is a real conflict.
    """
    deadline = time.monotonic() + spec.timeout
    reply = send(spec.timeout)
    delay = RESEND_BASE
    resends = 0
    while spec.resend and (status := status_of(reply)) in statuses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RunnerError(
                f"timed out after {spec.timeout:g}s: the executor still answered HTTP {status} (a request with "
                f"Idempotency-Key {spec.idempotency_key} in progress) to {resends} re-sends"
            )
        log.info(
            "%s: execution %s attempt %s: HTTP %s, the first launch with this key is still in progress; "
            "sending it again in %.2fs",
            runner,
            spec.execution_id,
            spec.attempt,
            status,
            min(delay, remaining),
        )
        time.sleep(min(delay, remaining))
        delay = min(delay * RESEND_FACTOR, RESEND_CAP)
        resends += 1
        reply = send(max(deadline - time.monotonic(), RESEND_BASE))
    return reply


def validate_headers(
    headers: dict[str, str], *, reserved: frozenset[str] = RESERVED_HEADERS, reserved_prefixes: tuple[str, ...] = ()
) -> dict[str, str]:
    """Check a task's extra request headers; raise one ``ValidationError`` listing every problem.

    ``reserved`` (lower case) and names starting with ``reserved_prefixes`` are set by the runner.
    """
    errors = []
    for name, value in headers.items():
        if not HEADER_NAME.match(name):
            errors.append(f"{name!r} is not a valid header name.")
        elif name.lower() in reserved or name.lower().startswith(reserved_prefixes):
            errors.append(f"The {name} header is set by the runner and cannot be configured.")
        elif any(char in value for char in "\r\n\0"):
            errors.append(f"The value of {name} may not contain line breaks or NUL.")
    if errors:
        raise serializers.ValidationError(errors)
    return headers


def arguments_field(**options: Any) -> serializers.ListField:
    """A task's arguments to a process (argv after the command): strings taken as they are, blank
    ones and surrounding white space kept."""
    return serializers.ListField(child=serializers.CharField(allow_blank=True, trim_whitespace=False), **options)


def environment_field(**options: Any) -> serializers.DictField:
    """A task's environment variables for a process, empty by default: values taken as they are,
    blank ones and surrounding white space kept (the runner checks the names)."""
    return serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), default=dict, **options
    )


def validate_json_size(value: Any, limit: int) -> Any:
    """Refuse a JSON document larger than ``limit`` bytes once encoded."""
    if len(json.dumps(value).encode()) > limit:
        raise serializers.ValidationError(f"At most {limit} bytes of JSON.")
    return value


def bounded_head(text: str, limit: int) -> str:
    """The first ``limit`` bytes of ``text``, saying how much was left out."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[... {len(data) - limit} more bytes omitted]"
