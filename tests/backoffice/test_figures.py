"""Issue 28: what the back office's pages say is what is true (a task's state and next run, the
dashboard's percentiles, upcoming hour and waiting runs, the "why" lookup, the retry message, a
long timeline in pages), through Django's test client."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from backoffice.forms import TaskForm
from executions import transitions
from executions.dashboard import dashboard_snapshot
from executions.materialiser import materialise_due
from executions.models import Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from executions.rollup import rollup_rebuild
from tasks_api.creation import task_create
from tasks_app.models import Task, TaskStatus
from tests.backoffice.helpers import csrf_client, csrf_token, run
from tests.factories import ExecutionFactory, TaskFactory
from tms_core.clock import db_now

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    """The page's text without tags, whitespace folded (what a person reads)."""
    html = response.content.decode()
    html = re.sub(r"<(script|style|svg)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


# --- 1, 2: a task's state and next run -------------------------------------------------------------


def test_a_one_shot_task_due_soon_reads_scheduled_not_completed(alice_client, user):
    due = db_now() + timedelta(minutes=2)
    task = task_create(owner=user, runner="noop", name="soon", start_at=due)
    materialise_due(horizon=600)
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED  # materialised: its one execution exists
    assert Execution.objects.filter(task=task, status=S.SCHEDULED).count() == 1
    page = alice_client.get(f"/ui/tasks/{task.pk}/")
    text = _text(page)
    assert re.search(r'id="task-status"[^>]*>scheduled<', page.content.decode())
    assert "schedule has ended" not in text and "COMPLETED" not in text.split("Settings")[0]
    assert f"Next run: {due:%a %Y-%m-%d %H:%M:%S} UTC" in text
    listing = _text(alice_client.get("/ui/tasks/"))
    assert "soon scheduled noop" in listing


def test_the_task_list_shows_the_next_run_not_the_cursor(alice_client, user):
    start = db_now() + timedelta(seconds=30)
    task = task_create(owner=user, runner="noop", name="every 30s", start_at=start, interval=timedelta(seconds=30))
    materialise_due(horizon=300)
    task.refresh_from_db()
    first = Execution.objects.filter(task=task, status=S.SCHEDULED).order_by("due_at").first()
    assert first is not None and task.next_run_at > first.due_at  # the cursor runs ahead
    listing = _text(alice_client.get("/ui/tasks/"))
    assert f"{first.due_at:%Y-%m-%d %H:%M:%S}" in listing
    assert f"{task.next_run_at:%Y-%m-%d %H:%M:%S}" not in listing


# --- 9: retry's figure and message ------------------------------------------------------------------


def test_retry_says_what_it_did_and_counts_attempts_truly(user):
    task = task_create(owner=user, runner="noop", name="once", start_at=db_now(), max_attempts=1)
    failed = run(task, outcome="fail")
    client = csrf_client(user)
    token = csrf_token(client, f"/ui/executions/{failed.pk}/")
    page = client.post(f"/ui/executions/{failed.pk}/retry/", {"csrfmiddlewaretoken": token}, follow=True)
    retry = Execution.objects.get(retry_of=failed)
    assert retry.attempt == 2 and page.status_code == 200
    text = _text(page)
    assert f"Execution {retry.pk} retries execution {failed.pk}" in text
    assert "Attempt 2 of 1" not in text and "2 of 1" not in text
    assert "manual retry" in text


# --- 8: "why did it not run at HH:MM:SS?" with fire times that carry microseconds ------------------


def test_why_at_a_second_finds_the_fire_time_within_it(alice_client, api_client, user):
    start = db_now().replace(microsecond=292372) - timedelta(minutes=5)
    task = task_create(owner=user, runner="noop", name="µs", start_at=start, interval=timedelta(seconds=30))
    fire = start + timedelta(seconds=90)  # a fire time in the past, as the page shows it: to the second
    shown = fire.replace(microsecond=0)
    api_client.force_authenticate(user)
    answer = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": shown.isoformat()}).json()
    assert answer["verdict"] != "not_a_fire_time", answer
    assert answer["occurrence"].startswith(f"{fire:%Y-%m-%dT%H:%M:%S}.292372")
    # A fraction given is taken as given: that instant is between two fire times.
    between = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": shown.replace(microsecond=1).isoformat()}).json()
    assert between["verdict"] == "not_a_fire_time"
    page = alice_client.get(f"/ui/tasks/{task.pk}/", {"at": f"{shown:%Y-%m-%dT%H:%M:%S}"})
    text = _text(page)
    assert "is not a fire time" not in text
    assert f"Fire time: {fire:%Y-%m-%d %H:%M:%S} UTC" in text


# --- 6: a skipped local time is refused on the form, as the API refuses it -------------------------

SKIPPED = "2027-03-28T02:30:00"  # Europe/Berlin sets its clocks forward from 02:00 to 03:00


@pytest.mark.parametrize("path", ["/ui/tasks/", "edit"])
def test_a_skipped_local_time_is_an_error_on_the_field_as_in_the_api(api_client, user, path):
    api_client.force_authenticate(user)
    api = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "start_at": SKIPPED, "timezone": "Europe/Berlin"}, format="json"
    )
    assert api.status_code == 400 and "does not exist in Europe/Berlin" in str(api.json()), api.json()
    client = csrf_client(user)
    form = {"runner": "noop", "start_at": SKIPPED, "timezone": "Europe/Berlin", "misfire_policy": "run_once"}
    form.update(overlap_policy="allow", max_attempts="3", priority="5", retry_backoff="5s", interval="1d")
    if path == "edit":
        task = task_create(
            owner=user,
            runner="noop",
            name="berlin",
            start_at=db_now() + timedelta(days=1),
            interval=timedelta(days=1),
            timezone="Europe/Berlin",
        )
        before = Task.objects.filter(pk=task.pk).values().get()
        path = f"/ui/tasks/{task.pk}/edit/"
        form = {**TaskForm.initial_for(task), "start_at": SKIPPED}
    else:
        before = None
    form["csrfmiddlewaretoken"] = csrf_token(client, path)
    page = client.post(path, form)
    assert page.status_code == 400
    html = page.content.decode()
    error = re.search(r'class="[^"]*has-error[^"]*".*?<small class="error">([^<]*)<', html, re.S)
    assert error and "does not exist in Europe/Berlin" in error.group(1), html[:3000]
    if before is None:
        assert not Task.objects.exists()
    else:
        assert Task.objects.filter(pk=before["id"]).values().get() == before


# --- 5: runs held back by a limit are counted as due and listed in fire-time order with why ---------


def test_runs_held_by_a_limit_count_in_the_backlog_and_list_in_order_with_their_reason(alice_client, user):
    base = db_now() - timedelta(minutes=3)
    task = TaskFactory(owner=user, name="capped", max_concurrency=1, start_at=base, interval=timedelta(seconds=10))

    def on_the_grid(k: int) -> Execution:
        return ExecutionFactory(
            task=task, scheduled_for=base + timedelta(seconds=10 * k), status=S.PENDING, exclusive=True, message_id="m"
        )

    def claim(execution: Execution, worker: str) -> str:
        return transitions.execution_claim_exclusive(
            execution_id=execution.pk, attempt=1, worker_id=worker, lease_seconds=60
        ).outcome

    assert claim(on_the_grid(0), "w0") == "claimed"
    held = [on_the_grid(k) for k in (1, 2, 3)]
    for k, execution in reversed(list(enumerate(held))):  # the later ones are turned back first
        assert claim(execution, f"w{k + 1}") == "waiting"
    assert all(e.due_at > db_now() for e in Execution.objects.filter(pk__in=[e.pk for e in held]))
    later = ExecutionFactory(task=task, scheduled_for=db_now() + timedelta(minutes=5))
    dashboard = alice_client.get("/")
    assert re.search(r'id="tile-backlog">3<', dashboard.content.decode())
    assert "3 held by a limit" in _text(dashboard)
    listing = alice_client.get("/ui/executions/", {"status": "SCHEDULED"})
    rows = re.findall(r'<a href="/ui/executions/(\d+)/">#\d+</a>', listing.content.decode())
    assert [int(pk) for pk in rows] == [*(e.pk for e in held), later.pk]
    text = _text(listing)
    assert text.count("max_concurrency 1") == 3 and "Waiting for" in text


# --- 3: percentiles are interpolated within a bucket, and the page says so -------------------------


def test_duration_percentiles_are_interpolated_not_bucket_bounds(alice_client, user):
    task = task_create(owner=user, runner="noop", name="quick", start_at=db_now() + timedelta(days=1))
    # 7-35 ms noops: 20 runs of 7 ms (bucket 0-10 ms), 80 of 12-24 ms (10-25 ms), as the walk saw.
    for k in range(100):
        execution = run(task)
        took = 0.007 if k < 20 else 0.012 + 0.012 * (k - 20) / 79
        start = Execution.objects.get(pk=execution.pk).started_at
        Execution.objects.filter(pk=execution.pk).update(finished_at=start + timedelta(seconds=took))
    rollup_rebuild(since=db_now() - timedelta(hours=1))
    snapshot = dashboard_snapshot(user=user)
    (noop,) = snapshot.duration_by_runner
    assert noop.count == 100
    # The 50th of 100 is the 30th of 80 in 10-25 ms: 10 + 15 * 30/80 = 15.6 ms (the bucket said 25 ms).
    assert noop.p50 == pytest.approx(0.010 + 0.015 * 30 / 80)
    # The 99th interpolates to 24.8 ms, above the longest run (24 ms): clamped to it (issue 44).
    assert noop.p99 == pytest.approx(0.024)
    page = alice_client.get("/")
    assert "16 ms / 24 ms" in page.content.decode()  # the chart's figures: bounds read "25 ms / 25 ms"
    assert "interpolated within" in _text(page)


# --- 13: a 30-second task's timeline comes in pages ---------------------------------------------------


def test_a_busy_tasks_timeline_is_paged_and_its_pages_join_up(alice_client, user):
    start = db_now().replace(microsecond=292372) - timedelta(hours=12)
    task = task_create(owner=user, runner="noop", name="every 30 s", start_at=start, interval=timedelta(seconds=30))
    page = alice_client.get(f"/ui/tasks/{task.pk}/")
    html = page.content.decode()
    rows = re.findall(r'<tr class="occ-', html)
    assert 0 < len(rows) <= 100 and len(page.content) < 100 * 1024, (len(rows), len(page.content))

    def follow(link_id: str, html: str) -> str:
        href = re.search(rf'<a href="([^"]+)" id="{link_id}"', html).group(1).replace("&amp;", "&")
        response = alice_client.get(f"/ui/tasks/{task.pk}/{href.split('#')[0]}")
        assert response.status_code == 200
        return response.content.decode()

    def times(html: str) -> list[str]:
        return re.findall(r'<tr class="occ-[^"]*">\s*<td class="num"><a [^>]*>([^<]+)</a>', html)

    shown, earlier = times(html), times(follow("occurrences-earlier", html))
    assert earlier and len(earlier) <= 100
    # Consecutive pages join with no fire time lost: the earlier one ends with the fire time just
    # before this one's first, or with that first one itself when the window's edge falls inside
    # its second (page edges are whole seconds, fire times keep their fraction: occurrence_pages).
    joins = {timedelta(0), timedelta(seconds=30)}
    first = datetime.fromisoformat(shown[0])
    assert first - datetime.fromisoformat(earlier[-1]) in joins, (earlier[-1], shown[0])
    later = times(follow("occurrences-later", html))
    assert later and datetime.fromisoformat(later[0]) - datetime.fromisoformat(shown[-1]) in joins, (
        shown[-1],
        later[0],
    )
    # A long window asked for (6 hours: 720 fire times) shows a page and links to the rest of it.
    since = db_now() - timedelta(hours=6)
    wide = alice_client.get(
        f"/ui/tasks/{task.pk}/", {"from": f"{since:%Y-%m-%dT%H:%M:%S}", "to": f"{db_now():%Y-%m-%dT%H:%M:%S}"}
    ).content.decode()
    assert len(times(wide)) == 100
    rest = times(follow("occurrences-more", wide))
    assert datetime.fromisoformat(rest[0]) == datetime.fromisoformat(times(wide)[-1]) + timedelta(seconds=30)


# --- 7: before resuming, the page says what resume will do; paused times stay "paused" -------------


def test_resume_says_beforehand_what_it_will_do_and_paused_times_keep_their_reason(user):
    start = db_now() + timedelta(seconds=1)
    task = task_create(
        owner=user,
        runner="noop",
        name="every 10 s",
        start_at=start,
        interval=timedelta(seconds=10),
        misfire_policy="run_once",
        misfire_grace=timedelta(seconds=1),
    )
    client = csrf_client(user)
    token = csrf_token(client, f"/ui/tasks/{task.pk}/")
    paused = client.post(f"/ui/tasks/{task.pk}/pause/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "misfire policy is run_once" in _text(paused)
    # As if paused 100 s ago, before its first fire time: ten fire times passed since (its
    # schedule ends then, so that no more pass while the test runs on a slow machine).
    Task.objects.filter(pk=task.pk).update(
        start_at=start - timedelta(seconds=101),
        next_run_at=start - timedelta(seconds=101),
        paused_at=start - timedelta(seconds=102),
        end_at=start - timedelta(seconds=2),
    )
    page = _text(client.get(f"/ui/tasks/{task.pk}/"))
    assert (
        "If resumed now: 10 fire times passed while it was paused; under its misfire policy (run_once) "
        "resuming creates one catch-up run, due at once, for the latest of them" in page
    )
    assert "the other 9 are recorded as skipped, reason paused" in page
    token = csrf_token(client, f"/ui/tasks/{task.pk}/")
    resumed = client.post(f"/ui/tasks/{task.pk}/resume/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "Resumed. 10 fire times passed" in _text(resumed)
    reasons = list(SkippedOccurrence.objects.filter(task=task).values_list("reason", flat=True))
    assert reasons == ["paused"] * 9
    # One catch-up run (the execution superseded by the pause stays cancelled).
    assert Execution.objects.filter(task=task, superseded=False).count() == 1
    dashboard = _text(client.get("/"))
    assert "9 paused" in dashboard


# --- 4: the next hour from the schedules, not only what was materialised -------------------------


def test_upcoming_counts_the_hour_from_the_schedules(alice_client, user):
    soon = db_now() + timedelta(seconds=20)
    every_minute = task_create(owner=user, runner="noop", name="minutely", start_at=soon, interval=timedelta(minutes=1))
    task_create(owner=user, runner="noop", name="five-minutely", cron="*/5 * * * *", start_at=soon)
    task_create(
        owner=user,
        runner="noop",
        name="ends soon",
        start_at=soon,
        interval=timedelta(minutes=1),
        end_at=soon + timedelta(minutes=9, seconds=30),
    )
    materialise_due(horizon=300)  # five minutes materialised, as in production
    assert Execution.objects.filter(task=every_minute).count() == 5
    snapshot = dashboard_snapshot(user=user)
    # 60 (minutely) + 12 (cron every 5 min) + 10 (ends after its tenth), give or take the edges.
    assert snapshot.upcoming_exact
    assert 60 + 12 + 10 - 2 <= snapshot.upcoming_count <= 60 + 12 + 10
    assert len(snapshot.upcoming) == 20
    html = alice_client.get("/").content.decode()
    assert re.search(rf'id="upcoming-count">\({snapshot.upcoming_count} runs, from the schedules\)', html)


# --- budgets: a day's charts in 5-minute bins, their figures those of the minutes they hold -----------


def test_a_days_chart_bins_sum_the_minutes_and_read_percentiles_off_their_runs(alice_client, user):
    from dataclasses import replace

    from executions.dashboard import OUTCOMES, lateness_point
    from executions.histogram import BUCKETS, percentile

    snapshot = dashboard_snapshot(user=user)
    last = snapshot.last_minute
    # Runs in three minutes of one 5-minute bin and one minute of the current, partial bin.
    start = last - timedelta(minutes=(last.hour * 60 + last.minute) % 5) - timedelta(minutes=10)
    minutes = {
        start: ((3, 1, 0, 0), (4,) + (0,) * (BUCKETS - 1)),
        start + timedelta(minutes=2): ((5, 0, 1, 0), (0, 0, 0, 6) + (0,) * (BUCKETS - 4)),
        start + timedelta(minutes=4): ((0, 2, 0, 1), (0,) * (BUCKETS - 1) + (3,)),
        last: ((7, 0, 0, 0), (0, 7) + (0,) * (BUCKETS - 2)),
    }
    snapshot = replace(snapshot, by_minute=minutes)
    points = snapshot.points(1440, 5)
    assert len(points) in (288, 289)  # a bin starting on the 5-minute grid: a partial one at each end
    assert sum(p.total for p in points) == sum(p.total for p in snapshot.runs_per_minute) == 20
    (held,) = [p for p in points if p.minute == start]
    assert held.span == 5
    assert held.counts == dict(zip(OUTCOMES, (8, 3, 1, 1), strict=True))
    summed = [a + b + c for a, b, c in zip(*(minutes[m][1] for m in sorted(minutes)[:3]), strict=True)]
    assert lateness_point(held).p99 == percentile(summed, 0.99)  # not an average of the minutes' p99
    assert lateness_point(held).p50 == percentile(summed, 0.5)
    current = points[-1]
    assert current.minute + timedelta(minutes=current.span - 1) == last
    assert points[0].minute == last - timedelta(minutes=1439)  # the oldest bin holds only the day's minutes
    # The page draws the day in those bins (1,440 one-minute bars were 377 KiB of a 427 KiB page).
    html = str(alice_client.get("/").context["runs_chart"])
    assert html.count("<g><title>") <= 289
    assert "Runs per 5 minutes over the last 24 hours" in html


# --- budgets: the rollup's settled hours kept between renders, the live tail read each time -------


def test_the_dashboard_page_counts_runs_that_finish_after_it_kept_the_settled_hours(alice_client, user):
    from executions.models import RunRollup
    from executions.rollup import floor_minute

    # Hours of history, settled, and kept by the first render.
    RunRollup.objects.create(
        minute=floor_minute(db_now() - timedelta(hours=6)),
        team_id=user.personal_team.pk,
        runner="noop",
        shard=0,
        succeeded=9,
    )
    first = alice_client.get("/")
    assert re.search(r'id="tile-runs">0<', first.content.decode())  # none in the last hour
    assert sum(p.total for p in first.context["s"].runs_per_minute) == 9
    task = task_create(owner=user, runner="noop", name="now", start_at=db_now())
    run(task)
    run(task, outcome="fail")
    page = alice_client.get("/")
    assert re.search(r'id="tile-runs">2<', page.content.decode())
    assert re.search(r'id="tile-success">50.0%<', page.content.decode())
    kept = page.context["s"]
    assert sum(p.total for p in kept.runs_per_minute) == 11
    read_whole = dashboard_snapshot(user=user, now=kept.now)
    assert (kept.by_minute, kept.duration_by_runner) == (read_whole.by_minute, read_whole.duration_by_runner)
