"""Retention: pruning by the tasks' rules, the archive it writes, tms_prune, and the archive API."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.files.storage import storages
from django.core.management import CommandError, call_command
from django.db.models import Sum
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from executions import retention
from executions.models import (
    ArchiveIndex,
    Execution,
    ExecutionEvent,
    RunRollup,
    SkippedOccurrence,
    SkipReason,
    TaskRollup,
)
from executions.models import ExecutionStatus as S
from executions.periodic import register_periodic_tasks
from executions.retention import retention_prune
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

FINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED}


@pytest.fixture(autouse=True)
def archive_dir(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "tms_archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "archive")},
        },
    }
    settings.TMS = {**settings.TMS, "RETENTION_KEEP_LAST": 1000, "RETENTION_KEEP_FOR": 30 * 86400.0}
    return tmp_path / "archive"


def _run(task, ended_hours_ago: float, status=S.SUCCEEDED, *, now=None) -> Execution:
    """A run of ``task`` that ended ``ended_hours_ago`` hours ago (status set by an UPDATE, as the
    rollup trigger sees real finishes), with a second event."""
    now = now or timezone.now()
    ended = now - timedelta(hours=ended_hours_ago)
    execution = ExecutionFactory(
        task=task,
        scheduled_for=ended - timedelta(seconds=30),
        status=status,
        started_at=ended - timedelta(seconds=20) if status in FINAL | {S.RUNNING} else None,
        finished_at=ended if status in FINAL else None,
    )
    ExecutionEvent.objects.create(execution=execution, from_status="RUNNING", to_status=status, attempt=1, actor="t")
    return execution


def _expected_kept(task, runs: list[Execution], now, *, keep_last: int, keep_for: timedelta) -> set[int]:
    """The rules, written out independently of the SQL: rank among finished runs, newest first."""
    finished = sorted((r for r in runs if r.status in FINAL), key=lambda r: (r.scheduled_for, r.pk), reverse=True)
    kept = {r.pk for r in runs if r.status not in FINAL}
    for rank, run in enumerate(finished, start=1):
        by_count, by_age = rank <= keep_last, run.finished_at >= now - keep_for
        if rank == 1:
            kept.add(run.pk)
        elif run.status == S.FAILED and task.keep_failed_longer:
            if by_count or by_age:
                kept.add(run.pk)
        elif by_count and by_age:
            kept.add(run.pk)
    return kept


def _archived_lines() -> list[dict]:
    storage = storages["tms_archive"]
    lines = []
    for entry in ArchiveIndex.objects.order_by().values_list("file_name", flat=True).distinct():
        with storage.open(entry, "rb") as raw:
            lines += [json.loads(line) for line in gzip.decompress(raw.read()).splitlines()]
    return lines


def _ids_sha(ids) -> str:
    return hashlib.sha256("".join(f"{i}\n" for i in sorted(ids)).encode()).hexdigest()


@pytest.fixture
def history(user, other_user):
    """Five tasks with their own rules and a history of 12 runs each (plus unfinished ones)."""
    now = timezone.now()
    tasks = {
        "count": TaskFactory(owner=user, keep_last=3),
        "age": TaskFactory(owner=user, keep_for=timedelta(hours=5)),
        "failed": TaskFactory(owner=user, keep_last=2, keep_for=timedelta(hours=6), keep_failed_longer=True),
        "all_old": TaskFactory(owner=other_user, keep_for=timedelta(hours=1)),
        "default": TaskFactory(owner=other_user),
    }
    runs: dict[str, list[Execution]] = {name: [] for name in tasks}
    for name, task in tasks.items():
        for k in range(12):
            status = [S.SUCCEEDED, S.FAILED, S.CANCELLED][k % 3]
            # Half past the hour: no run ends on a rule's boundary whichever clock reads "now".
            hours = 24 * 40 + k if name == "all_old" else 0.5 + k
            runs[name].append(_run(task, hours, status, now=now))
        # Never pruned: unfinished runs, however old.
        runs[name].append(_run(task, 24 * 60, S.RUNNING, now=now))
        runs[name].append(_run(task, 24 * 61, S.PENDING, now=now))
    # A skipped occurrence tied to a run that goes (the overlap policy cancelled it).
    doomed = runs["count"][11]
    SkippedOccurrence.objects.create(
        task=tasks["count"], scheduled_for=doomed.scheduled_for, reason=SkipReason.OVERLAP, execution=doomed
    )
    return tasks, runs, now


def test_a_prune_leaves_exactly_what_the_rules_keep_and_archives_exactly_what_went(history):
    tasks, runs, now = history
    expected: set[int] = set()
    for name, task in tasks.items():
        keep_last = task.keep_last or 1000
        keep_for = task.keep_for or timedelta(days=30)
        expected |= _expected_kept(task, runs[name], now, keep_last=keep_last, keep_for=keep_for)
    everything = {r.pk for rs in runs.values() for r in rs}
    gone = everything - expected
    assert len(gone) > 20  # the fixture prunes something under every rule
    rollup_before = RunRollup.objects.aggregate(s=Sum("succeeded"), f=Sum("failed"), c=Sum("cancelled"))
    task_rollup_before = TaskRollup.objects.aggregate(a=Sum("attempts"), f=Sum("failures"))
    events_gone = ExecutionEvent.objects.filter(execution_id__in=gone).count()

    report = retention_prune(batch=7, now=now)

    assert set(Execution.objects.values_list("pk", flat=True)) == expected
    assert report.executions == len(gone) and report.events == events_gone and report.skipped == 1
    assert not ExecutionEvent.objects.filter(execution_id__in=gone).exists()
    assert not SkippedOccurrence.objects.exists()
    # Per rule: the latest 3; the last 5 hours; failed runs by whichever keeps more; only the latest.
    assert Execution.objects.filter(task=tasks["count"], status__in=FINAL).count() == 3
    assert Execution.objects.filter(task=tasks["all_old"], status__in=FINAL).count() == 1
    assert Execution.objects.filter(task=tasks["default"]).count() == 14  # nothing due under the defaults
    assert Execution.objects.filter(status__in=[S.RUNNING, S.PENDING]).count() == 10

    # The archive holds exactly what went: every row once, with its events and skipped rows.
    lines = _archived_lines()
    assert sorted(line["id"] for line in lines) == sorted(gone)
    assert sum(len(line["events"]) for line in lines) == events_gone
    assert [s["reason"] for line in lines for s in line["skipped_occurrences"]] == ["overlap"]
    entries = list(ArchiveIndex.objects.all())
    assert sum(e.executions for e in entries) == len(gone) and sum(e.events for e in entries) == events_gone
    for entry in entries:
        with storages["tms_archive"].open(entry.file_name, "rb") as raw:
            payload = raw.read()
        assert entry.file_sha256 == hashlib.sha256(payload).hexdigest()
        in_file = [json.loads(line) for line in gzip.decompress(payload).splitlines()]
        ids = [line["id"] for line in in_file if line["task_id"] == str(entry.task_id)]
        assert entry.executions == len(ids) and entry.ids_sha256 == _ids_sha(ids)
    # The dashboard's counts do not move: the rollup trigger counts finishes, not deletes.
    assert RunRollup.objects.aggregate(s=Sum("succeeded"), f=Sum("failed"), c=Sum("cancelled")) == rollup_before
    assert TaskRollup.objects.aggregate(a=Sum("attempts"), f=Sum("failures")) == task_rollup_before

    # A second run finds nothing more to do.
    again = retention_prune(now=now)
    assert again.executions == 0 and again.files == 0


def test_a_dry_run_changes_nothing_and_counts_what_a_real_run_removes(history, archive_dir):
    tasks, _, now = history
    rows_before = set(Execution.objects.values_list("pk", "status"))
    events_before = ExecutionEvent.objects.count()
    out = StringIO()
    call_command("tms_prune", "--dry-run", stdout=out)
    dry = retention_prune(dry_run=True, now=now)
    assert set(Execution.objects.values_list("pk", "status")) == rows_before
    assert ExecutionEvent.objects.count() == events_before and not ArchiveIndex.objects.exists()
    assert not archive_dir.exists() or not any(archive_dir.rglob("*.gz"))
    assert f"would prune {dry.executions} executions of {len(dry.per_task)} tasks" in out.getvalue()
    assert f"task {tasks['count'].pk} ({tasks['count'].name}): would prune 9 executions" in out.getvalue()

    real = retention_prune(now=now)
    assert real.per_task == dry.per_task and real.executions == dry.executions


def test_before_and_task_narrow_the_run(history):
    tasks, runs, now = history
    out = StringIO()
    call_command("tms_prune", "--task", str(tasks["count"].pk), "--batch", "2", stdout=out)
    assert set(Execution.objects.filter(task=tasks["count"], status__in=FINAL).values_list("pk", flat=True)) == {
        r.pk for r in runs["count"][:3]
    }
    assert Execution.objects.filter(task=tasks["age"]).count() == 14  # untouched
    assert "pruned 9 executions of 1 tasks (18 events, 1 skipped occurrences) into 5 archive files" in out.getvalue()
    # --before: only what ended before it. The age task keeps 5 hours: its runs that ended 5.5 to
    # 11.5 hours ago may go, those before 6.75 hours ago (7.5 to 11.5) do.
    report = retention_prune(before=now - timedelta(hours=6.75), task_id=tasks["age"].pk, now=now)
    assert report.executions == 5
    assert Execution.objects.filter(task=tasks["age"], status__in=FINAL).count() == 7


def test_a_crash_between_the_file_and_the_commit_leaves_the_rows_and_the_next_run_cleans_up(
    history, archive_dir, monkeypatch
):
    tasks, _, now = history
    before = set(Execution.objects.values_list("pk", flat=True))

    def crash(*args, **kwargs):
        raise RuntimeError("killed between the file and the commit")

    monkeypatch.setattr(ArchiveIndex.objects, "bulk_create", crash)
    with pytest.raises(RuntimeError):
        retention_prune(task_id=tasks["count"].pk, now=now)
    monkeypatch.undo()
    # The file was written, the delete rolled back: every row is still there, no index names the file.
    assert set(Execution.objects.values_list("pk", flat=True)) == before
    assert len(list(archive_dir.rglob("*.jsonl.gz"))) == 1 and not ArchiveIndex.objects.exists()

    # A batch of other rows first (a different name), so the orphan must be found and removed.
    report = retention_prune(task_id=tasks["age"].pk, now=now)
    assert report.orphans_removed == 1
    report = retention_prune(now=now)
    files = {str(p.relative_to(archive_dir)) for p in archive_dir.rglob("*.jsonl.gz")}
    assert files == set(ArchiveIndex.objects.values_list("file_name", flat=True))
    assert Execution.objects.filter(task=tasks["count"], status__in=FINAL).count() == 3


def test_a_second_pruner_does_nothing_while_one_runs(history):
    import psycopg2
    from django.db import connection

    # Another session holds the lock, as a running prune does.
    other = psycopg2.connect(**connection.get_connection_params())
    other.autocommit = True
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [retention.ADVISORY_KEY])
    try:
        report = retention_prune()
        assert report.busy and report.executions == 0
        with pytest.raises(CommandError, match="Another pruning run"):
            call_command("tms_prune", stdout=StringIO())
    finally:
        # Released before the next prune: closing alone leaves the release to the server
        # process's exit, which a loaded machine let the next prune overtake.
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [retention.ADVISORY_KEY])
        other.close()
    assert retention_prune().executions > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch"),
        (["--batch", "x"], "--batch"),
        (["--before", "yesterday"], "--before"),
        (["--task", "not-a-uuid"], "--task"),
        (["--task", "00000000-0000-0000-0000-000000000000"], "No task"),
    ],
)
def test_bad_tms_prune_input_is_a_usage_error_that_changes_nothing(history, args, message):
    count = Execution.objects.count()
    with pytest.raises(CommandError, match=message):
        call_command("tms_prune", *args, stdout=StringIO())
    assert Execution.objects.count() == count and not ArchiveIndex.objects.exists()


def test_beat_runs_the_prune(history):
    register_periodic_tasks()
    job = PeriodicTask.objects.get(name="tms: prune and archive old executions")
    assert job.task == "tms.prune" and job.interval.every == 3600
    from executions.tasks import prune

    assert prune.run() > 0


# --- the API ---------------------------------------------------------------------------------


def test_retention_fields_through_the_api_with_per_field_errors(api_client):
    created = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "keep_last": 10, "keep_for": "7d", "keep_failed_longer": True}
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["keep_last"], body["keep_for"], body["keep_failed_longer"]) == (10, 7 * 86400.0, True)
    bad = api_client.patch(f"/api/v1/tasks/{body['id']}", {"keep_last": 0, "keep_for": "10m"})
    errors = bad.json().get("errors", bad.json())
    assert bad.status_code == 400 and {"keep_last", "keep_for"} <= set(errors), bad.content
    reset = api_client.patch(f"/api/v1/tasks/{body['id']}", {"keep_last": None, "keep_for": None})
    assert reset.status_code == 200 and reset.json()["keep_last"] is None and reset.json()["keep_for"] is None


def test_archive_endpoints_are_owner_scoped_and_give_only_the_tasks_rows(history, api_client, other_client):
    tasks, _, now = history
    retention_prune(batch=1000, now=now)  # one batch: the file holds both owners' tasks
    assert ArchiveIndex.objects.order_by().values("file_name").distinct().count() == 1
    mine = tasks["count"]
    listing = api_client.get(f"/api/v1/tasks/{mine.pk}/archive")
    assert listing.status_code == 200
    (entry,) = listing.json()["results"]
    assert entry["executions"] == 9 and entry["events"] == 18 and entry["skipped"] == 1
    response = api_client.get(f"/api/v1/tasks/{mine.pk}/archive/{entry['id']}")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    rows = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert len(rows) == 9 and {r["task_id"] for r in rows} == {str(mine.pk)}
    assert _ids_sha(r["id"] for r in rows) == entry["ids_sha256"]
    # Another owner: 404 for the list and the file, even with the right ids.
    assert other_client.get(f"/api/v1/tasks/{mine.pk}/archive").status_code == 404
    assert other_client.get(f"/api/v1/tasks/{mine.pk}/archive/{entry['id']}").status_code == 404
    theirs = ArchiveIndex.objects.filter(task=tasks["all_old"]).get()
    assert api_client.get(f"/api/v1/tasks/{mine.pk}/archive/{theirs.pk}").status_code == 404
    assert other_client.get(f"/api/v1/tasks/{tasks['all_old'].pk}/archive/{theirs.pk}").status_code == 200


def test_archive_routes_answer_options_and_unknown_ids_without_a_server_error(history, api_client, other_client):
    tasks, _, now = history
    retention_prune(now=now)
    entry = ArchiveIndex.objects.filter(task=tasks["count"]).first()
    base = f"/api/v1/tasks/{tasks['count'].pk}/archive"
    assert api_client.options(base).status_code == 200
    assert api_client.options(f"{base}/{entry.pk}").status_code == 200
    assert other_client.options(f"{base}/{entry.pk}").status_code == 404
    assert api_client.get(f"{base}/999999").status_code == 404
    assert api_client.get("/api/v1/tasks/not-a-uuid/archive").status_code == 404
