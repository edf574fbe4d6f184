"""Serverless runners: AWS Lambda through boto3, and generic asynchronous HTTP function platforms.

:class:`LambdaRunner`
    ``RequestResponse`` invocations are synchronous: ``start`` waits for the function (never
    longer than the attempt's timeout) and returns its result. ``Event`` invocations are queued by
    Lambda (``202``); with ``wait_for_callback`` the run then stays "running" until the function
    reports through the TMS callback URL (or the attempt times out), otherwise acceptance by
    Lambda counts as success (fire and forget).

    Idempotency, honestly: the Invoke API has no idempotency key. The runner sends the attempt's
    key in the event (``event["tms"]["idempotency_key"]``) and, for synchronous calls, in the
    ClientContext (``context.client_context.custom``), and remembers in memory which keys this
    process has invoked, so a repeated start in the same worker process returns the first
    handle instead of invoking again. That memory dies with the process: a worker killed between
    the invocation and the moment TMS stored the run id will, once the execution is resumed,
    invoke the function a second time with the same key. Exactly-once execution therefore needs
    the function to deduplicate on ``tms.idempotency_key`` (for example with the idempotency
    utility of Powertools for AWS Lambda, ``event_key_jmespath="tms.idempotency_key"``).
    SDK-level retries are switched off, since botocore would otherwise re-send an invocation
    after a read timeout; retries happen as TMS attempts, each with its own key.

    Errors: a ``FunctionError`` (the function raised, crashed or timed out) fails the attempt
    retryably, as a non-zero exit of a process does, except for deployment errors that another
    try cannot fix (``Runtime.ImportModuleError``, ``Runtime.HandlerNotFound``, ...).
    Throttling (429), Lambda service errors (5xx) and connection trouble are retryable
    :class:`RunnerError`\\ s; other client errors (unknown function, access denied, bad request)
    are not. Lambda cannot stop a running invocation, so ``cancel`` does nothing.

:class:`AsyncHttpFunctionRunner`
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
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import unquote, urljoin, urlsplit

import boto3
import requests
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec

logger = logging.getLogger(__name__)

#: Upper bound a task may set for ``max_output_bytes``: outputs end up in the database.
MAX_OUTPUT_BYTES_LIMIT = 1024 * 1024
#: Largest request payload accepted in a config (Lambda's own limit for synchronous calls is 6 MB).
MAX_PAYLOAD_BYTES = 256 * 1024
#: Key of the event that carries TMS's metadata; tasks may not use it themselves.
TMS_EVENT_KEY = "tms"


def _metadata(spec: RunSpec) -> dict[str, Any]:
    """What every invocation carries about the attempt that made it."""
    metadata: dict[str, Any] = {
        "idempotency_key": spec.idempotency_key,
        "execution_id": spec.execution_id,
        "attempt": spec.attempt,
        "task_id": str(spec.task_id),
    }
    if spec.callback_url:
        metadata["callback_url"] = spec.callback_url
    if spec.tracing_id:
        metadata["tracing_id"] = spec.tracing_id
    return metadata


def _bounded(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[... {len(data) - limit} more bytes omitted]"


def _payload_size_ok(value: Any) -> Any:
    if len(json.dumps(value).encode()) > MAX_PAYLOAD_BYTES:
        raise serializers.ValidationError(f"At most {MAX_PAYLOAD_BYTES} bytes of JSON.")
    return value


# ============================================================================================
# AWS Lambda
# ============================================================================================

#: Function name, name:qualifier, partial or full ARN (the pattern of the Invoke API).
_FUNCTION_NAME = re.compile(
    r"^(arn:(aws[a-zA-Z-]*)?:lambda:)?([a-z]{2}(-gov)?-[a-z]+-\d{1}:)?(\d{12}:)?(function:)?"
    r"([a-zA-Z0-9-_.]+)(:(\$LATEST|[a-zA-Z0-9-_]+))?$"
)
_QUALIFIER = re.compile(r"^(\$LATEST|[a-zA-Z0-9-_]{1,128})$")
#: FunctionError types that another attempt cannot fix: the deployment itself is broken.
_FINAL_FUNCTION_ERRORS = frozenset(
    {
        "Runtime.ImportModuleError",
        "Runtime.HandlerNotFound",
        "Runtime.UserCodeSyntaxError",
        "Runtime.MalformedHandlerName",
        "Runtime.InvalidEntrypoint",
    }
)
#: API errors worth another attempt although their status says otherwise, and the reverse.
_RETRYABLE_API_ERRORS = frozenset(
    {
        "TooManyRequestsException",
        "ThrottlingException",
        "ResourceConflictException",  # the function is being updated
        "ResourceNotReadyException",
        "ServiceException",
        "EC2ThrottledException",
        "ENILimitReachedException",
        "SubnetIPAddressLimitReachedException",
        "SnapStartNotReadyException",
        "SnapStartTimeoutException",
        "EFSMountConnectivityException",
        "EFSMountTimeoutException",
        "EFSIOException",
    }
)
_FINAL_API_ERRORS = frozenset(
    {
        "KMSAccessDeniedException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSNotFoundException",
        "InvalidRuntimeException",
        "InvalidSecurityGroupIDException",
        "InvalidSubnetIDException",
        "InvalidZipFileException",
        "EC2AccessDeniedException",
        "EFSMountFailureException",
    }
)
#: Invocations remembered per process for the in-process duplicate check.
_REMEMBERED_INVOCATIONS = 4096


class LambdaConfigSerializer(serializers.Serializer):
    function_name = serializers.CharField(max_length=256, help_text="Name, name:alias or ARN of the function.")
    qualifier = serializers.CharField(required=False, help_text="Version or alias to invoke.")
    payload = serializers.JSONField(default=dict, help_text="The event: a JSON object.")
    invocation_type = serializers.ChoiceField(
        choices=["RequestResponse", "Event"],
        default="RequestResponse",
        help_text="RequestResponse waits for the result; Event queues the invocation.",
    )
    wait_for_callback = serializers.BooleanField(
        default=False,
        help_text="Event only: stay running until the function reports through the callback URL.",
    )
    max_output_bytes = serializers.IntegerField(required=False, min_value=1, max_value=MAX_OUTPUT_BYTES_LIMIT)

    def validate_function_name(self, value: str) -> str:
        if not _FUNCTION_NAME.match(value):
            raise serializers.ValidationError("Not a Lambda function name or ARN.")
        return value

    def validate_qualifier(self, value: str) -> str:
        if not _QUALIFIER.match(value):
            raise serializers.ValidationError("Not a version number, alias or $LATEST.")
        return value

    def validate_payload(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object (the function's event).")
        if TMS_EVENT_KEY in value:
            raise serializers.ValidationError(f"The key {TMS_EVENT_KEY!r} is reserved for TMS's metadata.")
        return _payload_size_ok(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("wait_for_callback") and attrs.get("invocation_type") != "Event":
            raise serializers.ValidationError(
                {"wait_for_callback": ["Only Event invocations report back through the callback URL."]}
            )
        return attrs


def _function_label(function_name: str) -> str:
    """The bare function name of a name, name:alias or ARN (for the allow-list)."""
    match = _FUNCTION_NAME.match(function_name)
    return match.group(7) if match else function_name


class LambdaRunner(BaseRunner):
    """Invokes an AWS Lambda function per attempt; see the module docstring."""

    option_defaults: ClassVar[dict[str, Any]] = {
        "region_name": None,
        #: Lambda endpoint override (a VPC endpoint, LocalStack, the test emulator).
        "endpoint_url": None,
        #: Static credentials; None uses the default chain (environment, profile, instance role).
        "aws_access_key_id": None,
        "aws_secret_access_key": None,
        "aws_session_token": None,
        #: Shell-style patterns of function names tasks may invoke; None: whatever IAM allows.
        "allowed_functions": None,
        "connect_timeout": 5.0,
        #: Ask Lambda for the last 4 KB of the function's log on synchronous calls.
        "log_tail": True,
        "max_output_bytes": 65536,
    }
    config_serializer_class = LambdaConfigSerializer
    #: Lambda cannot stop an invocation that has started.
    supports_cancel = False

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        allowed = self.options["allowed_functions"]
        if allowed is not None and (
            not isinstance(allowed, list | tuple) or not all(isinstance(item, str) for item in allowed)
        ):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_functions must be None or a list.")
        if bool(self.options["aws_access_key_id"]) != bool(self.options["aws_secret_access_key"]):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: give both aws_access_key_id and aws_secret_access_key, or neither."
            )
        self._lock = threading.Lock()
        self._clients: dict[tuple[int, int], Any] = {}
        self._invoked: OrderedDict[str, RunHandle] = OrderedDict()

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also refuse a function the operator did not allow."""
        data = super().validate_config(config)
        if not self._function_allowed(data["function_name"]):
            self.refuse("function_name", "This function is not open to tasks.", "allowed_functions")
        return data

    def _function_allowed(self, function_name: str) -> bool:
        allowed = self.options["allowed_functions"]
        if allowed is None:
            return True
        label = _function_label(function_name)
        return any(
            fnmatch.fnmatchcase(label, pattern) or fnmatch.fnmatchcase(function_name, pattern) for pattern in allowed
        )

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """Invoke the function (see the module docstring for what a repeated start does)."""
        key = spec.idempotency_key
        with self._lock:
            remembered = self._invoked.get(key)
        if remembered is not None:
            logger.info("lambda runner %r: %s was already invoked by this process; not invoking again", self.alias, key)
            return remembered
        config = spec.config
        if not self._function_allowed(config["function_name"]):
            raise RunnerError(f"function {config['function_name']!r} is not open to tasks", retryable=False)
        invocation_type = config.get("invocation_type", "RequestResponse")
        metadata = _metadata(spec)
        request: dict[str, Any] = {
            "FunctionName": config["function_name"],
            "InvocationType": invocation_type,
            "Payload": json.dumps({**config.get("payload", {}), TMS_EVENT_KEY: metadata}).encode(),
        }
        if config.get("qualifier"):
            request["Qualifier"] = config["qualifier"]
        if invocation_type == "RequestResponse":
            # Lambda hands the ClientContext to synchronous invocations only.
            request["ClientContext"] = base64.b64encode(json.dumps({"custom": metadata}).encode()).decode()
            if self.options["log_tail"]:
                request["LogType"] = "Tail"
        response = self._invoke(spec, request)
        request_id = str(response.get("ResponseMetadata", {}).get("RequestId") or key)
        data = {"request_id": request_id, "invocation_type": invocation_type}
        if invocation_type == "Event":
            if config.get("wait_for_callback"):
                handle = RunHandle(request_id, data=data)
            else:
                handle = RunHandle(
                    request_id,
                    data=data,
                    result=RunResult.succeeded(f"queued for asynchronous invocation (request id {request_id})"),
                )
        else:
            data["executed_version"] = response.get("ExecutedVersion", "")
            handle = RunHandle(request_id, data=data, result=self._outcome(spec, response))
        with self._lock:
            self._invoked[key] = handle
            while len(self._invoked) > _REMEMBERED_INVOCATIONS:
                self._invoked.popitem(last=False)
        return handle

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """An ``Event`` run waiting for its callback is running until the callback or the timeout."""
        if handle.data.get("invocation_type") == "Event":
            return RunResult.running()
        return RunResult.failed("a synchronous invocation has nothing to poll", retryable=False)

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """Lambda cannot stop an invocation: nothing to do (the function should honour its own timeout)."""
        logger.info("lambda runner %r: cannot cancel invocation %s", self.alias, handle.external_run_id)

    # -- helpers ------------------------------------------------------------------------------

    def _client(self, read_timeout: float) -> Any:
        """A Lambda client for this process whose read timeout fits the attempt."""
        slot = (os.getpid(), max(1, math.ceil(read_timeout)))
        with self._lock:
            client = self._clients.get(slot)
            if client is None:
                session = boto3.session.Session(
                    aws_access_key_id=self.options["aws_access_key_id"],
                    aws_secret_access_key=self.options["aws_secret_access_key"],
                    aws_session_token=self.options["aws_session_token"],
                    region_name=self.options["region_name"],
                )
                config = BotoConfig(
                    connect_timeout=float(self.options["connect_timeout"]),
                    read_timeout=slot[1],
                    retries={"total_max_attempts": 1},
                    user_agent_extra="tms-lambda-runner",
                )
                try:
                    client = session.client("lambda", endpoint_url=self.options["endpoint_url"], config=config)
                except NoRegionError as exc:
                    raise RunnerError(
                        f"lambda runner {self.alias!r}: no region_name configured", retryable=False
                    ) from exc
                self._clients = {key: value for key, value in self._clients.items() if key[0] == slot[0]}
                self._clients[slot] = client
            return client

    def _invoke(self, spec: RunSpec, request: Mapping[str, Any]) -> dict[str, Any]:
        synchronous = request["InvocationType"] == "RequestResponse"
        read_timeout = min(float(spec.timeout), 900.0) if synchronous else float(self.options["connect_timeout"]) * 2
        name = request["FunctionName"]
        try:
            return self._client(read_timeout).invoke(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "")
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _FINAL_API_ERRORS:
                retryable = False
            else:
                retryable = code in _RETRYABLE_API_ERRORS or status >= 500 or status == 429
            message = f"invoking {name}: {code or 'error'} (HTTP {status}): {error.get('Message') or ''}".rstrip(": ")
            raise RunnerError(message, retryable=retryable) from exc
        except ReadTimeoutError as exc:
            raise RunnerError(
                f"invoking {name}: no answer within {read_timeout:g}s; the invocation may still be running"
            ) from exc
        except NoCredentialsError as exc:
            raise RunnerError(f"invoking {name}: no AWS credentials found", retryable=False) from exc
        except BotoConnectionError as exc:
            raise RunnerError(f"invoking {name}: cannot reach Lambda: {exc}") from exc
        except BotoCoreError as exc:
            raise RunnerError(f"invoking {name}: {exc}") from exc

    def _outcome(self, spec: RunSpec, response: Mapping[str, Any]) -> RunResult:
        """The result of a synchronous invocation."""
        limit = int(spec.config.get("max_output_bytes") or self.options["max_output_bytes"])
        stream = response.get("Payload")
        raw = b""
        if stream is not None:
            try:
                raw = stream.read(max(limit, 256 * 1024) + 1)
            finally:
                stream.close()
        text = raw.decode("utf-8", errors="replace")
        log = ""
        if response.get("LogResult"):
            try:
                log = base64.b64decode(response["LogResult"]).decode("utf-8", errors="replace")
            except (binascii.Error, ValueError):
                log = ""
        function_error = response.get("FunctionError")
        if not function_error:
            return RunResult.succeeded(_bounded(text, limit))
        try:
            document = json.loads(text)
        except ValueError:
            document = {}
        document = document if isinstance(document, dict) else {}
        error_type = str(document.get("errorType") or "")
        message = str(document.get("errorMessage") or text or "no details")
        error = f"function error ({function_error}): " + (f"{error_type}: " if error_type else "") + message
        output = _bounded(log or text, limit)
        return RunResult.failed(
            _bounded(error, 4096), output=output, retryable=error_type not in _FINAL_FUNCTION_ERRORS
        )


# ============================================================================================
# Asynchronous HTTP function platforms
# ============================================================================================

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
#: Headers the runner sets itself, or that would break the request framing if a task set them.
_RESERVED_HEADERS = frozenset(
    {"idempotency-key", "host", "content-length", "transfer-encoding", "connection", "content-type"}
)
_RUNNING_STATES = frozenset({"queued", "pending", "accepted", "running", "in_progress", "started"})
_SUCCEEDED_STATES = frozenset({"succeeded", "success", "completed", "complete", "done"})
_FAILED_STATES = frozenset({"failed", "failure", "error", "errored"})
_CANCELLED_STATES = frozenset({"cancelled", "canceled", "aborted"})
#: Largest start or status document read from a platform.
_DOCUMENT_MAX_BYTES = 2 * 1024 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
        return _payload_size_ok(value)

    def validate_headers(self, value: dict[str, str]) -> dict[str, str]:
        errors = []
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                errors.append(f"{name!r} is not a valid header name.")
            elif name.lower() in _RESERVED_HEADERS or name.lower().startswith("x-tms-"):
                errors.append(f"{name!r} is set by TMS.")
            elif any(char in text for char in "\r\n\0"):
                errors.append(f"{name!r}: values may not contain line breaks.")
        if errors:
            raise serializers.ValidationError(errors)
        return value


class AsyncHttpFunctionRunner(BaseRunner):
    """Starts, polls and cancels runs on an asynchronous HTTP function platform."""

    option_defaults: ClassVar[dict[str, Any]] = {
        #: URL prefixes tasks may use, e.g. ``["http://gateway.openfaas:8080/async-function/"]``.
        "allowed_urls": [],
        #: Seconds for each request (connect and read), within the attempt's timeout.
        "request_timeout": 10.0,
        "verify_ssl": True,
        "max_output_bytes": 65536,
        "user_agent": "TMS-function-runner/1.0",
    }
    config_serializer_class = AsyncHttpFunctionConfigSerializer
    supports_cancel = True

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        self.allowed_urls = UrlAllowList(self.options["allowed_urls"], alias=alias)
        self._lock = threading.Lock()
        self._session: tuple[int, requests.Session] | None = None

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also refuse a URL outside the operator's ``allowed_urls``."""
        data = super().validate_config(config)
        if not self.allowed_urls.allows(data["url"]):
            raise serializers.ValidationError(
                {
                    "url": [
                        f"This URL is not open to tasks. An operator can add its prefix to the allowed_urls "
                        f"option of the {self.alias!r} runner."
                    ]
                }
            )
        return data

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """POST the payload with the attempt's ``Idempotency-Key``; the platform names the run."""
        url = spec.config["url"]
        headers = {**spec.config.get("headers", {}), **self._tms_headers(spec), "Content-Type": "application/json"}
        status, body, location = self._exchange(
            "POST", url, spec, headers=headers, data=json.dumps(spec.config.get("payload", {}))
        )
        if status == 429 or status >= 500:
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
            if str(document.get("status", "")).lower() in _SUCCEEDED_STATES | _FAILED_STATES:
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
                logger.warning(
                    "function runner %r: polling %s failed, will poll again: %s", self.alias, status_url, exc
                )
                return RunResult.running()
            raise
        if status == 429 or status >= 500:
            logger.warning(
                "function runner %r: polling %s got HTTP %s, will poll again", self.alias, status_url, status
            )
            return RunResult.running()
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
        headers = {
            "Idempotency-Key": spec.idempotency_key,
            "X-TMS-Execution-Id": str(spec.execution_id),
            "X-TMS-Attempt": str(spec.attempt),
            "X-TMS-Task-Id": str(spec.task_id),
            "Accept": "application/json",
        }
        if spec.callback_url:
            headers["X-TMS-Callback-Url"] = spec.callback_url
        if spec.tracing_id:
            headers["X-TMS-Tracing-Id"] = spec.tracing_id
        return headers

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

    def _http(self) -> requests.Session:
        with self._lock:
            if self._session is None or self._session[0] != os.getpid():
                session = requests.Session()
                # Endpoints are the operator's own: no proxies or .netrc credentials from the environment.
                session.trust_env = False
                session.headers["User-Agent"] = str(self.options["user_agent"])
                self._session = (os.getpid(), session)
            return self._session[1]

    def _exchange(
        self, method: str, url: str, spec: RunSpec, *, headers: Mapping[str, str], data: str | None = None
    ) -> tuple[int, bytes, str | None]:
        """One request, no redirects, bounded body: (status, body, Location header)."""
        if not self._may_contact(url, spec):
            raise RunnerError(f"{url!r} is outside the allowed_urls of the {self.alias!r} runner", retryable=False)
        seconds = max(0.1, min(float(self.options["request_timeout"]), float(spec.timeout)))
        try:
            with self._http().request(
                method,
                url,
                headers=dict(headers),
                data=data,
                timeout=(seconds, seconds),
                allow_redirects=False,
                stream=True,
                verify=bool(self.options["verify_ssl"]),
            ) as response:
                body = response.raw.read(_DOCUMENT_MAX_BYTES, decode_content=True) if method != "HEAD" else b""
                return response.status_code, body or b"", response.headers.get("Location")
        except requests.Timeout as exc:
            raise RunnerError(f"{method} {url}: no answer within {seconds:g}s") from exc
        except requests.ConnectionError as exc:
            raise RunnerError(f"{method} {url}: cannot connect: {exc}") from exc
        except requests.RequestException as exc:
            raise RunnerError(f"{method} {url}: {exc}", retryable=False) from exc

    def _result(self, spec: RunSpec, document: Mapping[str, Any]) -> RunResult:
        limit = int(spec.config.get("max_output_bytes") or self.options["max_output_bytes"])
        state = str(document.get("status", "")).lower()
        output = document.get("output", "")
        text = output if isinstance(output, str) else json.dumps(output)
        text = _bounded(text, limit) if text else ""
        if state in _RUNNING_STATES:
            return RunResult.running()
        if state in _SUCCEEDED_STATES:
            return RunResult.succeeded(text)
        if state in _FAILED_STATES:
            error = str(document.get("error") or "the function failed")
            retryable = document.get("retryable")
            return RunResult.failed(
                _bounded(error, 4096), output=text, retryable=retryable if isinstance(retryable, bool) else True
            )
        if state in _CANCELLED_STATES:
            return RunResult.failed("the run was cancelled on the platform", output=text)
        return RunResult.failed(f"the platform reported an unknown status {state!r}", retryable=False)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _excerpt(body: bytes, limit: int = 512) -> str:
    return body[:limit].decode("utf-8", errors="replace").strip()
