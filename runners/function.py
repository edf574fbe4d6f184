"""The ``function`` runner: starts, polls and cancels runs on an asynchronous HTTP function platform.

For platforms that run a function asynchronously behind HTTP (OpenFaaS async functions,
Knative-style job APIs, in-house gateways): ``start`` POSTs the payload with an
``Idempotency-Key`` header and expects ``{"run_id": ..., "status_url": ...}`` (``202``). The
platform deduplicates on the key, so a repeated start returns the same run. ``poll`` GETs the
status URL (``{"status": "queued|running|succeeded|failed|cancelled", "output", "error"}``) and
``cancel`` DELETEs it.

Reachability: task owners pick the URL, so the runner only talks to URLs under the operator's
``allowed_urls`` prefixes (scheme, host, port and path prefix must all match), checked when the
task is saved and again before every request. The status URL the platform returns must be
under ``allowed_urls`` too, or on the same origin (scheme, host, port) as the function URL;
redirects are not followed. This is stricter than the http runner's ``allowed_networks`` (which
guards arbitrary public URLs at the socket level): these platforms are a short, fixed list of
operator endpoints, so naming them is both simpler and tighter than opening whole networks.

Each request, and the judging of what went wrong (retryable or not), is :mod:`runners.transport`'s,
shared with the ``http`` runner, as is the reading of a run's status document. Each exchange has a
session of its own, ignoring the environment (no proxies or ``.netrc`` credentials), under a
:class:`~runners.netguard.Guard` whose deadline bounds the whole exchange, as the http runner's do.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import unquote, urljoin, urlsplit

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners.base import (
    MAX_OUTPUT_BYTES_LIMIT,
    RESERVED_HEADERS,
    RunHandle,
    RunnerError,
    RunResult,
    RunSpec,
    UrlLaunchRunner,
    validate_headers,
    validate_json_size,
)
from runners.netguard import AddressPolicy, Guard, guarded_session
from runners.transport import (
    FINISHED_STATES,
    document_state,
    json_document,
    origin,
    send,
    status_document_result,
    status_is_retryable,
)

logger = logging.getLogger(__name__)

#: Largest payload accepted in a config.
MAX_PAYLOAD_BYTES = 256 * 1024
#: On top of the shared ones: the runner sends JSON, and X-TMS-* headers carry the attempt's ids.
_RESERVED_HEADERS = RESERVED_HEADERS | {"content-type"}
_RESERVED_HEADER_PREFIXES = ("x-tms-",)
#: The attempt's facts (:meth:`runners.base.RunSpec.attempt_facts`) as the headers of every request.
_FACT_HEADERS = {
    "idempotency_key": "Idempotency-Key",
    "execution_id": "X-TMS-Execution-Id",
    "attempt": "X-TMS-Attempt",
    "task_id": "X-TMS-Task-Id",
    "callback_url": "X-TMS-Callback-Url",
    "callback_token": "X-TMS-Callback-Token",
    "tracing_id": "X-TMS-Tracing-Id",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
}
#: Largest start or status document read from a platform.
_DOCUMENT_MAX_BYTES = 2 * 1024 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Reachability is ``allowed_urls``' (checked before every request), so the guard of an exchange
#: only keeps its deadline: any address a listed host resolves to is fine.
_ANY_ADDRESS = AddressPolicy(networks=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


def _url_parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of an absolute http(s) URL without credentials, else None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        return None
    segments = unquote(parts.path).split("/")
    if "." in segments or ".." in segments:
        return None
    return parts.scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[parts.scheme], parts.path or "/"


class UrlAllowList:
    """URL prefixes an operator opened: same scheme, host and port, and a path under the prefix."""

    def __init__(self, entries: Any, *, alias: str) -> None:
        if not isinstance(entries, list | tuple) or not all(isinstance(entry, str) for entry in entries):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_urls must be a list of URL prefixes.")
        self.prefixes: list[tuple[str, str, int, str]] = []
        for entry in entries:
            parts = _url_parts(entry)
            if parts is None:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_urls entry {entry!r} is not an http(s) URL."
                )
            self.prefixes.append(parts)

    def allows(self, url: str) -> bool:
        parts = _url_parts(url)
        if parts is None:
            return False
        scheme, host, port, path = parts
        for p_scheme, p_host, p_port, p_path in self.prefixes:
            if (scheme, host, port) != (p_scheme, p_host, p_port):
                continue
            if path == p_path or path.startswith(p_path if p_path.endswith("/") else p_path + "/"):
                return True
        return False


class AsyncHttpFunctionConfigSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2048, help_text="The function's asynchronous invocation URL.")
    payload = serializers.JSONField(default=dict, help_text="JSON body sent to the function.")
    headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=8192), default=dict, help_text="Extra headers."
    )
    max_output_bytes = serializers.IntegerField(required=False, min_value=1, max_value=MAX_OUTPUT_BYTES_LIMIT)

    def validate_payload(self, value: Any) -> Any:
        return validate_json_size(value, MAX_PAYLOAD_BYTES)

    def validate_headers(self, value: dict[str, str]) -> dict[str, str]:
        return validate_headers(value, reserved=_RESERVED_HEADERS, reserved_prefixes=_RESERVED_HEADER_PREFIXES)


class AsyncHttpFunctionRunner(UrlLaunchRunner):
    """Starts, polls and cancels runs on an asynchronous HTTP function platform."""

    label = "function runner"
    option_defaults: ClassVar[Mapping[str, Any]] = {
        #: URL prefixes tasks may use, e.g. ``["http://gateway.openfaas:8080/async-function/"]``.
        "allowed_urls": [],
        #: Seconds for each request (connect and read), within the attempt's timeout.
        "request_timeout": 10.0,
        "verify_ssl": True,
        "max_output_bytes": 65536,
        "user_agent": "TMS-function-runner/1.0",
        **UrlLaunchRunner.option_defaults,
    }
    config_serializer_class = AsyncHttpFunctionConfigSerializer

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        self.allowed_urls = UrlAllowList(self.options["allowed_urls"], alias=alias)

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also refuse a URL outside the operator's ``allowed_urls``."""
        data = super().validate_config(config)
        if not self.allowed_urls.allows(data["url"]):
            self.refuse("url", "This URL is not open to tasks.", "allowed_urls", action="add its prefix to")
        return data

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """POST the payload with the attempt's ``Idempotency-Key``; the platform names the run.

        A re-sent start (``spec.resend``) answered with an ``in_progress_statuses`` code is sent
        again until the platform answers with the run (:func:`resend_while_in_progress`).
        """
        url = spec.config["url"]
        headers = {**spec.config.get("headers", {}), **self._tms_headers(spec), "Content-Type": "application/json"}
        payload = json.dumps(spec.config.get("payload", {}))
        status, body, location = self.resend_while_in_progress(
            lambda _seconds: self._exchange("POST", url, spec, headers=headers, data=payload),
            lambda reply: reply[0],
            spec=spec,
            log=logger,
        )
        if status_is_retryable(status):
            raise RunnerError(f"starting the function: HTTP {status}: {_excerpt(body)}")
        if not 200 <= status < 300:
            raise RunnerError(f"starting the function: HTTP {status}: {_excerpt(body)}", retryable=False)
        document = _json_object(body)
        if document is None:
            raise RunnerError(f"starting the function: HTTP {status} without a JSON object", retryable=False)
        run_id = document.get("run_id") or document.get("id")
        status_url = document.get("status_url") or location
        if not run_id or not isinstance(run_id, str | int):
            raise RunnerError("starting the function: the platform named no run_id", retryable=False)
        if not status_url or not isinstance(status_url, str):
            if document_state(document) in FINISHED_STATES:
                return RunHandle(str(run_id), data={"run_id": str(run_id)}, result=self._result(spec, document))
            raise RunnerError("starting the function: the platform named no status_url", retryable=False)
        status_url = urljoin(url, status_url)
        if not self._may_contact(status_url, spec):
            raise RunnerError(
                f"the platform's status URL {status_url!r} is outside allowed_urls and the function's origin",
                retryable=False,
            )
        return RunHandle(str(run_id), data={"run_id": str(run_id), "status_url": status_url})

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """GET the status URL; transient trouble reports the run as still running."""
        status_url = handle.data.get("status_url")
        if not status_url:
            return RunResult.failed("this run has no status URL", retryable=False)
        try:
            status, body, _ = self._exchange("GET", status_url, spec, headers=self._tms_headers(spec))
        except RunnerError as exc:
            if exc.retryable:
                return self.poll_again(logger, "polling %s failed: %s", status_url, exc)
            raise
        if status_is_retryable(status):
            return self.poll_again(logger, "polling %s got HTTP %s", status_url, status)
        if status in (404, 410):
            return RunResult.failed(f"run {handle.external_run_id} is unknown to the platform (HTTP {status})")
        if not 200 <= status < 300:
            return RunResult.failed(f"status check failed: HTTP {status}: {_excerpt(body)}", retryable=False)
        document = _json_object(body)
        if document is None:
            return RunResult.failed("status check returned no JSON object", retryable=False)
        return self._result(spec, document)

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """Best effort: DELETE the status URL."""
        status_url = handle.data.get("status_url")
        if not status_url:
            return
        try:
            status, body, _ = self._exchange("DELETE", status_url, spec, headers=self._tms_headers(spec))
        except RunnerError as exc:
            logger.warning("function runner %r: cancelling %s failed: %s", self.alias, handle.external_run_id, exc)
            return
        if not (200 <= status < 300 or status in (404, 410)):
            logger.warning(
                "function runner %r: cancelling %s got HTTP %s: %s",
                self.alias,
                handle.external_run_id,
                status,
                _excerpt(body),
            )

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _tms_headers(spec: RunSpec) -> dict[str, str]:
        return {**spec.facts_named(_FACT_HEADERS), "Accept": "application/json"}

    def _may_contact(self, url: str, spec: RunSpec) -> bool:
        """Under ``allowed_urls``, or on the origin of the task's own (allowed) function URL.

        The second case covers status URLs, which platforms put elsewhere on the same gateway.
        """
        if self.allowed_urls.allows(url):
            return True
        function_url = spec.config["url"]
        if not self.allowed_urls.allows(function_url):
            return False
        target, origin = _url_parts(url), _url_parts(function_url)
        return target is not None and origin is not None and target[:3] == origin[:3]

    def _exchange(
        self, method: str, url: str, spec: RunSpec, *, headers: Mapping[str, str], data: str | None = None
    ) -> tuple[int, bytes, str | None]:
        """One request, no redirects, bounded body (:func:`runners.transport.send`): (status, body,
        Location header)."""
        if not self._may_contact(url, spec):
            raise RunnerError(f"{url!r} is outside the allowed_urls of the {self.alias!r} runner", retryable=False)
        seconds = max(0.1, min(float(self.options["request_timeout"]), float(spec.timeout)))
        headers = {"User-Agent": str(self.options["user_agent"]), **headers}
        # The deadline covers the whole exchange: socket timeouts bound each read only, so a
        # platform trickling its answer a byte at a time would otherwise hold the worker (and
        # the run, past its task's timeout) for as long as it kept trickling.
        with Guard(_ANY_ADDRESS, seconds) as guard, guarded_session(guard) as session:
            reply = send(
                session, method, url, headers=headers, body=data, seconds=seconds, limit=_DOCUMENT_MAX_BYTES,
                guard=guard, verify=bool(self.options["verify_ssl"]),
            )  # fmt: skip
        return reply.status, reply.body, reply.headers.get("Location")

    def _result(self, spec: RunSpec, document: Mapping[str, Any]) -> RunResult:
        limit = int(spec.config.get("max_output_bytes") or self.options["max_output_bytes"])
        return status_document_result(document, limit=limit, source=origin(spec.config["url"]))


def _json_object(body: bytes) -> dict[str, Any] | None:
    document = json_document(body)
    return document if isinstance(document, dict) else None


def _excerpt(body: bytes, limit: int = 512) -> str:
    return body[:limit].decode("utf-8", errors="replace").strip()
