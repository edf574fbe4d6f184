"""Migration 0015: stored cron expressions keep their meaning under the cronie day rule and ASCII-only
parsing (issue 26, defects 5 and 6a)."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tasks_app.models import AuditEntry, Task
from tasks_app.schedules import Schedule

migration = importlib.import_module("tasks_app.migrations.0015_cron_day_rule_and_ascii")

BEFORE = [("tasks_app", "0014_task_created_idx")]
AFTER = [("tasks_app", "0015_cron_day_rule_and_ascii")]


def _old_rule_days(expression: str, start: datetime, days: int) -> list[datetime]:
    """Days at midnight that ``expression`` (fields "0 0 dom month dow") selected under the old
    rule: a day field was unrestricted only when it was exactly "*" or "?"."""
    _, _, dom, _, dow = expression.split()

    def values(text: str, low: int, high: int) -> set[int]:
        chosen: set[int] = set()
        for item in text.split(","):
            base, _, step = item.partition("/")
            first, last = (low, high) if base in ("*", "?") else map(int, (base.split("-") * 2)[:2])
            chosen.update(range(first, (high if step and "-" not in base else last) + 1, int(step or 1)))
        return chosen

    days_ok, weekdays_ok = values(dom, 1, 31), {v % 7 for v in values(dow, 0, 6)}
    either = dom not in ("*", "?") and dow not in ("*", "?")
    out = []
    for n in range(days):
        day = start + timedelta(days=n)
        by_date, by_weekday = day.day in days_ok, day.isoweekday() % 7 in weekdays_ok
        if (by_date or by_weekday) if either else (by_date and by_weekday):
            out.append(day)
    return out


@pytest.mark.parametrize(
    ("stored", "rewritten"),
    [
        ("0 0 */2 * MON", "0 0 1-31/2 * MON"),
        ("1 1 1-7 * */7", "1 1 1-7 * 0-6/7"),
        ("0 0 */10,15 * */2", "0 0 1-31/10,15 * 0-6/2"),
        ("30 0 0 */3 * 1-5", "30 0 0 1-31/3 * 1-5"),  # six fields, seconds first
        ("0 0 * * */2", "0 0 * * */2"),  # the other day field is "*": the same under both rules
        ("0 0 ? * */2", "0 0 ? * */2"),
        ("0 0 13 * FRI", "0 0 13 * FRI"),  # nothing starts with "*"
        ("@weekly", "@weekly"),
        ("\u0665 * * * *", "5 * * * *"),  # U+0665 ARABIC-INDIC DIGIT FIVE was read as 5
        ("0\u00a00 * * *", "0 0 * * *"),  # a no-break space split fields
    ],
)
def test_rewrite_keeps_what_the_expression_meant(stored, rewritten):
    assert migration._old_meaning_kept(migration._ascii(stored)) == rewritten


@pytest.mark.parametrize("stored", ["0 0 */2 * 1", "0 0 1-7 * */7", "0 0 */10,15 * */2", "0 0 */3 * 1-5"])
def test_rewritten_expression_fires_as_the_stored_one_did(stored):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    before = _old_rule_days(stored, start, 400)
    rewritten = migration._old_meaning_kept(stored)
    after = Schedule(start_at=start, cron=rewritten).preview(len(before) + 1)
    assert after[: len(before)] == before and after[-1] >= start + timedelta(days=400)


@pytest.mark.django_db(transaction=True)
def test_migration_rewrites_stored_tasks_and_records_it(django_user_model):
    try:
        owner = django_user_model.objects.create_user("dora")
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps.get_model("tasks_app", "Task")
        common = {"owner_id": owner.pk, "runner": "noop", "start_at": timezone.now()}
        changed = old.objects.create(name="odd days or mondays", cron="0 0 */2 * MON", **common)
        digits = old.objects.create(name="digits", cron="\u0665 * * * *", **common)
        same = old.objects.create(name="plain", cron="*/5 * * * *", **common)
        interval = old.objects.create(name="interval", interval=timedelta(minutes=5), **common)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        crons = dict(Task.objects.values_list("name", "cron"))
        assert crons == {
            "odd days or mondays": "0 0 1-31/2 * MON",
            "digits": "5 * * * *",
            "plain": "*/5 * * * *",
            "interval": "",
        }
        entries = {e.task_id: e for e in AuditEntry.objects.filter(source="system")}
        assert set(entries) == {changed.pk, digits.pk}
        assert entries[changed.pk].changes == {"cron": {"from": "0 0 */2 * MON", "to": "0 0 1-31/2 * MON"}}
        assert entries[changed.pk].owner_id == owner.pk and entries[changed.pk].action == "update"
        assert same.pk not in entries and interval.pk not in entries
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
