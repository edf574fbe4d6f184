"""Account keys (``tms_create_user``'s, the older DRF keys) are stored hashed, and the keys made
before that keep working (security audit round 3, item 8)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient


def _rows_holding(key: str) -> list[tuple[str, str]]:
    """(table, row as text) of every row of the key tables whose text holds ``key``."""
    tables = {"authtoken_token"} | ({"accounts_accountkey"} & set(connection.introspection.table_names()))
    found = []
    with connection.cursor() as cursor:
        for table in sorted(tables):
            cursor.execute(f"SELECT t::text FROM {table} t")  # noqa: S608 - our own table names
            found += [(table, text) for (text,) in cursor.fetchall() if key in text]
    return found


def _status(key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/v1/tasks").status_code


@pytest.mark.django_db
def test_an_account_key_is_not_stored_in_clear_and_authenticates():
    out = io.StringIO()
    call_command("tms_create_user", "dana", stdout=out, stderr=io.StringIO())
    key = out.getvalue().strip()
    assert len(key) == 40
    assert _rows_holding(key) == []
    assert _status(key) == 200
    assert _status(key[:-1] + ("0" if key[-1] != "0" else "1")) == 401


BEFORE = [("accounts", "0003_service_accounts_and_token_team"), ("authtoken", "0004_alter_tokenproxy_options")]
KEY = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.django_db(transaction=True)
def test_a_key_made_before_the_migration_still_authenticates_and_is_no_longer_in_clear():
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        user = old.get_model("auth", "User").objects.create(username="legacy", password="!")
        old.get_model("authtoken", "Token").objects.create(user_id=user.pk, key=KEY)
        assert _rows_holding(KEY) != []

        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        assert _rows_holding(KEY) == []
        assert _status(KEY) == 200
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
