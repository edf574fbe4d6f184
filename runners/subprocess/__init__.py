"""The ``subprocess`` runner: runs an allow-listed local command, or the task's uploaded artifact.

No shell is ever involved: the config names an argv list (``command`` + ``args``), and the
executable must be on the operator's ``allowed_executables`` list, which is checked when the task
is saved (a per-field error on ``command``) and again when the attempt starts. Alternatively
``"artifact": true`` runs the task's uploaded binary or script, if the operator enabled
``allow_artifacts``.

A task's ``env`` may not say more than its arguments: a program pinned to argument patterns gets
only the variables the operator's ``allowed_env`` names for it (none by default), and no program
gets a variable that makes an interpreter or a shell run other code (``PYTHON*``, ``PERL5*``,
``NODE_OPTIONS``, ``BASH_ENV``, ...) unless ``allowed_env`` names it; checked at save (a per-field
error on ``env``) and again at launch (:meth:`~runners.subprocess.config.ExecutableAllowList.refused_env`).

Every attempt gets its own folder, ``<work_dir>/<idempotency key>/`` (its files:
:mod:`runners.subprocess.workdir`). Its ``launch`` marker is created with ``O_EXCL``: whoever
creates it launches, every later start with the same key adopts the run.

The command does not run as a child of the worker. ``start`` spawns a small stdlib-only
supervisor (:mod:`runners.supervisor`, run as ``python -I runners/supervisor.py <run folder>``)
that double-forks and calls ``setsid()``, so it is adopted by init and outlives the worker, even a
worker killed with SIGKILL. The supervisor starts the command in a process group of its own, waits
for it, enforces ``spec.timeout`` as a backstop (SIGTERM to the group, SIGKILL after
``kill_grace_seconds``), and writes the ``exit`` file. Any worker process on
the same host can therefore poll or cancel the run from the folder alone. Liveness checks compare
the process start time from ``/proc`` with the one recorded at launch, so a recycled pid is never
mistaken for the run.

Isolation: in the ``bwrap`` and ``user`` modes the command runs as a run user of its own, in a
network namespace of its own (no network but its loopback unless the ``egress`` option opens
some), within resource limits and a measured disk limit on its work folder; see
:mod:`runners.sandbox`. Mode ``none`` runs it as the worker's user: not a sandbox. Runs are local
to one host: a poll from another host fails the attempt
(retryably), so route subprocess tasks to workers of one host, or to a queue per host. Run folders
are kept after the run (for the output and for adoption); a retention job should prune old ones.

The package, bottom up:

- :mod:`~runners.subprocess.config`: a task's config (:class:`SubprocessConfigSerializer`), the
  operator's allow-list of executables and the limits a run gets;
- :mod:`~runners.subprocess.workdir`: run folders (their files, the processes they record) and pruning;
- :mod:`~runners.subprocess.artifacts`: the checked copy of an uploaded artifact;
- :mod:`~runners.subprocess.launch`: the plan the supervisor follows, and starting it;
- :mod:`~runners.subprocess.outcome`: the exit record read into a result;
- :mod:`~runners.subprocess.runner`: :class:`SubprocessRunner`, which puts them together.

``runners.subprocess.SubprocessRunner`` is the ``BACKEND`` path of the settings.
"""

from runners.subprocess.config import SubprocessConfigSerializer
from runners.subprocess.runner import SubprocessRunner

__all__ = ["SubprocessConfigSerializer", "SubprocessRunner"]
