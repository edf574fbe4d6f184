"""An emulation of the Kubernetes API server's batch/v1 Jobs API (and the pods of those Jobs).

Implements what the official ``kubernetes`` client calls for Jobs::

    POST   /apis/batch/v1/namespaces/{ns}/jobs                  create (201, or 409 AlreadyExists)
    GET    /apis/batch/v1/namespaces/{ns}/jobs/{name}[/status]  read (200, or 404 NotFound)
    DELETE /apis/batch/v1/namespaces/{ns}/jobs/{name}           delete (propagationPolicy, uid precondition)
    GET    /api/v1/namespaces/{ns}/pods?labelSelector=a=b,c=d   list a Job's pods
    GET    /api/v1/namespaces/{ns}/pods/{pod}/log?tailLines=N   a pod's log (text/plain)

Errors are ``Status`` objects shaped like the real API server's. Jobs "run" on the emulator's
clock, computed on every read (no threads): the container's command and args are read as a tiny
shell-like script, statements split on ``;``, ``&&`` or new lines, ``sh -c SCRIPT`` unwrapped:

- ``sleep N``  the pod runs N seconds (summed over statements),
- ``echo ...`` a log line,
- ``exit N``   the exit code (``false`` is ``exit 1``).

A failing pod is replaced until ``backoffLimit`` failures are exceeded (``BackoffLimitExceeded``),
and ``activeDeadlineSeconds`` ends a Job with ``DeadlineExceeded``, as the Job controller does.
``creations`` counts the Jobs really created per (namespace, name): the launch count tests assert.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.emulators.base import EmulatorServer, Request, Response

_JOBS = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<pod>[^/]+)/log)?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``Status`` failure exactly as the API server sends it."""
    document: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        document["details"] = details
    return document


def _failure(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> Response:
    return Response.json(code, status_object(code, reason, message, details))


@dataclass
class Behaviour:
    """What the Job's container does, read from its command and args."""

    duration: float = 0.0
    exit_code: int = 0
    log: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, argv: list[str]) -> Behaviour:
        behaviour = cls()
        if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in {"sh", "bash", "ash"} and argv[1] == "-c":
            script = argv[2]
        else:
            script = shlex.join(argv)
        for statement in re.split(r";|&&|\n", script):
            words = shlex.split(statement)
            if not words:
                continue
            if words[0] == "sleep" and len(words) > 1:
                behaviour.duration += float(words[1])
            elif words[0] == "echo":
                behaviour.log.append(" ".join(words[1:]))
            elif words[0] == "exit":
                behaviour.exit_code = int(words[1]) if len(words) > 1 else 0
                break
            elif words[0] == "false":
                behaviour.exit_code = 1
                break
        return behaviour


@dataclass
class _Pod:
    name: str
    started: float
    finished: float | None
    exit_code: int | None


@dataclass
class EmulatedJob:
    manifest: dict[str, Any]
    created: float  # emulator clock (monotonic)
    created_wall: datetime
    behaviour: Behaviour

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def uid(self) -> str:
        return self.manifest["metadata"]["uid"]

    def pods(self, now: float) -> tuple[list[_Pod], str | None, str | None, float | None]:
        """The pods started so far, and the Job's end: (pods, condition, reason, ended_at)."""
        spec = self.manifest["spec"]
        attempts = int(spec.get("backoffLimit", 6)) + 1
        deadline = spec.get("activeDeadlineSeconds")
        ends_at = self.created + float(deadline) if deadline else None
        step = self.behaviour.duration
        pods: list[_Pod] = []
        for index in range(attempts):
            started = self.created + index * step  # a failed pod is replaced at once
            if ends_at is not None and started >= ends_at:
                break
            finished = started + step
            if ends_at is not None and finished > ends_at:  # this pod is killed at the deadline
                if now >= ends_at:
                    pods.append(_Pod(self._pod_name(index), started, ends_at, None))
                    return pods, "Failed", "DeadlineExceeded", ends_at
                pods.append(_Pod(self._pod_name(index), started, None, None))
                return pods, None, None, None
            if finished > now:
                pods.append(_Pod(self._pod_name(index), started, None, None))
                return pods, None, None, None
            pods.append(_Pod(self._pod_name(index), started, finished, self.behaviour.exit_code))
            if self.behaviour.exit_code == 0:
                return pods, "Complete", None, finished
        if len(pods) == attempts:
            return pods, "Failed", "BackoffLimitExceeded", pods[-1].finished
        if ends_at is not None and now >= ends_at:
            return pods, "Failed", "DeadlineExceeded", ends_at
        return pods, None, None, None

    def _pod_name(self, index: int) -> str:
        suffix = hashlib.sha256(f"{self.uid}/{index}".encode()).hexdigest()[:5]
        return f"{self.name}-{suffix}"

    def wall(self, moment: float) -> datetime:
        return self.created_wall + timedelta(seconds=moment - self.created)

    def document(self, now: float) -> dict[str, Any]:
        pods, condition, reason, ended = self.pods(now)
        status: dict[str, Any] = {"uncountedTerminatedPods": {}}
        if pods:
            status["startTime"] = _timestamp(self.wall(self.created))
        active = sum(1 for pod in pods if pod.finished is None)
        succeeded = sum(1 for pod in pods if pod.exit_code == 0)
        failed = sum(1 for pod in pods if pod.finished is not None and pod.exit_code != 0)
        status.update({"active": active, "ready": active, "terminating": 0})
        if succeeded:
            status["succeeded"] = succeeded
        if failed:
            status["failed"] = failed
        if condition is not None and ended is not None:
            at = _timestamp(self.wall(ended))
            if condition == "Complete":
                status["completionTime"] = at
                status["conditions"] = [
                    _condition(
                        "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods", at
                    ),
                    _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods", at),
                ]
            else:
                message = (
                    "Job was active longer than specified deadline"
                    if reason == "DeadlineExceeded"
                    else "Job has reached the specified backoff limit"
                )
                status["conditions"] = [
                    _condition("FailureTarget", reason or "", message, at),
                    _condition("Failed", reason or "", message, at),
                ]
        return {**self.manifest, "status": status}

    def pod_documents(self, now: float) -> list[dict[str, Any]]:
        pods, _, _, _ = self.pods(now)
        template = self.manifest["spec"]["template"]
        documents = []
        for pod in pods:
            if pod.finished is None:
                phase, state = "Running", {"running": {"startedAt": _timestamp(self.wall(pod.started))}}
            else:
                code = 137 if pod.exit_code is None else pod.exit_code
                phase = "Succeeded" if code == 0 else "Failed"
                state = {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": _timestamp(self.wall(pod.started)),
                        "finishedAt": _timestamp(self.wall(pod.finished)),
                    }
                }
            container = template["spec"]["containers"][0]
            documents.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod.name,
                        "namespace": self.manifest["metadata"]["namespace"],
                        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, pod.name)),
                        "creationTimestamp": _timestamp(self.wall(pod.started)),
                        "labels": dict(template["metadata"]["labels"]),
                        "ownerReferences": [
                            {
                                "apiVersion": "batch/v1",
                                "kind": "Job",
                                "name": self.name,
                                "uid": self.uid,
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": template["spec"],
                    "status": {
                        "phase": phase,
                        "startTime": _timestamp(self.wall(pod.started)),
                        "containerStatuses": [
                            {
                                "name": container["name"],
                                "image": container["image"],
                                "imageID": "",
                                "ready": pod.finished is None,
                                "restartCount": 0,
                                "started": pod.finished is None,
                                "state": state,
                            }
                        ],
                    },
                }
            )
        return documents


def _condition(kind: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "lastProbeTime": at,
        "lastTransitionTime": at,
        "reason": reason,
        "message": message,
    }


@dataclass
class Deletion:
    namespace: str
    name: str
    propagation_policy: str | None
    uid: str


class KubernetesEmulator(EmulatorServer):
    """The Jobs API on 127.0.0.1; see the module docstring for how Jobs behave."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[tuple[str, str], EmulatedJob] = {}
        #: Jobs really created, per (namespace, name): the number of launches.
        self.creations: Counter[tuple[str, str]] = Counter()
        self.deletions: list[Deletion] = []
        self._faults: deque[tuple[str, str, int, str]] = deque()
        self._resource_version = 1000

    # -- test helpers -------------------------------------------------------------------------

    def fail_next(self, method: str, status: int, *, path_contains: str = "", reason: str = "InternalError") -> None:
        """Answer the next matching request with a Status failure instead of serving it."""
        with self.lock:
            self._faults.append((method.upper(), path_contains, status, reason))

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job as a GET would return it now, or None."""
        with self.lock:
            job = self.jobs.get((namespace, name))
            return None if job is None else job.document(time.monotonic())

    def delete_everything(self, namespace: str, name: str) -> None:
        """Remove a Job behind TMS's back (as an operator or the TTL controller would)."""
        with self.lock:
            self.jobs.pop((namespace, name), None)

    # -- HTTP ---------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        with self.lock:
            for index, (method, fragment, status, reason) in enumerate(self._faults):
                if method == request.method and fragment in request.path:
                    del self._faults[index]
                    return _failure(status, reason, f"injected failure ({status})")
            now = time.monotonic()
            if match := _JOBS.match(request.path):
                namespace, name = match["ns"], match["name"]
                if name is None and request.method == "POST":
                    return self._create(namespace, request, now)
                if name is not None and request.method == "GET":
                    job = self.jobs.get((namespace, name))
                    if job is None:
                        return _not_found(name)
                    return Response.json(200, job.document(now))
                if name is not None and match["status"] is None and request.method == "DELETE":
                    return self._delete(namespace, name, request, now)
                return _failure(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            if match := _PODS.match(request.path):
                namespace, pod = match["ns"], match["pod"]
                if request.method == "GET" and pod is None:
                    return self._list_pods(namespace, request.param("labelSelector") or "", now)
                if request.method == "GET":
                    return self._log(namespace, pod, request, now)
            return _failure(404, "NotFound", "the server could not find the requested resource")

    def _create(self, namespace: str, request: Request, now: float) -> Response:
        manifest = request.json() or {}
        metadata = manifest.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            return _invalid(
                "", "metadata.name", "FieldValueRequired", "Required value: name or generateName is required"
            )
        if len(name) > 63 or not _DNS1123_SUBDOMAIN.match(name):
            return _invalid(
                name, "metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain'
            )
        if metadata.get("namespace", namespace) != namespace:
            return _failure(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        spec = manifest.get("spec") or {}
        pod_spec = (spec.get("template") or {}).get("spec") or {}
        containers = pod_spec.get("containers") or []
        if not containers:
            return _invalid(name, "spec.template.spec.containers", "FieldValueRequired", "Required value")
        if not containers[0].get("image"):
            return _invalid(name, "spec.template.spec.containers[0].image", "FieldValueRequired", "Required value")
        if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
            return _invalid(
                name,
                "spec.template.spec.restartPolicy",
                "FieldValueNotSupported",
                'Unsupported value: "Always": supported values: "OnFailure", "Never"',
            )
        if (namespace, name) in self.jobs:
            return _failure(
                409,
                "AlreadyExists",
                f'jobs.batch "{name}" already exists',
                {"name": name, "group": "batch", "kind": "jobs"},
            )
        uid = str(uuid.uuid4())
        self._resource_version += 1
        wall = datetime.now(UTC)
        controller_labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        metadata.update(
            {
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": str(self._resource_version),
                "generation": 1,
                "creationTimestamp": _timestamp(wall),
            }
        )
        metadata.setdefault("labels", {})
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        template_meta = spec["template"].setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **controller_labels}
        container = containers[0]
        behaviour = Behaviour.of([*(container.get("command") or []), *(container.get("args") or [])])
        job = EmulatedJob(manifest=manifest, created=now, created_wall=wall, behaviour=behaviour)
        self.jobs[(namespace, name)] = job
        self.creations[(namespace, name)] += 1
        return Response.json(201, job.document(now))

    def _delete(self, namespace: str, name: str, request: Request, now: float) -> Response:
        job = self.jobs.get((namespace, name))
        if job is None:
            return _not_found(name)
        options = request.json() or {}
        policy = request.param("propagationPolicy") or options.get("propagationPolicy")
        expected_uid = (options.get("preconditions") or {}).get("uid")
        if expected_uid and expected_uid != job.uid:
            return _failure(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on jobs.batch "{name}": Precondition failed: UID in precondition: '
                f"{expected_uid}, UID in object meta: {job.uid}",
                {"name": name, "group": "batch", "kind": "jobs"},
            )
        document = job.document(now)
        del self.jobs[(namespace, name)]
        self.deletions.append(Deletion(namespace, name, policy, job.uid))
        if policy == "Foreground":
            # The real server answers with the object, now marked for deletion behind a finaliser.
            document["metadata"]["deletionTimestamp"] = _timestamp(datetime.now(UTC))
            document["metadata"]["deletionGracePeriodSeconds"] = 0
            document["metadata"]["finalizers"] = ["foregroundDeletion"]
            return Response.json(200, document)
        return Response.json(
            200,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": "batch", "kind": "jobs", "uid": job.uid},
            },
        )

    def _list_pods(self, namespace: str, selector: str, now: float) -> Response:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = []
        for (job_namespace, _), job in self.jobs.items():
            if job_namespace != namespace:
                continue
            for pod in job.pod_documents(now):
                labels = pod["metadata"]["labels"]
                if all(labels.get(key) == value for key, value in wanted.items()):
                    items.append(pod)
        return Response.json(
            200,
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            },
        )

    def _log(self, namespace: str, pod_name: str, request: Request, now: float) -> Response:
        for (job_namespace, _), job in self.jobs.items():
            if job_namespace != namespace:
                continue
            if any(pod["metadata"]["name"] == pod_name for pod in job.pod_documents(now)):
                lines = list(job.behaviour.log)
                tail = request.param("tailLines")
                if tail is not None:
                    lines = lines[-int(tail) :] if int(tail) else []
                text = "".join(f"{line}\n" for line in lines)
                limit = request.param("limitBytes")
                if limit is not None:
                    text = text.encode()[: int(limit)].decode(errors="ignore")
                return Response.text(200, text)
        return _failure(404, "NotFound", f'pods "{pod_name}" not found', {"name": pod_name, "kind": "pods"})


def _not_found(name: str) -> Response:
    return _failure(404, "NotFound", f'jobs.batch "{name}" not found', {"name": name, "group": "batch", "kind": "jobs"})


def _invalid(name: str, field_path: str, cause: str, message: str) -> Response:
    return _failure(
        422,
        "Invalid",
        f'Job.batch "{name}" is invalid: {field_path}: {message}',
        {
            "name": name,
            "group": "batch",
            "kind": "Job",
            "causes": [{"reason": cause, "message": message, "field": field_path}],
        },
    )
