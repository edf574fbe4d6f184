"""The named limits pages (issue 46): the list, a new limit, its edit form and its deletion, through
the API's serializer and services (tasks_api.limits), with the API's role rule: members read,
editors write, global limits are staff's; a viewer sees no write button and gets 403 on a POST."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from backoffice.limit_views import parse_windows, windows_text
from tasks_api.limits import limit_create
from tasks_api.services import task_create
from tasks_app.models import AuditEntry, Limit
from tasks_app.teams import member_set, team_create


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
