"""The ``http`` runner: calls a webhook or URL, either synchronously or as an asynchronous job.

Synchronous mode (the default) sends one request inside :meth:`HttpRunner.start` and judges the
response: a GET ping, a POST with a JSON or raw body, a Slack-style incoming webhook. Asynchronous
mode (``"async": true``) expects the endpoint to accept the job (``202 Accepted``) and name a status
URL, in the ``Location`` header or a ``status_url`` JSON field; :meth:`HttpRunner.poll` then reads
``{"status": "running|succeeded|failed", "output": ..., "error": ...}`` from it and
:meth:`HttpRunner.cancel` sends it a DELETE.

Every request carries ``Idempotency-Key: <spec.idempotency_key>`` so that an endpoint which
deduplicates on it launches one run however often an attempt is started.

SSRF guard: task owners choose the URL, so every connection goes through :mod:`runners.netguard`,
which by default refuses anything but public addresses, checked on the address the socket actually
connects to. Redirects are followed by hand, one hop at a time, so each hop goes through the same
check. Operators open specific networks or host names with the ``allowed_networks`` option.

Each request, and the judging of what went wrong (retryable or not), is :mod:`runners.transport`'s,
shared with the ``function`` runner.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urljoin, urlsplit

from django.core.exceptions import ImproperlyConfigured
from requests.structures import CaseInsensitiveDict
from rest_framework import serializers

from runners.base import (
    RESERVED_HEADERS,
    RunHandle,
    RunnerError,
    RunResult,
    RunSpec,
    UrlLaunchRunner,
    validate_headers,
)
from runners.netguard import AddressPolicy, Guard, guarded_session, literal_ip, normalise_host
from runners.transport import (
    FINISHED_STATES,
    Reply,
    document_state,
    excerpt,
    json_document,
    origin,
    send,
    status_document_result,
    status_is_retryable,
)
from tms_core.durations import DurationField, parse_duration

logger = logging.getLogger(__name__)

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
_BODYLESS_METHODS = frozenset({"GET", "HEAD"})
#: On top of the shared ones: the runner sends the callback URL and token itself.
_RESERVED_HEADERS = RESERVED_HEADERS | {"x-tms-callback-url", "x-tms-callback-token"}
#: The only headers a redirect to another origin keeps. Every other one (the task's own headers,
#: whatever their names, the callback URL, the Idempotency-Key) was meant for the origin the task
#: names: a secret in ``X-Api-Key`` deserves the same care as one in ``Authorization``, and the
#: Idempotency-Key identifies a launch only to the endpoint that received it.
_CROSS_ORIGIN_HEADERS = frozenset({"user-agent", "content-type"})  # the body (and its type) never crosses

#: Upper bound a task may set for ``max_response_bytes``: outputs end up in the database.
MAX_RESPONSE_BYTES_LIMIT = 10 * 1024 * 1024
#: Largest request body a task may configure.
MAX_BODY_BYTES = 1024 * 1024
#: Status documents are read up to this size (their ``output`` is then cut to ``max_response_bytes``).
_STATUS_DOCUMENT_MAX_BYTES = 1024 * 1024
#: A poll or cancel request never blocks longer than this, whatever the task's timeout.
_POLL_TIMEOUT = 30.0
_RUN_ID_MAX_CHARS = 200
_RUN_ID_HEADERS = ("X-Run-Id", "X-Request-Id")


# --------------------------------------------------------------------------------------------
# Per-task config
# --------------------------------------------------------------------------------------------


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be called (syntax only: the host is never resolved here), or None."""
    if any(char.isspace() or ord(char) < 0x20 or ord(char) == 0x7F for char in url):
        return "URL may not contain spaces or control characters."
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "Enter a valid URL."
    if parts.scheme.lower() not in ("http", "https"):
        scheme = f'"{parts.scheme}"' if parts.scheme else "none"
        return f"Only http and https URLs are allowed (scheme: {scheme})."
    if "@" in parts.netloc:
        return "URL may not contain a user name or password; send credentials in headers instead."
    if not parts.hostname:
        return "URL has no host."
    if port == 0:
        return "URL port may not be 0."
    return None


class _MethodField(serializers.ChoiceField):
    def to_internal_value(self, data: Any) -> Any:
        return super().to_internal_value(data.strip().upper() if isinstance(data, str) else data)


class HttpConfigSerializer(serializers.Serializer):
    """Per-task config of the ``http`` runner."""

    url = serializers.CharField(max_length=2048, help_text="http(s) URL to call.")
    method = _MethodField(
        choices=HTTP_METHODS, required=False, help_text="HTTP method; GET by default, POST when a body is given."
    )
    headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=8192),
        required=False,
        help_text="Extra request headers, name to value.",
    )
    json = serializers.JSONField(required=False, help_text="JSON document sent as the request body.")
    body = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_BODY_BYTES,
        help_text="Raw request body (sent as UTF-8); exclusive with json.",
    )
    expected_status = serializers.ListField(
        child=serializers.IntegerField(min_value=100, max_value=599),
        allow_empty=False,
        max_length=100,
        required=False,
        help_text="Status codes that mean success; any 2xx by default.",
    )
    timeout = DurationField(
        min_value=timedelta(milliseconds=1),
        required=False,
        help_text='Request timeout, e.g. "10s"; never longer than the task timeout.',
    )
    max_response_bytes = serializers.IntegerField(
        min_value=0,
        max_value=MAX_RESPONSE_BYTES_LIMIT,
        required=False,
        help_text="How much of the response body to keep as output.",
    )
    follow_redirects = serializers.BooleanField(default=True, help_text="Follow redirects (each hop is checked).")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # ``async`` is a Python keyword, so it cannot be declared as a class attribute.
        fields["async"] = serializers.BooleanField(
            default=False,
            help_text="The endpoint answers 202 with a status URL (Location header or status_url field) to poll.",
        )
        return fields

    def validate_url(self, value: str) -> str:
        problem = url_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    def validate_headers(self, value: dict[str, str]) -> dict[str, str]:
        return validate_headers(value, reserved=_RESERVED_HEADERS)

    def validate_json(self, value: Any) -> Any:
        try:
            encoded = json.dumps(value, allow_nan=False)
        except ValueError:
            raise serializers.ValidationError("NaN and Infinity are not valid JSON.") from None
        if len(encoded.encode()) > MAX_BODY_BYTES:
            raise serializers.ValidationError(f"The JSON body may be at most {MAX_BODY_BYTES} bytes.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_body = "json" in attrs or "body" in attrs
        if "json" in attrs and "body" in attrs:
            message = "Give either json or body, not both."
            raise serializers.ValidationError({"json": [message], "body": [message]})
        method = attrs.setdefault("method", "POST" if has_body else "GET")
        if has_body and method in _BODYLESS_METHODS:
            raise serializers.ValidationError(
                {"method": [f"A {method} request cannot carry a body; use POST, PUT, PATCH or DELETE."]}
            )
        return attrs


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


def _origin_key(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, normalise_host(parts.hostname or ""), parts.port or {"http": 80, "https": 443}.get(scheme)


def _safe_origin_key(url: str) -> tuple[str, str, int | None] | None:
    try:
        return _origin_key(url)
    except ValueError:
        return None


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return parse_duration(value).total_seconds()


def _status_is_success(status: int, expected: Sequence[int] | None) -> bool:
    return status in expected if expected else 200 <= status < 300


def _status_error(reply: Reply) -> str:
    message = f"HTTP {reply.status}{f' {reply.reason}' if reply.reason else ''} from {reply.origin}"
    quoted = excerpt(reply.text)
    return f"{message}: {quoted}" if quoted else message


def _clean_run_id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value).strip()
    if not text or len(text) > _RUN_ID_MAX_CHARS or not text.isprintable():
        return None
    return text


def _redirected(status: int, method: str, body: bytes | None) -> tuple[str, bytes | None]:
    """The method and body of the next hop, as browsers and requests do it."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        return "GET", None
    return method, body


class HttpRunner(UrlLaunchRunner):
    """Calls an http(s) URL per task config, behind an SSRF guard; see the module docstring."""

    label = "http runner"
    option_defaults: ClassVar[Mapping[str, Any]] = {
        #: CIDRs, addresses or host names (``*.svc.internal`` too) opened despite the SSRF guard.
        "allowed_networks": [],
        #: Default cap on the response body kept as output; tasks may set their own.
        "max_response_bytes": 65536,
        "user_agent": "TMS-http-runner/1.0",
        #: Redirect hops followed before giving up.
        "max_redirects": 5,
        **UrlLaunchRunner.option_defaults,
    }
    config_serializer_class = HttpConfigSerializer
    # Cancelling stops async runs (DELETE on the status URL); synchronous runs end inside ``start``.

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        self.policy = AddressPolicy.from_entries(self.options["allowed_networks"], alias=alias)
        self.max_response_bytes = self._int_option("max_response_bytes", upper=MAX_RESPONSE_BYTES_LIMIT)
        self.max_redirects = self._int_option("max_redirects", upper=50)
        self.user_agent = self.options["user_agent"]
        if not isinstance(self.user_agent, str) or any(char in self.user_agent for char in "\r\n\0"):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: user_agent must be a single-line string.")

    def _int_option(self, name: str, *, upper: int) -> int:
        value = self.options[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
            raise ImproperlyConfigured(f"TMS_RUNNERS[{self.alias!r}]: {name} must be an integer from 0 to {upper}.")
        return value

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also refuse a URL whose host is a literal address the guard blocks.

        Host names are not resolved here (that would be a DNS lookup on every save, and its
        answer could change anyway): they are checked when the runner connects.
        """
        data = super().validate_config(config)
        host = urlsplit(data["url"]).hostname or ""
        ip = literal_ip(host)
        if ip is None and normalise_host(host) == "localhost":
            ip = ipaddress.IPv4Address("127.0.0.1")
        if ip is not None and (reason := self.policy.refusal(host, ip)) is not None:
            self.refuse(
                "url", f"This address is not reachable from TMS: {reason}.", "allowed_networks", action="open it in"
            )
        return data

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """Send the configured request; in async mode, return a handle on the status URL it names.

        Never launches twice for one key by itself (it sends one request, plus redirect hops),
        and the ``Idempotency-Key`` header lets the endpoint adopt a repeated start. A re-sent
        start (``spec.resend``) answered with an ``in_progress_statuses`` code is sent again until
        the endpoint answers with the first request's result (:func:`resend_while_in_progress`).
        """
        config = spec.config
        key = spec.idempotency_key
        body, content_type = self._body(config)
        method = str(config.get("method") or ("POST" if body is not None else "GET")).upper()
        headers = self._headers(spec, target=config["url"])
        if content_type and "Content-Type" not in headers:
            headers["Content-Type"] = content_type
        limit = self._limit(config)
        is_async = bool(config.get("async"))

        def send(seconds: float) -> Reply:
            return self._exchange(
                method,
                config["url"],
                headers=headers,
                body=body,
                seconds=min(self._seconds(spec), seconds),
                follow_redirects=bool(config.get("follow_redirects", True)),
                # An async answer is parsed for its status URL, so read it whole (within reason).
                limit=max(limit, _STATUS_DOCUMENT_MAX_BYTES) if is_async else limit,
            )

        try:
            reply = self.resend_while_in_progress(send, lambda reply: reply.status, spec=spec, log=logger)
        except RunnerError as exc:
            return RunHandle(key, result=RunResult.failed(str(exc), retryable=exc.retryable))
        run_id = self._run_id(reply) or key
        shown = reply.capped(limit)
        if not _status_is_success(reply.status, config.get("expected_status")):
            return RunHandle(
                run_id,
                result=RunResult.failed(
                    _status_error(shown), output=shown.text, retryable=status_is_retryable(reply.status)
                ),
            )
        if not is_async:
            return RunHandle(run_id, result=RunResult.succeeded(shown.text))
        return self._accepted(spec, reply, run_id, limit=limit)

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """GET the status URL of an async run and read its status document.

        Transient trouble (5xx, 429, timeouts, connection errors) reports the run as still
        running: failing the attempt would start a second run while the first may go on. The
        worker's own timeout ends a run whose status never comes back.
        """
        status_url = handle.data.get("status_url")
        if not status_url:
            return RunResult.failed("this run has no status URL: it was not started in async mode", retryable=False)
        try:
            reply = self._status_exchange("GET", spec, status_url, limit=_STATUS_DOCUMENT_MAX_BYTES)
        except RunnerError as exc:
            if exc.retryable:
                return self.poll_again(logger, "status check of %s failed: %s", handle.external_run_id, exc)
            return RunResult.failed(f"status check failed: {exc}", retryable=False)
        if status_is_retryable(reply.status):
            return self.poll_again(logger, "status check of %s got HTTP %s", handle.external_run_id, reply.status)
        if not 200 <= reply.status < 300:
            return RunResult.failed(f"status check failed: {_status_error(reply)}", retryable=False)
        return self._document_result(reply, limit=self._limit(spec.config))

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """Best effort: DELETE the status URL of an async run; nothing to do for synchronous runs."""
        status_url = handle.data.get("status_url")
        if not status_url:
            return
        try:
            reply = self._status_exchange("DELETE", spec, status_url, limit=0)
        except RunnerError as exc:
            logger.warning("http runner %r: cancelling %s failed: %s", self.alias, handle.external_run_id, exc)
            return
        if not (200 <= reply.status < 300 or reply.status in (404, 410)):
            logger.warning(
                "http runner %r: cancelling %s got HTTP %s", self.alias, handle.external_run_id, reply.status
            )

    # -- helpers ------------------------------------------------------------------------------

    def _status_exchange(self, method: str, spec: RunSpec, status_url: str, *, limit: int) -> Reply:
        """A bodyless request to an async run's status URL (a poll's GET, a cancel's DELETE), within
        the poll timeout, following redirects as the task's config says."""
        return self._exchange(
            method,
            status_url,
            headers=self._headers(spec, target=status_url),
            body=None,
            seconds=self._seconds(spec, cap=_POLL_TIMEOUT),
            follow_redirects=bool(spec.config.get("follow_redirects", True)),
            limit=limit,
        )

    def _limit(self, config: Mapping[str, Any]) -> int:
        value = config.get("max_response_bytes")
        return self.max_response_bytes if value is None else int(value)

    @staticmethod
    def _seconds(spec: RunSpec, *, cap: float | None = None) -> float:
        """The time one exchange may take: the configured timeout, within the attempt's."""
        seconds = float(spec.timeout)
        configured = _seconds(spec.config.get("timeout"))
        if configured is not None:
            seconds = min(seconds, configured)
        if cap is not None:
            seconds = min(seconds, cap)
        return seconds

    @staticmethod
    def _body(config: Mapping[str, Any]) -> tuple[bytes | None, str | None]:
        if "json" in config:
            return json.dumps(config["json"], allow_nan=False).encode(), "application/json"
        if config.get("body") is not None:
            return str(config["body"]).encode(), None
        return None, None

    def _headers(self, spec: RunSpec, *, target: str) -> CaseInsensitiveDict[str]:
        """Headers for a request to ``target``.

        The task's own headers and the callback URL and token only go to the task URL's origin (a status URL
        on another origin gets neither); the Idempotency-Key goes with every request.
        """
        headers: CaseInsensitiveDict[str] = CaseInsensitiveDict({"User-Agent": self.user_agent})
        try:
            same_origin = _origin_key(target) == _origin_key(spec.config["url"])
        except ValueError:
            same_origin = False
        if same_origin:
            for name, value in (spec.config.get("headers") or {}).items():
                if name.lower() not in _RESERVED_HEADERS:
                    headers[name] = str(value)
        headers["Idempotency-Key"] = spec.idempotency_key
        if spec.traceparent:
            headers["traceparent"] = spec.traceparent
            if spec.tracestate:
                headers["tracestate"] = spec.tracestate
            else:
                headers.pop("tracestate", None)  # a task's own would not go with this traceparent
        if spec.callback_url and same_origin:
            headers["X-TMS-Callback-URL"] = spec.callback_url
            if spec.callback_token:
                headers["X-TMS-Callback-Token"] = spec.callback_token
        return headers

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        headers: CaseInsensitiveDict[str],
        body: bytes | None,
        seconds: float,
        follow_redirects: bool,
        limit: int,
    ) -> Reply:
        """Send one request, following redirects hop by hop; raise RunnerError when it failed."""
        headers = CaseInsensitiveDict(headers)
        with Guard(self.policy, seconds) as guard, guarded_session(guard) as session:
            hops = 0
            while True:
                problem = url_problem(url)
                if problem is not None:
                    raise RunnerError(f"cannot call {origin(url)}: {problem}", retryable=False)
                reply = send(
                    session, method, url, headers=headers, body=body, seconds=seconds, limit=limit, guard=guard,
                    follow_redirects=follow_redirects,
                )  # fmt: skip
                if reply.location is None:
                    return reply
                if hops >= self.max_redirects:
                    raise RunnerError(
                        f"too many redirects (more than {self.max_redirects}) from {origin(url)}", retryable=False
                    )
                hops += 1
                next_url = urljoin(reply.url, reply.location)
                method, new_body = _redirected(reply.status, method, body)
                leaving = _safe_origin_key(next_url) != _safe_origin_key(url)
                if leaving and new_body is not None:
                    # A 307 or 308 (or a 301 or 302 of a PUT) would send the body again, to an
                    # origin the task does not name: the body is the task's (a token in a JSON
                    # field), so the redirect is not followed.
                    raise RunnerError(
                        f"not following the {reply.status} redirect from {origin(url)} to "
                        f"{origin(next_url)}: it would send the request body to another origin",
                        retryable=False,
                    )
                if new_body is None and body is not None:
                    headers.pop("Content-Type", None)
                body = new_body
                if leaving:
                    # Once dropped they stay dropped, even if a later hop comes back.
                    for name in [name for name in headers if name.lower() not in _CROSS_ORIGIN_HEADERS]:
                        del headers[name]
                url = next_url

    def _run_id(self, reply: Reply) -> str | None:
        for name in _RUN_ID_HEADERS:
            if (run_id := _clean_run_id(reply.headers.get(name))) is not None:
                return run_id
        return None

    def _accepted(self, spec: RunSpec, reply: Reply, run_id: str, *, limit: int) -> RunHandle:
        """Turn the answer of an async start into a handle on its status URL."""
        document = json_document(reply.body) if not reply.truncated else None
        if isinstance(document, Mapping) and run_id == spec.idempotency_key:
            run_id = _clean_run_id(document.get("run_id")) or _clean_run_id(document.get("id")) or run_id
        status_url = document.get("status_url") if isinstance(document, Mapping) else None
        if not isinstance(status_url, str) or not status_url:
            status_url = reply.headers.get("Location")
        if not status_url:
            if isinstance(document, Mapping) and document_state(document) in FINISHED_STATES:
                # The endpoint finished the job within the request and answered with its status document.
                return RunHandle(run_id, result=self._document_result(reply, limit=limit))
            return RunHandle(
                run_id,
                result=RunResult.failed(
                    f"async endpoint {reply.origin} answered HTTP {reply.status} without a status URL "
                    "(Location header or status_url field)",
                    output=reply.capped(limit).text,
                    retryable=False,
                ),
            )
        status_url = urljoin(reply.url, status_url)
        problem = url_problem(status_url)
        if problem is not None:
            return RunHandle(
                run_id,
                result=RunResult.failed(f"async endpoint gave an unusable status URL: {problem}", retryable=False),
            )
        return RunHandle(run_id, data={"status_url": status_url})

    @staticmethod
    def _document_result(reply: Reply, *, limit: int) -> RunResult:
        """Read ``{"status": ..., "output": ..., "error": ...}`` into a RunResult."""
        if reply.truncated:
            return RunResult.failed(
                f"the status document from {reply.origin} is larger than {reply.limit} bytes", retryable=False
            )
        document = json_document(reply.body)
        if not isinstance(document, Mapping) or not isinstance(document.get("status"), str):
            return RunResult.failed(
                f"{reply.origin} did not answer with a status document "
                f'({{"status": "running|succeeded|failed", ...}}): {excerpt(reply.text)}',
                retryable=False,
            )
        return status_document_result(document, limit=limit, source=reply.origin)
