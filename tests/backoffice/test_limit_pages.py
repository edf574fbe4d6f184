"""The named limits pages (issue 46): the list, a new limit, its edit form and its deletion, through
the API's serializer and services (tasks_api.limits), with the API's role rule: members read,
editors write, global limits are staff's; a viewer sees no write button and gets 403 on a POST."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from backoffice.limit_views import parse_windows, windows_text
from tasks_api.creation import task_create
from tasks_api.limits import limit_create
from tasks_app.models import AuditEntry, Limit
from tasks_app.teams.services import member_set, team_create


@pytest.fixture
def ops(db, user):
    team = team_create(creator=user, name="Ops", slug="ops")
    get_user_model().objects.create_user("vera")
    member_set(team=team, username="vera", role="viewer")
    return team


def test_windows_read_and_written_in_words():
    assert parse_windows("10 per 1s, 1000/1h\n") == [{"count": 10, "seconds": 1.0}, {"count": 1000, "seconds": 3600.0}]
    assert windows_text([{"count": 10, "seconds": 1.0}, {"count": 5, "seconds": 90.0}]) == "10 per 1s, 5 per 1m30s"
    with pytest.raises(ValueError, match="write each window as"):
        parse_windows("ten per second")


def test_an_editor_defines_changes_and_deletes_a_limit(alice_client, user, ops):
    page = alice_client.get("/ui/limits/")
    assert page.status_code == 200 and 'id="new-limit-form"' in page.content.decode()
    made = alice_client.post(
        "/ui/limits/new/",
        {"team": "ops", "name": "api.example.com", "scope": "key", "max_concurrency": "3", "windows": "10 per 1s"},
        follow=True,
    )
    assert "Limit api.example.com (of team Ops) defined" in made.content.decode()
    limit = Limit.objects.get(name="api.example.com")
    assert (limit.team_id, limit.max_concurrency, limit.windows) == (ops.pk, 3, [{"count": 10, "seconds": 1.0}])
    assert AuditEntry.objects.filter(action="limit.create", object_id=str(limit.pk)).exists()
    # The service's refusals, on their field in plain words.
    taken = alice_client.post(
        "/ui/limits/new/", {"team": "ops", "name": "api.example.com", "scope": "key", "max_concurrency": "1"}
    )
    assert taken.status_code == 400 and taken.context["form"].errors["name"] == [
        "A limit named 'api.example.com' exists already."
    ]
    nothing = alice_client.post("/ui/limits/new/", {"team": "ops", "name": "empty", "scope": "key"})
    assert "needs a concurrency cap" in nothing.context["form"].errors["windows"][0]
    badwin = alice_client.post("/ui/limits/new/", {"team": "ops", "name": "w", "scope": "key", "windows": "0 per 1s"})
    assert "count must be a whole number" in " ".join(badwin.context["form"].errors["windows"])
    keyed = alice_client.post(
        "/ui/limits/new/", {"team": "ops", "name": "k", "scope": "host", "key": "x", "max_concurrency": "1"}
    )
    assert keyed.context["form"].errors["key"] == [
        "Only a limit of scope key takes a key: the others take it from each run."
    ]
    assert Limit.objects.count() == 1
    # Edit: only what changed is sent.
    form = alice_client.get(f"/ui/limits/{limit.pk}/edit/").context["form"]
    assert form.initial["windows"] == "10 per 1s"
    saved = alice_client.post(
        f"/ui/limits/{limit.pk}/edit/",
        {"name": "api.example.com", "scope": "key", "key": "", "max_concurrency": "5", "windows": "10 per 1s"},
        follow=True,
    )
    assert "Limit api.example.com saved (max_concurrency)" in saved.content.decode()
    assert Limit.objects.get(pk=limit.pk).max_concurrency == 5
    # A limit a task names cannot go: the service says which tasks.
    task = task_create(owner=user, team=ops, runner="noop", limits=["api.example.com"])
    kept = alice_client.post(f"/ui/limits/{limit.pk}/delete/", follow=True)
    assert f"is referenced by tasks ({task.pk})" in kept.content.decode() and Limit.objects.filter(pk=limit.pk).exists()
    assert '<td class="num">1</td>' in kept.content.decode()  # the tasks naming it
    other = limit_create(owner=user, team=ops, name="spare", max_concurrency=1)
    gone = alice_client.post(f"/ui/limits/{other.pk}/delete/", follow=True)
    assert "Limit spare deleted." in gone.content.decode() and not Limit.objects.filter(pk=other.pk).exists()


def test_a_viewer_reads_and_is_refused_and_an_outsider_sees_nothing(client, user, ops):
    limit = limit_create(owner=user, team=ops, name="shared", max_concurrency=2)
    mine = limit_create(owner=user, name="alices own", max_concurrency=2)
    vera = get_user_model().objects.get(username="vera")
    client.force_login(vera)
    page = client.get("/ui/limits/").content.decode()
    assert f'id="limit-{limit.pk}"' in page and f'id="limit-{mine.pk}"' not in page
    assert f"/ui/limits/{limit.pk}/edit/" not in page and "limit-delete" not in page
    # Her personal team is hers: the form offers it, never ops.
    assert [slug for slug, _ in client.get("/ui/limits/").context["form"].fields["team"].choices] == [
        vera.personal_team.slug
    ]
    assert client.get(f"/ui/limits/{limit.pk}/edit/").status_code == 403
    assert (
        client.post(f"/ui/limits/{limit.pk}/edit/", {"name": "x", "scope": "key", "max_concurrency": "1"}).status_code
        == 403
    )
    assert client.post(f"/ui/limits/{limit.pk}/delete/").status_code == 403
    refused = client.post("/ui/limits/new/", {"team": "ops", "name": "sneaky", "scope": "key", "max_concurrency": "1"})
    assert refused.status_code == 400 and "team" in refused.context["form"].errors
    assert client.post(f"/ui/limits/{mine.pk}/delete/").status_code == 404
    assert (
        Limit.objects.filter(name__in=["shared", "alices own"]).count() == 2
        and not Limit.objects.filter(name="sneaky").exists()
    )


def test_a_global_limit_is_staffs(client, user, staff_user):
    glob = limit_create(owner=None, name="everyone", max_concurrency=9)
    client.force_login(user)
    page = client.get("/ui/limits/").content.decode()
    assert f'id="limit-{glob.pk}"' in page and f"/ui/limits/{glob.pk}/edit/" not in page
    assert client.post(f"/ui/limits/{glob.pk}/delete/").status_code == 403
    assert "__global__" not in dict(client.get("/ui/limits/").context["form"].fields["team"].choices)


def test_the_list_reads_in_a_fixed_number_of_queries(alice_client, user, ops, django_assert_max_num_queries):
    limit_create(owner=user, team=ops, name="l0", max_concurrency=1)
    with django_assert_max_num_queries(99) as few:
        alice_client.get("/ui/limits/")
    for index in range(1, 20):
        shared = index % 2
        limit = limit_create(
            owner=user if shared else None, team=ops if shared else None, name=f"l{index}", max_concurrency=1
        )
        task_create(owner=user, team=ops, runner="noop", limits=[limit.name])
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = alice_client.get("/ui/limits/")
    assert len(page.context["rows"]) == 20


def test_the_list_is_bounded_and_says_so(alice_client, user, monkeypatch):
    monkeypatch.setattr("backoffice.limit_views.LIST_MOST", 2)
    for name in ("a", "b", "c"):
        limit_create(owner=user, name=name, max_concurrency=1)
    page = alice_client.get("/ui/limits/")
    assert [row["limit"].name for row in page.context["rows"]] == ["a", "b"]
    assert 'id="list-cut">The first 2 by name' in page.content.decode()


def test_a_limit_shows_what_it_holds_now_and_a_shared_one_only_the_readers_teams_use(
    alice_client, client, user, other_user, staff_user, django_assert_max_num_queries
):
    """Issue 46: a limit's current use on its page and in the list, by the API's rule (usage of
    /api/v1/limits): another team's hosts, slots and waiting runs on a global limit never show."""
    from datetime import timedelta

    from django.utils import timezone

    from executions.models import ExecutionStatus, LimitBucket, LimitSlot, LimitStart
    from tests.factories import ExecutionFactory, TaskFactory

    window = [{"count": 9, "seconds": 60}]
    limit = limit_create(owner=None, name="hosts", scope="host", max_concurrency=5, windows=window)
    theirs = LimitBucket.objects.create(limit=limit, key="private-partner.other-owner.example")
    mine = LimitBucket.objects.create(limit=limit, key="api.mine.example")
    later = timezone.now() + timedelta(hours=1)
    for bucket, owner, waiting in ((theirs, other_user, 3), (mine, user, 1)):
        task = TaskFactory(owner=owner, name=f"task of {owner.username}")
        task.limits.add(limit)
        for index in range(waiting):
            ExecutionFactory(task=task, scheduled_for=later + timedelta(minutes=index), waiting_on=bucket.pk)
        running = ExecutionFactory(task=task, status=ExecutionStatus.RUNNING, scheduled_for=later - timedelta(hours=2))
        LimitSlot.objects.create(bucket=bucket, execution=running, expires_at=later)
        LimitStart.objects.create(bucket=bucket, at=timezone.now())
    # A lapsed slot (a worker that died holding it) is not in use.
    lapsed = ExecutionFactory(task=task, status=ExecutionStatus.RUNNING, scheduled_for=later - timedelta(hours=3))
    LimitSlot.objects.create(bucket=theirs, execution=lapsed, expires_at=timezone.now() - timedelta(seconds=1))

    listing = alice_client.get("/ui/limits/").content.decode()
    assert "1 running, 1 waiting" in listing and f'href="/ui/limits/{limit.pk}/"' in listing
    page = alice_client.get(f"/ui/limits/{limit.pk}/")
    assert page.status_code == 200
    assert [(b["key"], b["slots_held"], b["waiting"]) for b in page.context["buckets"]] == [("api.mine.example", 1, 1)]
    html = page.content.decode()
    assert "other-owner" not in html and "task of bob" not in html and "task of alice" in html
    assert "at most 9 per 1m" in html and "your teams' runs only" in html and 'id="read-only"' in html
    # Staff, who run the platform, see every budget and its starts in the window.
    client.force_login(staff_user)
    assert "2 running, 4 waiting" in client.get("/ui/limits/").content.decode()
    page = client.get(f"/ui/limits/{limit.pk}/")
    assert [(b["key"], b["slots_held"], b["waiting"]) for b in page.context["buckets"]] == [
        ("api.mine.example", 1, 1),
        ("private-partner.other-owner.example", 1, 3),
    ]
    assert "1 of 9 in the last 1m" in page.content.decode()
    # The list's column costs the same few queries however many limits it shows.
    for index in range(20):
        limit_create(owner=user, name=f"cap-{index}", max_concurrency=1)
    with django_assert_max_num_queries(20):
        assert alice_client.get("/ui/limits/").status_code == 200


def test_a_team_limit_page_is_its_members_and_its_editors_may_edit(alice_client, client, user, other_user, ops):
    limit = limit_create(owner=user, team=ops, name="warehouse", max_concurrency=2)
    page = alice_client.get(f"/ui/limits/{limit.pk}/").content.decode()
    assert 'id="edit-limit"' in page and "No run holds or waits on it" in page
    client.force_login(get_user_model().objects.get(username="vera"))  # a viewer of Ops
    page = client.get(f"/ui/limits/{limit.pk}/").content.decode()
    assert 'id="read-only"' in page and 'id="edit-limit"' not in page
    client.force_login(other_user)  # no member of Ops: not found, as in the API
    assert client.get(f"/ui/limits/{limit.pk}/").status_code == 404
