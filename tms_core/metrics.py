"""Process-local Prometheus metrics (monitor and materialiser passes), shared across processes
through prometheus_client's multiprocess mode.

Everything the database knows (executions by outcome, backlog, workers, ...) is read at scrape
time by the web's collector (``ops.metrics``), so it is the same whichever web process answers.
What only a process knows (how long its last monitor pass took, whether a publish failed) is
kept here. The monitor is its own process and the materialiser runs in a Celery prefork child,
so neither can be scraped by the web process directly: with ``PROMETHEUS_MULTIPROC_DIR`` set,
each process writes its values to memory-mapped files in that folder and the web's ``/metrics``
adds up every file (counters and histograms are summed, so values of exited processes are kept).
Without it (a test of one process, a shell) the values stay in the process's own memory.

The folder must be shared by every process of one machine that should be seen (web, worker,
beat, monitor) and emptied when the stack starts, never while it runs (``clean_multiproc_dir``:
``make run`` and the docker ``migrate`` role do it). Why files and not the database: a pass
takes milliseconds and runs up to several times a second, so recording each one in PostgreSQL
would add a write per pass to the hot loop; an mmap write costs nothing. The price is that one
web sees the processes of its own machine only: with monitors on several machines, scrape a web
(or add a web role) on each, or read the database-derived metrics, which are global.

File names carry ``<pid>-<hostname>`` instead of the bare pid, because containers sharing the
folder each number their processes from 1.

The metrics live in a registry of TMS's own (:data:`REGISTRY`), not prometheus_client's global
one: Flower loads the same Celery app (and so this module) and serves the global registry at its
own ``/metrics``, where TMS's series would sit frozen at 0 under Flower's job (a "monitor stalled"
alert would match them). Flower runs without the multiprocess folder (``tms_project/Procfile``,
``docker/entrypoint.sh``), and the web's ``/metrics`` reads only ``tms_*`` families from the folder
(:func:`ops.metrics.render_metrics`), so Flower's ``flower_*`` series stay at Flower's endpoint.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, values

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Every family this module defines starts with it: the web's /metrics keeps only these from the
#: multiprocess folder.
PREFIX = "tms_"
#: TMS's process-local metrics (not prometheus_client's global registry: see the module docstring).
REGISTRY = CollectorRegistry(auto_describe=True)


def multiproc_dir() -> str | None:
    """The shared folder of multiprocess mode, or None when the mode is off."""
    return os.environ.get(MULTIPROC_ENV) or None


def process_identifier() -> str:
    """This process's name in the folder: ``<pid>-<hostname>``. No underscore, which the
    library uses to split file names."""
    return f"{os.getpid()}-{socket.gethostname().replace('_', '-')}"


if multiproc_dir():
    # Must be set before the first metric is created (the library picks its value class then).
    os.makedirs(multiproc_dir(), exist_ok=True)  # type: ignore[arg-type]
    values.ValueClass = values.MultiProcessValue(process_identifier)


def clean_multiproc_dir() -> int:
    """Empty the multiprocess folder (at stack start, before any process writes). Returns the
    number of files removed; 0 when the mode is off."""
    folder = multiproc_dir()
    if not folder or not Path(folder).is_dir():
        return 0
    removed = 0
    for entry in Path(folder).iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed


def mark_process_dead(pid: int, hostname: str | None = None) -> None:
    """Drop the live-gauge files of an exited child (gunicorn's ``child_exit``, Celery's
    ``worker_process_shutdown``). Counters and histograms stay: their totals must not go back."""
    folder = multiproc_dir()
    if not folder:
        return
    from prometheus_client import multiprocess

    host = (hostname or socket.gethostname()).replace("_", "-")
    multiprocess.mark_process_dead(f"{pid}-{host}", folder)


#: Pass durations: a monitor pass is milliseconds when idle, seconds with a backlog; a
#: materialiser pass similar, up to minutes on a cold start over many tasks.
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

MONITOR_PASS_SECONDS = Histogram(
    "tms_monitor_pass_duration_seconds",
    "Duration of one monitor pass (take due executions, publish, housekeeping), failed passes included.",
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
MONITOR_PUBLISHED = Counter(
    "tms_monitor_messages_published",
    "Messages the monitor published, by kind: run (due), republish (lost PENDING) or poll.",
    ["kind"],
    registry=REGISTRY,
)
MONITOR_PUBLISH_ERRORS = Counter(
    "tms_monitor_publish_errors",
    "Publishes that failed on a broker error (the rows not published went back to SCHEDULED).",
    registry=REGISTRY,
)
MONITOR_PASS_ERRORS = Counter(
    "tms_monitor_pass_errors",
    "Monitor passes that failed on a database or broker error (retried with backoff).",
    registry=REGISTRY,
)
MATERIALISER_PASS_SECONDS = Histogram(
    "tms_materialiser_pass_duration_seconds",
    "Duration of one materialiser pass over the tasks due within the horizon.",
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
MATERIALISED = Counter(
    "tms_materialiser_executions_created",
    "Executions created by materialiser passes.",
    registry=REGISTRY,
)
WORKFLOW_STEPS_CREATED = Counter(
    "tms_workflow_steps_created",
    "Runs of workflow steps created by an upstream's end (counted when the end commits), by the"
    " `on` of the link the end met: success, failure or completion.",
    ["on"],
    registry=REGISTRY,
)
for _on in ("success", "failure", "completion"):  # tasks_app.models.DependencyOn's (above: not imported)
    WORKFLOW_STEPS_CREATED.labels(_on)

for _kind in ("run", "republish", "poll"):
    # Present from the start (at 0), so a rate over it exists before the first publish.
    MONITOR_PUBLISHED.labels(_kind)

NOTIFICATIONS_DELIVERED = Counter(
    "tms_notifications_delivered",
    "Notification deliveries that reached their channel, by channel kind (webhook, slack, email).",
    ["kind"],
    registry=REGISTRY,
)
NOTIFICATIONS_FAILED = Counter(
    "tms_notifications_failed",
    "Notification send attempts that failed, by channel kind and outcome: retry (sent again later) or final.",
    ["kind", "outcome"],
    registry=REGISTRY,
)
for _kind in ("webhook", "slack", "email"):
    NOTIFICATIONS_DELIVERED.labels(_kind)
