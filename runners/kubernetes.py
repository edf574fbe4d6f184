"""The ``kubernetes`` runner: runs each attempt as a batch/v1 Job through the official client.

The Job name is derived from the idempotency key (``<name_prefix>tms-<execution>-<attempt>``), so
a repeated start gets ``409 AlreadyExists`` from the API server and adopts the existing Job (after
checking, through its ``tms.io/idempotency-key`` and ``tms.io/task-id`` annotations, that TMS
created it for this very attempt) instead of launching a second one. If a create fails with a transient error the runner
reads the Job back before giving up, since the request may have reached the server anyway.

Poll reads the Job status: a ``Complete`` condition (or ``succeeded`` reaching ``completions``)
is success, a ``Failed`` condition (``BackoffLimitExceeded``, ``DeadlineExceeded``, ...) is a
failure; the output is a one-line summary plus the tail of the last pod's log. Cancel deletes the
Job (``propagationPolicy`` ``Foreground`` by default, so its pods go first), with a uid
precondition so that only the Job this attempt created can be deleted.

API errors: connection trouble, 5xx and 429 are retryable :class:`RunnerError`\\ s; other 4xx
are not. A poll that meets a retryable error reports the run as still running (and logs it):
failing the attempt would start a second Job while the first may go on; the worker's timeout
ends a run whose status never comes back. Note that a Job deleted by its
``ttl_seconds_after_finished`` can no longer be adopted: keep that TTL well above the poll interval.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import urllib3
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec, arguments_field, environment_field
from runners.transport import status_is_retryable
from tms_core.lazy import LazyModule

# Imported at the first call that needs it, or by a worker before it forks (BaseRunner.preload):
# every process builds this runner, few call it.
_k8s = LazyModule("kubernetes.client")
if TYPE_CHECKING:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException
else:
    k8s = _k8s
k8s_config = LazyModule("kubernetes.config")
_api_errors = LazyModule("kubernetes.client.exceptions")
_config_errors = LazyModule("kubernetes.config.config_exception")

logger = logging.getLogger(__name__)

T = TypeVar("T")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([eE][+-]?\d+)|[KMGTPE]i|[numkMGTPE])?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
#: Label and annotation prefix TMS writes; tasks may not set labels under it.
TMS_PREFIX = "tms.io/"
KEY_ANNOTATION = f"{TMS_PREFIX}idempotency-key"
TASK_ANNOTATION = f"{TMS_PREFIX}task-id"
RUN_LABEL = f"{TMS_PREFIX}run"
_CONTAINER = "task"
_PROPAGATION_POLICIES = ("Foreground", "Background")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix must be a DNS subdomain."
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"{key!r}: the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric."
    if key.startswith(TMS_PREFIX) or key == "app.kubernetes.io/managed-by":
        return f"{key!r} is set by TMS."
    return None


def _label_value(text: str) -> str:
    """``text`` made into a valid label value (at most 63 characters, alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return cleaned.strip("-_.")


class KubernetesConfigSerializer(serializers.Serializer):
    image = serializers.CharField(max_length=1024, help_text="Container image, e.g. ghcr.io/acme/report:1.4.")
    command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False), required=False, help_text="Entrypoint override (argv)."
    )
    args = arguments_field(required=False, help_text="Arguments to the entrypoint.")
    env = environment_field(help_text="Environment variables of the container.")
    namespace = serializers.CharField(required=False, max_length=63, help_text="Defaults to the runner's namespace.")
    resources = serializers.DictField(
        required=False, help_text='{"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {...}}'
    )
    backoff_limit = serializers.IntegerField(
        default=0, min_value=0, max_value=100, help_text="Pod retries inside one attempt."
    )
    active_deadline_seconds = serializers.IntegerField(
        required=False, min_value=1, help_text="Kubernetes-side deadline; defaults to the task timeout."
    )
    ttl_seconds_after_finished = serializers.IntegerField(
        required=False,
        min_value=300,
        help_text="Seconds before Kubernetes deletes the finished Job; defaults to the runner's setting.",
    )
    labels = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=63), default=dict, help_text="Extra Job labels."
    )

    def validate_image(self, value: str) -> str:
        if not value.strip() or any(char.isspace() for char in value):
            raise serializers.ValidationError("Must be an image reference without spaces.")
        return value

    def validate_namespace(self, value: str) -> str:
        if not _DNS1123_LABEL.match(value):
            raise serializers.ValidationError("Must be a DNS-1123 label (lowercase letters, digits and '-').")
        return value

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        errors = [
            f"{name!r} is not a valid variable name." if not _ENV_NAME.match(name) else f"{name!r} is set by TMS."
            for name in value
            if not _ENV_NAME.match(name) or name.upper().startswith("TMS_")
        ]
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_resources(self, value: dict[str, Any]) -> dict[str, dict[str, str]]:
        errors: list[str] = []
        cleaned: dict[str, dict[str, str]] = {}
        for section, amounts in value.items():
            if section not in ("requests", "limits"):
                errors.append(f"{section!r}: only 'requests' and 'limits' are allowed.")
                continue
            if not isinstance(amounts, dict):
                errors.append(f"{section}: expected an object of resource quantities.")
                continue
            cleaned[section] = {}
            for resource, amount in amounts.items():
                text = str(amount) if isinstance(amount, int | float) and not isinstance(amount, bool) else amount
                if not isinstance(resource, str) or not _RESOURCE_NAME.match(resource):
                    errors.append(f"{section}.{resource}: not a resource name.")
                elif not isinstance(text, str) or not _QUANTITY.match(text):
                    errors.append(f"{section}.{resource}: {amount!r} is not a quantity such as '500m' or '128Mi'.")
                else:
                    cleaned[section][resource] = text
        if errors:
            raise serializers.ValidationError(errors)
        return cleaned

    def validate_labels(self, value: dict[str, str]) -> dict[str, str]:
        errors = [problem for key in value if (problem := _label_key_problem(key))]
        errors += [
            f"{key!r}: {text!r} is not a valid label value."
            for key, text in value.items()
            if text and not _LABEL_NAME.match(text)
        ]
        if errors:
            raise serializers.ValidationError(errors)
        return value


# --------------------------------------------------------------------------------------------
# API errors
# --------------------------------------------------------------------------------------------


class KubernetesApiError(RunnerError):
    """An error answer from the API server, with its HTTP status and ``Status.reason``."""

    def __init__(self, message: str, *, status: int | None, reason: str = "") -> None:
        retryable = status is None or status_is_retryable(status)
        super().__init__(message, retryable=retryable)
        self.status = status
        self.reason = reason


def _api_error(action: str, exc: ApiException) -> KubernetesApiError:
    reason, message = str(exc.reason or ""), ""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict):
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or "")
    text = f"{action}: HTTP {exc.status} {reason}" + (f": {message}" if message else "")
    return KubernetesApiError(text, status=exc.status, reason=reason)


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


class KubernetesRunner(BaseRunner):
    """Runs each attempt as a Kubernetes Job; see the module docstring."""

    option_defaults: ClassVar[dict[str, Any]] = {
        #: Path of a kubeconfig file. None: in-cluster config if available, else the default kubeconfig.
        "kubeconfig": None,
        #: kubeconfig context to use (None: its current context).
        "context": None,
        #: Namespace of tasks that name none.
        "namespace": "default",
        #: Further namespaces tasks may choose; ``["*"]`` allows any.
        "allowed_namespaces": [],
        #: API server base URL, overriding the loaded configuration (tests, proxies).
        "host": None,
        "verify_ssl": True,
        #: Seconds for each API request (connect and read).
        "request_timeout": 10.0,
        #: Default ``ttlSecondsAfterFinished`` of Jobs (None: kept until deleted).
        "ttl_seconds_after_finished": 86400,
        #: Prepended to Job names, to keep several TMS installations apart in one namespace.
        "name_prefix": "",
        "service_account_name": None,
        "automount_service_account_token": False,
        #: How ``cancel`` deletes a Job: Foreground (pods first) or Background.
        "delete_propagation": "Foreground",
        #: Lines of the last pod's log added to the output (0: none).
        "log_tail_lines": 20,
        "max_output_bytes": 65536,
    }
    config_serializer_class = KubernetesConfigSerializer
    secret_config_fields = ("env",)
    destination_config_fields = ("image", "command", "args", "namespace")
    supports_cancel = True
    lazy_modules = (_k8s, k8s_config, _api_errors, _config_errors)

    def limit_key(self, config: Mapping[str, Any]) -> str:
        """The namespace its Jobs go to."""
        namespace = config.get("namespace") or self.options["namespace"]
        return f"namespace {namespace}"

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        prefix = self.options["name_prefix"]
        if not isinstance(prefix, str) or (prefix and not re.match(r"^[a-z0-9][-a-z0-9]*$", prefix)):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: name_prefix must be lowercase letters, digits, '-'.")
        if not isinstance(self.options["namespace"], str) or not _DNS1123_LABEL.match(self.options["namespace"]):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: namespace must be a DNS-1123 label.")
        if self.options["delete_propagation"] not in _PROPAGATION_POLICIES:
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: delete_propagation must be one of {', '.join(_PROPAGATION_POLICIES)}."
            )
        allowed = self.options["allowed_namespaces"]
        if not isinstance(allowed, list | tuple) or not all(isinstance(item, str) for item in allowed):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_namespaces must be a list of names.")
        self._lock = threading.Lock()
        self._clients: tuple[int, k8s.BatchV1Api, k8s.CoreV1Api] | None = None

    # -- validation ---------------------------------------------------------------------------

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config; also refuse a namespace the operator did not open."""
        data = super().validate_config(config)
        namespace = data.get("namespace")
        if namespace and not self._namespace_allowed(namespace):
            self.refuse("namespace", f"Namespace {namespace!r} is not open to tasks.", "allowed_namespaces")
        return data

    def _namespace_allowed(self, namespace: str) -> bool:
        allowed = self.options["allowed_namespaces"]
        return namespace == self.options["namespace"] or "*" in allowed or namespace in allowed

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """Create the attempt's Job, or adopt it if it already exists (409 AlreadyExists)."""
        namespace = spec.config.get("namespace") or self.options["namespace"]
        if not self._namespace_allowed(namespace):
            raise RunnerError(f"namespace {namespace!r} is not open to tasks", retryable=False)
        name = self.job_name(spec)
        batch, _ = self._api()
        try:
            job = self._call("create Job", batch.create_namespaced_job, namespace, self.job_manifest(spec, namespace))
        except KubernetesApiError as exc:
            if exc.status == 409:
                job = self._adopt(spec, namespace, name)
            elif exc.retryable:
                # The create may have reached the server before the error: look before failing.
                try:
                    job = self._adopt(spec, namespace, name)
                except RunnerError:
                    raise exc from None
            else:
                raise
        else:
            logger.info("kubernetes runner %r: created Job %s/%s", self.alias, namespace, name)
        return RunHandle(f"{namespace}/{name}", data={"namespace": namespace, "name": name, "uid": job.metadata.uid})

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """Read the Job's status; transient API trouble reports the run as still running."""
        namespace, name = handle.data["namespace"], handle.data["name"]
        batch, _ = self._api()
        try:
            job = self._call("read Job", batch.read_namespaced_job_status, name, namespace)
        except KubernetesApiError as exc:
            if exc.status == 404:
                return RunResult.failed(f"Job {namespace}/{name} was deleted before it finished")
            if exc.retryable:
                return self.poll_again(logger, "polling %s failed: %s", name, exc)
            raise
        if handle.data.get("uid") and job.metadata.uid != handle.data["uid"]:
            return RunResult.failed(f"Job {namespace}/{name} was replaced by another Job of the same name")
        state, reason, message = _job_state(job)
        if state == "running":
            return RunResult.running()
        pod = self._last_pod(namespace, name)
        log = self._log_tail(namespace, pod)
        output = self._bounded(_summary(job, state, reason) + (f"\n--- last pod log ---\n{log}" if log else ""))
        if state == "succeeded":
            return RunResult.succeeded(output)
        error = f"Job {namespace}/{name} failed: {reason or 'Failed'}" + (f": {message}" if message else "")
        exit_code = _exit_code(pod)
        if exit_code is not None:
            error += f" (last container exit code {exit_code})"
        return RunResult.failed(error, output=output)

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """Delete the Job (and so its pods); a no-op if it is already gone."""
        namespace, name = handle.data["namespace"], handle.data["name"]
        batch, _ = self._api()
        preconditions = k8s.V1Preconditions(uid=handle.data["uid"]) if handle.data.get("uid") else None
        body = k8s.V1DeleteOptions(propagation_policy=self.options["delete_propagation"], preconditions=preconditions)
        try:
            self._call("delete Job", batch.delete_namespaced_job, name, namespace, body=body)
        except KubernetesApiError as exc:
            if exc.status == 404:
                return
            if exc.status == 409:  # the uid precondition failed: not our Job any more
                logger.warning("kubernetes runner %r: not deleting %s/%s: %s", self.alias, namespace, name, exc)
                return
            raise
        logger.info("kubernetes runner %r: deleted Job %s/%s", self.alias, namespace, name)

    def output_so_far(self, spec: RunSpec, handle: RunHandle) -> str | None:
        """The end of the Job's latest pod's log (``log_tail_lines``, bounded), read through the
        official client; None when there is no pod yet or the API cannot be reached."""
        namespace, name = handle.data.get("namespace"), handle.data.get("name")
        if not namespace or not name:
            return None
        try:
            pod = self._last_pod(namespace, name)
        except RunnerError:
            return None
        if pod is None:
            return None
        return self._bounded(self._log_tail(namespace, pod))

    # -- Job manifest -------------------------------------------------------------------------

    def job_name(self, spec: RunSpec) -> str:
        """Deterministic per attempt: ``<name_prefix>tms-<execution>-<attempt>``."""
        name = f"{self.options['name_prefix']}{spec.idempotency_key}"
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            raise RunnerError(f"Job name {name!r} is not a valid DNS-1123 label", retryable=False)
        return name

    def job_manifest(self, spec: RunSpec, namespace: str) -> k8s.V1Job:
        """The Job for one attempt of ``spec``."""
        config = spec.config
        name = self.job_name(spec)
        labels = {
            **config.get("labels", {}),
            "app.kubernetes.io/managed-by": "tms",
            RUN_LABEL: name,
            f"{TMS_PREFIX}execution-id": str(spec.execution_id),
            f"{TMS_PREFIX}attempt": str(spec.attempt),
        }
        if task_label := _label_value(str(spec.task_id)):
            labels[f"{TMS_PREFIX}task-id"] = task_label
        annotations = {KEY_ANNOTATION: spec.idempotency_key, TASK_ANNOTATION: str(spec.task_id)}
        if spec.tracing_id:
            annotations[f"{TMS_PREFIX}tracing-id"] = spec.tracing_id
        if spec.traceparent:
            annotations[f"{TMS_PREFIX}traceparent"] = spec.traceparent
            if spec.tracestate:
                annotations[f"{TMS_PREFIX}tracestate"] = spec.tracestate
        env = {**config.get("env", {}), **spec.environment()}
        resources = config.get("resources") or {}
        container = k8s.V1Container(
            name=_CONTAINER,
            image=config["image"],
            command=list(config["command"]) if config.get("command") else None,
            args=list(config["args"]) if config.get("args") else None,
            env=[k8s.V1EnvVar(name=key, value=value) for key, value in env.items()],
            resources=k8s.V1ResourceRequirements(requests=resources.get("requests"), limits=resources.get("limits"))
            if resources
            else None,
        )
        pod_spec = k8s.V1PodSpec(
            restart_policy="Never",
            containers=[container],
            service_account_name=self.options["service_account_name"],
            automount_service_account_token=bool(self.options["automount_service_account_token"]),
        )
        ttl = config.get("ttl_seconds_after_finished", self.options["ttl_seconds_after_finished"])
        return k8s.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations),
            spec=k8s.V1JobSpec(
                backoff_limit=config.get("backoff_limit", 0),
                active_deadline_seconds=config.get("active_deadline_seconds") or max(1, math.ceil(spec.timeout)),
                ttl_seconds_after_finished=ttl,
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels=labels, annotations=annotations), spec=pod_spec
                ),
            ),
        )

    # -- API access ---------------------------------------------------------------------------

    def _api(self) -> tuple[k8s.BatchV1Api, k8s.CoreV1Api]:
        """API clients for this process (built lazily, and again after a fork)."""
        with self._lock:
            if self._clients is None or self._clients[0] != os.getpid():
                api_client = k8s.ApiClient(self._configuration())
                self._clients = (os.getpid(), k8s.BatchV1Api(api_client), k8s.CoreV1Api(api_client))
            return self._clients[1], self._clients[2]

    def _configuration(self) -> k8s.Configuration:
        configuration = k8s.Configuration()
        kubeconfig, context, host = self.options["kubeconfig"], self.options["context"], self.options["host"]
        try:
            if kubeconfig:
                k8s_config.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False
                )
            elif not host:
                try:
                    k8s_config.load_incluster_config(client_configuration=configuration)
                except _config_errors.ConfigException:
                    k8s_config.load_kube_config(
                        context=context, client_configuration=configuration, persist_config=False
                    )
        except (_config_errors.ConfigException, OSError, ValueError) as exc:
            raise RunnerError(
                f"kubernetes runner {self.alias!r}: cannot load a client configuration: {exc}", retryable=False
            ) from exc
        if host:
            configuration.host = str(host).rstrip("/")
        configuration.verify_ssl = bool(self.options["verify_ssl"])
        return configuration

    def _call(self, action: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        seconds = float(self.options["request_timeout"])
        try:
            return method(*args, _request_timeout=(seconds, seconds), **kwargs)
        except _api_errors.ApiException as exc:
            raise _api_error(action, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubernetesApiError(f"{action}: cannot reach the Kubernetes API: {exc}", status=None) from exc

    def _adopt(self, spec: RunSpec, namespace: str, name: str) -> k8s.V1Job:
        batch, _ = self._api()
        job = self._call("read Job", batch.read_namespaced_job, name, namespace)
        annotations = job.metadata.annotations or {}
        owner_key = annotations.get(KEY_ANNOTATION)
        owner_task = annotations.get(TASK_ANNOTATION, str(spec.task_id))
        if owner_key != spec.idempotency_key or owner_task != str(spec.task_id):
            raise RunnerError(
                f"a Job {namespace}/{name} exists that TMS did not create for this attempt; not adopting it",
                retryable=False,
            )
        logger.info("kubernetes runner %r: adopting the existing Job %s/%s", self.alias, namespace, name)
        return job

    def _last_pod(self, namespace: str, name: str) -> Any | None:
        """The Job's most recent pod (best effort: None when it cannot be listed)."""
        _, core = self._api()
        try:
            pods = self._call("list pods", core.list_namespaced_pod, namespace, label_selector=f"{RUN_LABEL}={name}")
        except RunnerError as exc:
            logger.info("kubernetes runner %r: cannot list the pods of %s: %s", self.alias, name, exc)
            return None
        if not pods.items:
            return None
        return max(pods.items, key=lambda pod: (str(pod.metadata.creation_timestamp or ""), pod.metadata.name))

    def _log_tail(self, namespace: str, pod: Any | None) -> str:
        """Best effort: the end of ``pod``'s log, or "" when it cannot be had."""
        lines = int(self.options["log_tail_lines"])
        if lines <= 0 or pod is None:
            return ""
        _, core = self._api()
        try:
            response = self._call(
                "read pod log",
                core.read_namespaced_pod_log,
                pod.metadata.name,
                namespace,
                container=_CONTAINER,
                tail_lines=lines,
                limit_bytes=int(self.options["max_output_bytes"]),
                _preload_content=False,  # raw text: the client would otherwise try to parse it
            )
        except RunnerError as exc:
            logger.info("kubernetes runner %r: cannot read the log of %s: %s", self.alias, pod.metadata.name, exc)
            return ""
        return response.data.decode("utf-8", errors="replace")

    def _bounded(self, text: str) -> str:
        limit = int(self.options["max_output_bytes"])
        data = text.encode()
        if len(data) <= limit:
            return text
        return f"[... {len(data) - limit} earlier bytes omitted]\n" + data[-limit:].decode(errors="replace")


def _job_state(job: k8s.V1Job) -> tuple[str, str, str]:
    """("running" | "succeeded" | "failed", reason, message) from a Job's status."""
    status = job.status or k8s.V1JobStatus()
    for condition in status.conditions or []:
        if condition.status != "True":
            continue
        if condition.type == "Complete":
            return "succeeded", condition.reason or "Complete", condition.message or ""
        if condition.type == "Failed":
            return "failed", condition.reason or "Failed", condition.message or ""
    completions = (job.spec.completions if job.spec else None) or 1
    if (status.succeeded or 0) >= completions:
        return "succeeded", "Complete", ""
    return "running", "", ""


def _exit_code(pod: Any | None) -> int | None:
    """Exit code of the task container of ``pod``, if it terminated."""
    statuses = (pod.status.container_statuses or []) if pod is not None and pod.status else []
    for status in statuses:
        if status.name == _CONTAINER and status.state and status.state.terminated:
            return status.state.terminated.exit_code
    return None


def _summary(job: k8s.V1Job, state: str, reason: str) -> str:
    status = job.status or k8s.V1JobStatus()
    name = f"{job.metadata.namespace}/{job.metadata.name}"
    parts = [f"Job {name} {state}", f"reason={reason}", f"succeeded={status.succeeded or 0}"]
    parts.append(f"failed={status.failed or 0}")
    if status.start_time:
        parts.append(f"started={status.start_time.isoformat()}")
    if status.completion_time:
        parts.append(f"completed={status.completion_time.isoformat()}")
    return " ".join(parts)
