"""``make run``'s process manager: honcho over ``tms_project/Procfile``, after a check that no
earlier ``make run`` of this checkout is still running.

Two things honcho does not do on its own:

- **A stray earlier platform.** A worker left running by an earlier ``make run`` (killed terminal,
  a hang since fixed: issue 34) would consume beside the new one on the same embedded broker
  files. Every process started here carries :data:`MARK` in its environment; a second start finds
  those still running on the same checkout, database and broker, lists them, says how to stop
  them, and refuses to start.
- **The worker's shutdown grace.** On Ctrl-C honcho sends SIGTERM to every process group and
  SIGKILL ``honcho.manager.KILL_WAIT`` (5) seconds later. A worker given SIGTERM lets its runs end
  for ``TMS_SHUTDOWN_GRACE`` seconds, hands the longer ones back, then stops its pool; killed
  before that, its runs wait for the liveness sweep instead. The wait is set to the grace plus
  :data:`STOP_MARGIN`.

Usage: ``python -m tooling.run_platform [honcho arguments]`` from the checkout's root (the
Makefile's ``run`` target).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: Seconds a stopped worker may take beyond its grace: its pool's stop and its exit.
STOP_MARGIN = 10.0

#: The environment variable that marks every process of a platform started here: its value names
#: the checkout, database and broker it runs on (:func:`platform_key`).
MARK = "TMS_RUN_PLATFORM"


def platform_key(root: Path, env: Mapping[str, str]) -> str:
    """What two platforms must not share: the checkout (its ``var/``) and, where configured, the
    database, the broker and the folder of the embedded default."""
    return "|".join([str(root), *(env.get(name, "") for name in ("DATABASE_URL", "CELERY_BROKER_URL", "TMS_VAR_DIR"))])


def strays(key: str) -> list[tuple[int, str]]:
    """Processes of an earlier platform with this key that are still running (pid, command line),
    leaving out this process and its ancestors. Other users' processes are not looked at."""
    import psutil  # a development package (make run's), not in the image

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in mine:
            continue
        try:
            if proc.environ().get(MARK) == key:
                found.append((proc.pid, " ".join(proc.info["cmdline"] or [])))
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return sorted(found)


def main(argv: list[str]) -> int:
    key = platform_key(Path.cwd().resolve(), os.environ)
    left = strays(key)
    if left:
        lines = "\n".join(f"  {pid}  {cmd}" for pid, cmd in left)
        pids = " ".join(str(pid) for pid, _ in left)
        print(
            f"make run: an earlier platform of this checkout is still running:\n{lines}\n"
            f"A second one would share its database and broker. Stop it first: kill {pids}\n"
            f"(kill -9 {pids} if a process does not end), then run make run again.",
            file=sys.stderr,
        )
        return 1
    from honcho import manager
    from honcho.command import main as honcho_main

    os.environ[MARK] = key  # inherited by every process honcho starts
    grace = float(os.environ.get("TMS_SHUTDOWN_GRACE", "5"))
    manager.KILL_WAIT = grace + STOP_MARGIN
    try:
        honcho_main(argv)
    finally:
        if not os.environ.get("DATABASE_URL"):
            # The embedded default's PostgreSQL (started by the first process's settings) stops
            # with the platform: Ctrl-C leaves nothing running.
            from tms_core.embedded_db import stop

            # The settings' VAR_DIR, from the checkout's root (where make run starts this).
            stop(Path(os.environ.get("TMS_VAR_DIR") or Path.cwd() / "var"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
