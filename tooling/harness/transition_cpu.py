"""PostgreSQL CPU per run of the transitions a run goes through, and the rows each run writes.

What the herd's PostgreSQL figure (tooling/harness/herd.py) sums over every backend and every
second of a run, this measures for the statements alone, in one connection, so that a change to
a transition or to the status trigger shows without the monitor's polls, beat, the workers'
pace or the machine's load in it::

    DATABASE_URL=postgres://... python -m tooling.harness.transition_cpu --batch 20 --rounds 150

For ``--rounds`` rounds it creates ``--batch`` executions due now (of tasks inserted up front),
takes them (the monitor's write), claims them in one statement and ends them in one (a worker's
chunk: executions_claim_loaded, executions_succeed), reading this connection's backend CPU from
``/proc`` between the steps (clock ticks: use a few thousand runs). Then the rows written per
run, per table (``pg_stat_user_tables``). The bench database's own tasks and executions are left
in place, under a user of their own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")
STEPS = ("create", "take", "claim", "succeed")


def _cpu(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS  # utime, stime


def _rows(cursor: Any) -> dict[str, tuple[int, int, int]]:
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables")
    return {name: (ins, upd, hot) for name, ins, upd, hot in cursor.fetchall()}


def measure(*, batch: int, rounds: int) -> dict[str, Any]:
    """Backend CPU per run by step (ms), and rows inserted/updated (HOT among them) per run by table."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from executions import transitions
    from tasks_app.models import Task
    from tms_core.clock import db_now
    from tooling.harness.fill import insert_tasks

    user = get_user_model().objects.create_user(f"transition-cpu-{time.time_ns()}")
    runs = batch * rounds
    with connection.cursor() as cursor:
        insert_tasks(cursor=cursor, owner_id=user.pk, count=runs, columns={"start_at": "now() + interval '10 days'"})
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
        before = _rows(cursor)
    tasks = list(Task.objects.filter(owner=user).values_list("pk", flat=True))
    spent = dict.fromkeys(STEPS, 0.0)
    for start in range(0, runs, batch):
        due = db_now() - timedelta(seconds=1)
        marks = [_cpu(pid)]
        rows = [transitions.NewExecution(task, due, 5) for task in tasks[start : start + batch]]
        ids = transitions.executions_create(rows=rows, actor="transition-cpu")
        marks.append(_cpu(pid))
        transitions.executions_take_due(limit=batch, actor="transition-cpu")
        marks.append(_cpu(pid))
        items = [(pk, 1) for pk in ids]
        claimed = transitions.executions_claim_loaded(items=items, worker_id="transition-cpu", lease_seconds=60)
        marks.append(_cpu(pid))
        successes = [transitions.Success(pk, 1, "") for pk in claimed]
        won = transitions.executions_succeed(successes=successes, worker_id="transition-cpu", max_chars=100)
        marks.append(_cpu(pid))
        if len(won) != len(ids):
            raise RuntimeError(f"{len(ids)} created, {len(claimed)} claimed, {len(won)} succeeded")
        for step, (earlier, later) in zip(STEPS, itertools.pairwise(marks), strict=True):
            spent[step] += later - earlier
    time.sleep(1.5)  # a backend's table statistics are flushed at most once a second
    with connection.cursor() as cursor:
        after = _rows(cursor)
    written = {}
    for table, counts in sorted(after.items()):
        ins, upd, hot = (
            round((now - then) / runs, 2) for now, then in zip(counts, before.get(table, (0, 0, 0)), strict=True)
        )
        if ins or upd:
            written[table] = {"inserted": ins, "updated": upd, "hot": hot}
    written.pop(Task._meta.db_table, None)  # this harness's own set-up
    per_step = {step: round(seconds * 1000 / runs, 3) for step, seconds in spent.items()}
    return {
        "runs": runs,
        "batch": batch,
        "backend_cpu_ms_per_run": round(sum(per_step.values()), 3),
        "by_step": per_step,
        "rows_per_run": written,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20, help="runs per claim and per success statement")
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.base")
    import django

    django.setup()
    print(json.dumps(measure(batch=args.batch, rounds=args.rounds), indent=2))


if __name__ == "__main__":
    main()
