"""The ``lambda`` runner: invokes an AWS Lambda function per attempt, through boto3.

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

Allow-list: a task may invoke only functions the operator listed in ``allowed_functions``; the
list is empty by default, so a fresh deployment invokes nothing, whatever its IAM role may call.
Patterns match the function's full unqualified ARN, so account and region are part of every
check: a bare name pattern (``etl-*``) stands for that name in the runner's ``account_id`` and
``region_name``, and a task's bare name resolves the same way. The runner invokes the ARN it
checked, never the bare name, so the credentials' default account cannot substitute another.
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

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners.base import (
    MAX_OUTPUT_BYTES_LIMIT,
    BaseRunner,
    RunHandle,
    RunnerError,
    RunResult,
    RunSpec,
    bounded_head,
    validate_json_size,
)
from runners.transport import status_is_retryable
from tms_core.lazy import LazyModule

# Imported at the first invocation, or by a worker before it forks (BaseRunner.preload): every
# process builds this runner, few call it.
boto3 = LazyModule("boto3")
_botocore_config = LazyModule("botocore.config")
_boto_errors = LazyModule("botocore.exceptions")

logger = logging.getLogger(__name__)

#: Largest event accepted in a config (Lambda's own limit for synchronous calls is 6 MB).
MAX_PAYLOAD_BYTES = 256 * 1024
#: Key of the event that carries TMS's metadata; tasks may not use it themselves.
TMS_EVENT_KEY = "tms"
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
        return validate_json_size(value, MAX_PAYLOAD_BYTES)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("wait_for_callback") and attrs.get("invocation_type") != "Event":
            raise serializers.ValidationError(
                {"wait_for_callback": ["Only Event invocations report back through the callback URL."]}
            )
        return attrs


_ACCOUNT_ID = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


def _partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def _arn(*, region: str, account: str, name: str, partition: str | None = None) -> str:
    return f"arn:{partition or _partition(region)}:lambda:{region}:{account}:function:{name}"


class LambdaRunner(BaseRunner):
    """Invokes an AWS Lambda function per attempt; see the module docstring."""

    lazy_modules = (boto3, _botocore_config, _boto_errors)

    option_defaults: ClassVar[dict[str, Any]] = {
        "region_name": None,
        #: Lambda endpoint override (a VPC endpoint, LocalStack, the test emulator).
        "endpoint_url": None,
        #: Static credentials; None uses the default chain (environment, profile, instance role).
        "aws_access_key_id": None,
        "aws_secret_access_key": None,
        "aws_session_token": None,
        #: The AWS account the runner's credentials belong to: bare function names (in tasks and
        #: in ``allowed_functions``) mean functions of this account in ``region_name``.
        "account_id": None,
        #: Shell-style patterns of the functions tasks may invoke, matched against the function's
        #: full unqualified ARN: ``arn:aws:lambda:eu-west-1:123456789012:function:etl-*``, or a bare
        #: name pattern (``etl-*``), which stands for that name in ``account_id`` and ``region_name``.
        #: Empty (the default): no function at all; an operator lists what tasks may call.
        "allowed_functions": [],
        "connect_timeout": 5.0,
        #: Ask Lambda for the last 4 KB of the function's log on synchronous calls.
        "log_tail": True,
        "max_output_bytes": 65536,
    }
    config_serializer_class = LambdaConfigSerializer
    destination_config_fields = ("function_name", "qualifier")
    #: Lambda cannot stop an invocation that has started.
    supports_cancel = False

    def limit_key(self, config: Mapping[str, Any]) -> str:
        """The function (its name, ``name:alias`` or ARN as the task gives it)."""
        name = config.get("function_name")
        return name if isinstance(name, str) and name else self.alias

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        allowed = self.options["allowed_functions"]
        if not isinstance(allowed, list | tuple) or not all(isinstance(item, str) and item for item in allowed):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: allowed_functions must be a list of function ARN or name patterns "
                "(an empty list allows no function)."
            )
        self.account_id = self.options["account_id"]
        self.region = self.options["region_name"]
        if self.account_id is not None and not (
            isinstance(self.account_id, str) and _ACCOUNT_ID.match(self.account_id)
        ):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: account_id must be a 12-digit AWS account id.")
        #: Every pattern as a pattern of full ARNs, so that a name never matches another account's function.
        self.allowed_arns: tuple[str, ...] = tuple(self._arn_pattern(pattern) for pattern in allowed)
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

    def _arn_pattern(self, pattern: str) -> str:
        if pattern.startswith("arn:"):
            if len(pattern.split(":")) < 7:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{self.alias!r}]: allowed_functions entry {pattern!r} is not a function ARN "
                    "(arn:aws:lambda:REGION:ACCOUNT:function:NAME)."
                )
            return pattern
        if ":" in pattern:
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{self.alias!r}]: allowed_functions entry {pattern!r} must be a bare name pattern "
                "or a full function ARN pattern."
            )
        if not (self.account_id and isinstance(self.region, str) and _REGION.match(self.region)):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{self.alias!r}]: the bare name pattern {pattern!r} in allowed_functions needs "
                "account_id and region_name (or list full function ARNs)."
            )
        return _arn(region=self.region, account=self.account_id, name=pattern)

    def resolve_arn(self, function_name: str) -> str | None:
        """The full ARN (with its qualifier, if any) a name, name:qualifier, partial or full ARN
        stands for, or None when the runner does not know the account or region it lacks."""
        match = _FUNCTION_NAME.match(function_name)
        if match is None:
            return None
        partition = match.group(2)
        region = match.group(3)[:-1] if match.group(3) else self.region
        account = match.group(5)[:-1] if match.group(5) else self.account_id
        if not region or not account:
            return None
        arn = _arn(region=region, account=account, name=match.group(7), partition=partition)
        return f"{arn}:{match.group(9)}" if match.group(9) else arn

    def _function_allowed(self, function_name: str) -> bool:
        """Whether the function's full ARN (qualifier left out) matches an allowed pattern."""
        arn = self.resolve_arn(function_name)
        if arn is None:
            return False
        unqualified = ":".join(arn.split(":")[:7])
        return any(fnmatch.fnmatchcase(unqualified, pattern) for pattern in self.allowed_arns)

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
            # The ARN that was checked is the one invoked, whatever account the credentials are for.
            "FunctionName": self.resolve_arn(config["function_name"]),
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
                config = _botocore_config.Config(
                    connect_timeout=float(self.options["connect_timeout"]),
                    read_timeout=slot[1],
                    retries={"total_max_attempts": 1},
                    user_agent_extra="tms-lambda-runner",
                )
                try:
                    client = session.client("lambda", endpoint_url=self.options["endpoint_url"], config=config)
                except _boto_errors.NoRegionError as exc:
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
        except _boto_errors.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "")
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _FINAL_API_ERRORS:
                retryable = False
            else:
                retryable = code in _RETRYABLE_API_ERRORS or status_is_retryable(status)
            message = f"invoking {name}: {code or 'error'} (HTTP {status}): {error.get('Message') or ''}".rstrip(": ")
            raise RunnerError(message, retryable=retryable) from exc
        except _boto_errors.ReadTimeoutError as exc:
            raise RunnerError(
                f"invoking {name}: no answer within {read_timeout:g}s; the invocation may still be running"
            ) from exc
        except _boto_errors.NoCredentialsError as exc:
            raise RunnerError(f"invoking {name}: no AWS credentials found", retryable=False) from exc
        except _boto_errors.ConnectionError as exc:
            raise RunnerError(f"invoking {name}: cannot reach Lambda: {exc}") from exc
        except _boto_errors.BotoCoreError as exc:
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
            return RunResult.succeeded(bounded_head(text, limit))
        try:
            document = json.loads(text)
        except ValueError:
            document = {}
        document = document if isinstance(document, dict) else {}
        error_type = str(document.get("errorType") or "")
        message = str(document.get("errorMessage") or text or "no details")
        error = f"function error ({function_error}): " + (f"{error_type}: " if error_type else "") + message
        output = bounded_head(log or text, limit)
        return RunResult.failed(
            bounded_head(error, 4096), output=output, retryable=error_type not in _FINAL_FUNCTION_ERRORS
        )


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
        if spec.callback_token:
            metadata["callback_token"] = spec.callback_token
    if spec.tracing_id:
        metadata["tracing_id"] = spec.tracing_id
    if spec.traceparent:
        metadata["traceparent"] = spec.traceparent
        if spec.tracestate:
            metadata["tracestate"] = spec.tracestate
    return metadata
