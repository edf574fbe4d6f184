"""An emulation of the AWS Lambda Invoke API (``POST /2015-03-31/functions/{name}/invocations``).

Functions are Python callables registered by the test, called as ``handler(event, context)``
like a Python Lambda handler. What boto3 sees matches the real service:

- ``RequestResponse`` (default): 200 with the JSON result, ``X-Amz-Executed-Version``, and when the
  handler raises, ``X-Amz-Function-Error: Unhandled`` with an ``{"errorMessage", "errorType",
  "stackTrace"}`` payload (a function that outlives its ``timeout`` gives ``Sandbox.Timedout``);
  ``X-Amz-Log-Type: Tail`` returns the last 4 KB of the log in ``X-Amz-Log-Result``;
- ``Event``: 202 with an empty body; the handler runs in a background thread;
- ``DryRun``: 204;
- unknown function: 404 ``ResourceNotFoundException``; :meth:`LambdaEmulator.throttle_next` gives
  429 ``TooManyRequestsException``, :meth:`LambdaEmulator.fail_next` any other service error.

``invocations`` records every accepted Invoke call; ``executions`` counts handler runs per TMS
idempotency key (``event["tms"]["idempotency_key"]``).
"""

from __future__ import annotations

import base64
import json
import threading
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

from tests.emulators.base import EmulatorServer, Request, Response

_PREFIX = "/2015-03-31/functions/"
_SUFFIX = "/invocations"

Handler = Callable[[Any, Any], Any]


@dataclass
class Function:
    handler: Handler
    timeout: float = 30.0
    version: str = "$LATEST"


@dataclass
class Invocation:
    function: str
    qualifier: str | None
    invocation_type: str
    event: Any
    client_context: dict[str, Any] | None
    request_id: str


@dataclass
class LambdaContext:
    """The subset of the Python runtime's context object that handlers use."""

    function_name: str
    function_version: str
    invoked_function_arn: str
    aws_request_id: str
    client_context: Any
    deadline: float
    logs: list[str] = field(default_factory=list)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))

    def log(self, message: str) -> None:
        self.logs.append(message)


class LambdaEmulator(EmulatorServer):
    """The Lambda Invoke API on 127.0.0.1; see the module docstring."""

    def __init__(self, *, region: str = "us-east-1", account: str = "123456789012") -> None:
        super().__init__()
        self.region, self.account = region, account
        self.functions: dict[str, Function] = {}
        self.invocations: list[Invocation] = []
        self.executions: Counter[str] = Counter()
        self._faults: deque[tuple[int, str, str]] = deque()
        self._background: list[threading.Thread] = []

    # -- test helpers -------------------------------------------------------------------------

    def register(self, name: str, handler: Handler, *, timeout: float = 30.0, version: str = "$LATEST") -> None:
        with self.lock:
            self.functions[name] = Function(handler, timeout, version)

    def throttle_next(self, times: int = 1) -> None:
        for _ in range(times):
            self.fail_next(429, "TooManyRequestsException", "Rate Exceeded.")

    def fail_next(self, status: int, code: str, message: str) -> None:
        with self.lock:
            self._faults.append((status, code, message))

    def wait_for_background(self, seconds: float = 5) -> None:
        """Wait for the handlers of Event invocations to finish."""
        deadline = time.monotonic() + seconds
        for thread in list(self._background):
            thread.join(max(0.0, deadline - time.monotonic()))

    def arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account}:function:{name}"

    # -- HTTP ---------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        if request.method != "POST" or not request.path.startswith(_PREFIX) or not request.path.endswith(_SUFFIX):
            return _error(404, "UnknownOperationException", "Unknown operation")
        request_id = str(uuid.uuid4())
        with self.lock:
            if self._faults:
                status, code, message = self._faults.popleft()
                headers = {"Retry-After": "1"} if status == 429 else {}
                return _error(status, code, message, request_id=request_id, headers=headers)
        name, qualifier = _function_name(unquote(request.path[len(_PREFIX) : -len(_SUFFIX)]))
        qualifier = request.param("Qualifier") or qualifier
        function = self.functions.get(name)
        if function is None:
            return _error(
                404, "ResourceNotFoundException", f"Function not found: {self.arn(name)}", request_id=request_id
            )
        invocation_type = request.header("x-amz-invocation-type") or "RequestResponse"
        try:
            event = json.loads(request.body) if request.body else {}
        except ValueError:
            return _error(400, "InvalidRequestContentException", "Could not parse request body into json")
        client_context = None
        if encoded := request.header("x-amz-client-context"):
            client_context = json.loads(base64.b64decode(encoded))
        with self.lock:
            self.invocations.append(Invocation(name, qualifier, invocation_type, event, client_context, request_id))
        version = qualifier if qualifier and qualifier.isdigit() else function.version
        context = LambdaContext(
            function_name=name,
            function_version=version,
            invoked_function_arn=self.arn(name) + (f":{qualifier}" if qualifier else ""),
            aws_request_id=request_id,
            client_context=SimpleNamespace(custom=(client_context or {}).get("custom")) if client_context else None,
            deadline=time.monotonic() + function.timeout,
        )
        if invocation_type == "DryRun":
            return Response(204, headers={"x-amzn-RequestId": request_id})
        if invocation_type == "Event":
            thread = threading.Thread(target=self._run, args=(function, event, context), daemon=True)
            self._background.append(thread)
            thread.start()
            return Response(202, headers={"x-amzn-RequestId": request_id})
        result, error = self._run(function, event, context)
        headers = {"x-amzn-RequestId": request_id, "X-Amz-Executed-Version": version}
        if request.header("x-amz-log-type") == "Tail":
            log = _log_text(context)
            headers["X-Amz-Log-Result"] = base64.b64encode(log.encode()[-4096:]).decode()
        if error is not None:
            headers["X-Amz-Function-Error"] = "Unhandled"
            return Response.json(200, error, headers)
        return Response.json(200, result, headers)

    def _run(self, function: Function, event: Any, context: LambdaContext) -> tuple[Any, dict[str, Any] | None]:
        key = event.get("tms", {}).get("idempotency_key") if isinstance(event, dict) else None
        if key:
            with self.lock:
                self.executions[key] += 1
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["result"] = function.handler(event, context)
            except Exception as exc:  # noqa: BLE001 - the runtime reports any exception
                outcome["error"] = {
                    "errorMessage": str(exc),
                    "errorType": getattr(exc, "error_type", type(exc).__name__),
                    "requestId": context.aws_request_id,
                    "stackTrace": traceback.format_tb(exc.__traceback__),
                }
                context.log(f"[ERROR] {type(exc).__name__}: {exc}")

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        worker.join(function.timeout)
        if worker.is_alive():
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            message = f"{stamp} Task timed out after {function.timeout:.2f} seconds"
            context.log(message)
            return None, {"errorMessage": message, "errorType": "Sandbox.Timedout"}
        return outcome.get("result"), outcome.get("error")


def _function_name(text: str) -> tuple[str, str | None]:
    """Name and qualifier of ``name``, ``name:qualifier`` or an (partial) ARN."""
    parts = text.split(":")
    if "function" in parts:
        parts = parts[parts.index("function") + 1 :]
    return parts[0], (parts[1] if len(parts) > 1 else None)


def _log_text(context: LambdaContext) -> str:
    request_id = context.aws_request_id
    lines = [f"START RequestId: {request_id} Version: {context.function_version}", *context.logs]
    lines += [f"END RequestId: {request_id}", f"REPORT RequestId: {request_id}\tDuration: 1.00 ms"]
    return "\n".join(lines) + "\n"


def _error(
    status: int, code: str, message: str, *, request_id: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    document: dict[str, Any] = {"Type": "User" if status < 500 else "Service", "message": message}
    if code == "TooManyRequestsException":
        document["Reason"] = "ReservedFunctionConcurrentInvocationLimitExceeded"
    extra = {"x-amzn-ErrorType": code, **(headers or {})}
    if request_id:
        extra["x-amzn-RequestId"] = request_id
    return Response.json(status, document, extra)
