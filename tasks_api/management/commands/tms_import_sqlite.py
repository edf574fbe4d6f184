"""``manage.py tms_import_sqlite var/tms.sqlite3``: move the users and tasks of an earlier TMS's
embedded default (a SQLite file; the embedded default is now a private PostgreSQL) into the
configured database.

The file is opened read-only through Django's built-in SQLite backend, with this release's
models (the file must come from the release just before the change: an older one is refused with
a clear error). Users keep their names, e-mail addresses and password hashes (they sign in as
before). Each live task is created again through the API's own path (``TaskCreateSerializer``
then ``task_create``), in its owner's personal team, with its secrets decrypted with this
checkout's keys and sealed again; a task's ``after`` links are kept (upstreams are created
first). Run history (executions, audit, versions) stays in the file. Tasks that name a calendar,
named limits or an artifact are reported and left out, since those belong to teams that are not
moved. Once everything is in, the file is renamed ``*.imported`` (so the start-up message stops);
a failed import writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections, transaction

from tasks_api.creation import task_create
from tasks_api.serializers import TaskCreateSerializer
from tasks_app.models import Task, TaskDependency, TaskStatus
from tasks_app.secrets import config_open

#: The connection alias the file is opened under, for this command only.
ALIAS = "tms_legacy_file"
#: Fields of a task that the import does not carry over (see the module's docstring): what is
#: team-scoped, and what the service sets itself.
NOT_CARRIED = {"team", "artifact", "calendar", "limits", "after"}
#: Task columns added since that release: not read from the file (its table has none), so the
#: imported tasks get their defaults (as their ``after`` links, whose ``condition`` came later).
ADDED_SINCE = ("join", "workflow_timeout", "workflow_retries", "map_over", "map_concurrency", "on_events")
USER_FIELDS = ("username", "email", "password", "first_name", "last_name", "is_active", "is_staff", "is_superuser")


class Command(BaseCommand):
    help = (
        "Move the users and tasks of an earlier TMS's SQLite database (var/tms.sqlite3) into this one, "
        "through the task services; the file is renamed *.imported once they are in."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="The earlier SQLite database, e.g. var/tms.sqlite3")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["path"]).resolve()
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        default = connections.databases["default"]
        connections.databases[ALIAS] = {
            **{key: value for key, value in default.items() if key not in {"OPTIONS", "HOST", "PORT", "USER"}},
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": f"file:{path}?mode=ro",
            "OPTIONS": {"uri": True},
            "CONN_MAX_AGE": 0,
        }
        try:
            users, tasks, links = self._read()
        except DatabaseError as exc:
            raise CommandError(
                f"{path} cannot be read as a TMS database of the release before PostgreSQL became the embedded "
                f"default ({exc}). Import it with that release's tms_import_sqlite, or start afresh."
            ) from exc
        finally:
            connections[ALIAS].close()
            del connections.databases[ALIAS]
        with transaction.atomic():
            owners = self._users(users)
            created, left_out = self._tasks(tasks, links, owners)
        path.rename(path.with_name(path.name + ".imported"))
        self.stdout.write(
            f"Moved {len(owners)} user(s) and {created} task(s) from {path}; renamed it {path.name}.imported."
        )
        for line in left_out:
            self.stdout.write(f"  left out: {line}")

    def _read(self) -> tuple[list[dict[str, Any]], list[Task], list[TaskDependency]]:
        users = list(get_user_model().objects.using(ALIAS).values("id", *USER_FIELDS))
        tasks = list(
            Task.objects.using(ALIAS)
            .exclude(status=TaskStatus.DELETED)
            .defer(*ADDED_SINCE)
            .select_related("calendar", "artifact")
            .order_by("created_at", "id")
        )
        links = list(
            TaskDependency.objects.using(ALIAS).filter(task__in=[task.pk for task in tasks]).defer("condition")
        )
        for task in tasks:
            task.limit_names = list(task.limits.using(ALIAS).values_list("name", flat=True))  # type: ignore[attr-defined]
        return users, tasks, links

    def _users(self, rows: list[dict[str, Any]]) -> dict[int, Any]:
        """Old user id -> user here: an existing user of the same name is kept as it is."""
        model = get_user_model()
        found = {}
        for row in rows:
            old_id = row.pop("id")
            user = model.objects.filter(username=row["username"]).first()
            if user is None:
                # The password hash moves as it is: the user signs in with the same password.
                user = model.objects.create(**row)
            found[old_id] = user
        return found

    def _tasks(self, tasks: list[Task], links: list[TaskDependency], owners: dict[int, Any]) -> tuple[int, list[str]]:
        """Create the tasks, upstreams before the tasks that follow them; return how many were
        created and a line for each task left out."""
        after: dict[Any, list[TaskDependency]] = {}
        for link in links:
            after.setdefault(link.task_id, []).append(link)
        new_ids: dict[Any, Any] = {}
        left_out: list[str] = []
        pending = list(tasks)
        while pending:
            ready = [t for t in pending if all(link.upstream_id in new_ids for link in after.get(t.pk, []))]
            if not ready:
                # Upstreams that are deleted, left out or in a cycle: created without those links.
                ready = pending[:1]
            for task in ready:
                pending.remove(task)
                why = self._not_carried(task)
                if why:
                    left_out.append(f"task {task.name or task.pk} ({task.pk}): {why}")
                    continue
                data = self._data(task, after.get(task.pk, []), new_ids)
                owner = owners[task.owner_id]
                serializer = TaskCreateSerializer(data=data, context={"request": SimpleNamespace(user=owner)})
                if not serializer.is_valid():
                    raise CommandError(f"task {task.name or task.pk} ({task.pk}) is refused: {serializer.errors}")
                new_ids[task.pk] = task_create(owner=owner, **serializer.validated_data).pk
        return len(new_ids), left_out

    @staticmethod
    def _not_carried(task: Task) -> str:
        named = [
            what
            for what, present in (
                ("a calendar", task.calendar_id),
                ("an artifact", task.artifact_id),
                ("named limits", task.limit_names),  # type: ignore[attr-defined]
            )
            if present
        ]
        return f"it uses {' and '.join(named)} of its team, which are not moved" if named else ""

    @staticmethod
    def _data(task: Task, links: list[TaskDependency], new_ids: dict[Any, Any]) -> dict[str, Any]:
        """The task as the API's create call takes it: each field through its serializer field."""
        fields = TaskCreateSerializer().fields
        data: dict[str, Any] = {}
        for name, field in fields.items():
            if name in NOT_CARRIED or name in ADDED_SINCE or field.read_only or not hasattr(task, name):
                continue
            value = getattr(task, name)
            data[name] = None if value is None else field.to_representation(value)
        data["config"] = config_open(task.config)
        data["after"] = [
            {"task": str(new_ids[link.upstream_id]), "on": link.on} for link in links if link.upstream_id in new_ids
        ]
        return data
