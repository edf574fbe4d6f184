"""The task form's named events (issue 48 item 5): written through the API's serializer (its
errors on the field), shown on the task page."""

from __future__ import annotations

from tasks_app.models import Task


def _new(**fields):
    data = {"name": "", "runner": "noop", "timezone": "UTC", "misfire_policy": "run_once", "overlap_policy": "allow"}
    data.update({f"after_on_{i}": "success" for i in range(3)})
    data.update(fields)
    return data


def test_the_form_sets_named_events_and_the_page_shows_them(alice_client):
    events = (
        '["order.paid", {"name": "cart.changed", "debounce": "60s", "debounce_key": "$.customer", '
        '"debounce_max_wait": "5m"}]'
    )
    alice_client.post("/ui/tasks/", _new(name="subscriber", on_events=events))
    task = Task.objects.get(name="subscriber")
    assert [item["name"] for item in task.on_events] == ["order.paid", "cart.changed"]

    page = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert "order.paid, cart.changed (debounce 1m00s by $.customer, at most 5m00s)" in page

    bad = alice_client.post("/ui/tasks/", _new(name="bad", on_events='["no spaces allowed"]'))
    assert "Not an event name" in bad.content.decode() and not Task.objects.filter(name="bad").exists()
