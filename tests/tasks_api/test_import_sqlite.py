"""``manage.py tms_import_sqlite`` (issue 47): a user whose ``var/`` holds the SQLite database of
the release before PostgreSQL became the embedded default moves its users and tasks over.

The fixture file was made by that release (commit 5e4b00b) on its SQLite default: users alice and
bob; alice's http task "nightly report" (cron ``0 3 * * *`` in Europe/Paris, priority 7, a secret
``Authorization`` header) and her "after report" that follows it; bob's "every minute" (an
interval of 60 s, 5 attempts) and his deleted "gone".
"""

from __future__ import annotations

import gzip
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tasks_app.models import Task, TaskStatus
from tasks_app.secrets import config_open
from tasks_app.teams.services import personal_team_of
from tests.factories import UserFactory
from tests.processes import run_command
from tms_project.settings.base import DEVELOPMENT_SECRET_KEY, development_secrets_key
from tms_project.settings.public_keys import TEST_SECRETS_KEY

# The command runs as a user runs it, in a process of its own against the test database (it opens
# the file under a connection alias of its own, which a test's connection guard would refuse).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "tms-before-postgresql.sqlite3.gz"


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    path = tmp_path / "tms.sqlite3"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def test_users_and_live_tasks_move_over_with_their_secrets_and_links(legacy: Path) -> None:
    with sqlite3.connect(legacy) as db:
        (hashed,) = db.execute("SELECT password FROM auth_user WHERE username = 'alice'").fetchone()
    kept = UserFactory(username="bob")  # a user of that name here already is kept as he is

    # The file's secrets were sealed with the development key (the release's make run, nothing
    # configured); the suite's key seals them again, and opens them below.
    keys = f"{TEST_SECRETS_KEY},{development_secrets_key(DEVELOPMENT_SECRET_KEY)}"
    done = run_command("tms_import_sqlite", str(legacy), TMS_SECRET_KEYS=keys)
    assert done.returncode == 0, done.stderr

    alice = get_user_model().objects.get(username="alice")
    # The hash moves as it is: she signs in with the same password (the suite's settings hash
    # with a faster hasher, so the hash is compared rather than checked).
    assert (alice.email, alice.password) == ("alice@example.com", hashed) and hashed.startswith("pbkdf2")
    assert get_user_model().objects.get(username="bob") == kept
    tasks = {task.name: task for task in Task.objects.filter(owner__in=[alice, kept])}
    assert set(tasks) == {"nightly report", "after report", "every minute"}  # "gone" was deleted
    report = tasks["nightly report"]
    assert (report.cron, report.timezone, report.priority, report.status) == (
        "0 3 * * *",
        "Europe/Paris",
        7,
        TaskStatus.ACTIVE,
    )
    assert config_open(report.config)["headers"] == {"Authorization": "Bearer tok-123"}
    assert report.config["headers"]["Authorization"] != "Bearer tok-123"  # sealed again at rest
    assert report.team == personal_team_of(alice)
    follower = tasks["after report"]
    assert [(link.upstream_id, link.on) for link in follower.after.all()] == [(report.pk, "success")]
    minute = tasks["every minute"]
    assert (minute.interval, minute.max_attempts, minute.owner) == (timedelta(seconds=60), 5, kept)
    assert minute.executions.exists()  # created through the service: its first run is scheduled
    assert not legacy.exists() and legacy.with_name("tms.sqlite3.imported").exists()
    assert "Moved 2 user(s) and 3 task(s)" in done.stdout


def test_a_file_that_is_not_a_tms_database_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite3"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x int)")
    users = get_user_model().objects.count()
    refused = run_command("tms_import_sqlite", str(other))
    assert refused.returncode == 1 and "cannot be read as a TMS database" in refused.stderr, refused.stderr
    missing = run_command("tms_import_sqlite", str(tmp_path / "missing.sqlite3"))
    assert missing.returncode == 1 and "no such file" in missing.stderr, missing.stderr
    assert get_user_model().objects.count() == users and not Task.objects.exists()
    assert other.exists()
