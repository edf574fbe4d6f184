"""Approval steps in the back office (issue 48): a waiting run's page shows the question and,
for an operator, Approve/Reject with a labelled comment; the Approvals page (in the nav) lists
what waits; both post through the API's service (a second decision is refused in a message)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.messages import get_messages

from executions import transitions, worker_services
from executions.models import Approval, Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create

pytestmark = pytest.mark.django_db


def test_an_operator_decides_from_the_pages_and_a_viewer_only_reads(client, crew):
    people = crew["people"]
    task = task_create(
        owner=people["admin"],
        team=crew["team"],
        runner="approval",
        name="gate",
        config={"message": "Deploy to production?"},
        timeout=timedelta(hours=1),
        start_at=datetime(2099, 1, 1, tzinfo=UTC),
    )
    execution_id = transitions.execution_trigger(task_id=task.pk, actor="test", run_input={"v": 1})
    transitions.executions_take_due(limit=100, actor="monitor")
    assert worker_services.execution_run(execution_id=execution_id, attempt=1, worker_id="w:bo:1") == "polling"

    client.force_login(people["viewer"])
    page = client.get(f"/ui/executions/{execution_id}/").content.decode()
    assert "Deploy to production?" in page and 'id="approve"' not in page
    assert client.post(f"/ui/executions/{execution_id}/approve/").status_code == 403

    client.force_login(people["operator"])
    page = client.get(f"/ui/executions/{execution_id}/").content.decode()
    assert 'id="approve"' in page and 'id="reject"' in page
    assert '<label for="approval-comment">' in page
    listed = client.get("/ui/approvals/").content.decode()
    assert 'href="/ui/approvals/" class="current" aria-current="page"' in listed
    assert f'id="approval-{execution_id}"' in listed and "Deploy to production?" in listed
    assert f'<label for="comment-{execution_id}"' in listed

    answer = client.post(f"/ui/executions/{execution_id}/approve/", {"comment": "go", "back": "approvals"})
    assert (answer.status_code, answer["Location"]) == (302, "/ui/approvals/")
    assert [str(m) for m in get_messages(answer.wsgi_request)] == [f"Execution {execution_id} approved."]
    assert Execution.objects.get(pk=execution_id).status == S.SUCCEEDED
    assert Approval.objects.get(execution_id=execution_id).comment == "go"
    assert f'id="approval-{execution_id}"' not in client.get("/ui/approvals/").content.decode()
    # Decided already: said in a message, nothing changes.
    again = client.post(f"/ui/executions/{execution_id}/reject/")
    assert again.status_code == 302
    assert "decided already" in " ".join(str(m) for m in get_messages(again.wsgi_request))
    page = client.get(f"/ui/executions/{execution_id}/").content.decode()
    assert "Approved by crew-operator" in page and 'id="approve"' not in page


def test_the_approvals_page_shows_the_buttons_only_to_whom_the_step_names(client, crew):
    """A step whose ``approvers`` name people (or a higher role) lists for every member, with the
    buttons only for those it names: an operator it does not name would only get a 403."""
    people = crew["people"]
    ids = {}
    for name, approvers in (("named", [people["admin"].username]), ("by role", "admin"), ("open", None)):
        task = task_create(
            owner=people["admin"],
            team=crew["team"],
            runner="approval",
            name=name,
            config={"message": name} | ({"approvers": approvers} if approvers else {}),
            timeout=timedelta(hours=1),
            start_at=datetime(2099, 1, 1, tzinfo=UTC),
        )
        ids[name] = transitions.execution_trigger(task_id=task.pk, actor="test")
    transitions.executions_take_due(limit=100, actor="monitor")
    for execution_id in ids.values():
        assert worker_services.execution_run(execution_id=execution_id, attempt=1, worker_id="w:bo:1") == "polling"

    def buttons(who: str) -> dict[str, bool]:
        client.force_login(people[who])
        page = client.get("/ui/approvals/").content.decode()
        assert all(f'id="approval-{execution_id}"' in page for execution_id in ids.values())
        return {name: f'action="/ui/executions/{pk}/approve/"' in page for name, pk in ids.items()}

    assert buttons("operator") == {"named": False, "by role": False, "open": True}
    assert buttons("admin") == {"named": True, "by role": True, "open": True}
    client.force_login(people["operator"])
    assert client.post(f"/ui/executions/{ids['named']}/approve/").status_code in (302, 403)
    assert Execution.objects.get(pk=ids["named"]).status == S.RUNNING
