"""Statements kept back and sent with the next one (tms_core.together, issue 33)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from tms_core.together import execute_soon, sent_together

pytestmark = pytest.mark.django_db


@pytest.fixture
def scratch():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE together_scratch (n integer PRIMARY KEY, word text)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS together_scratch")


def _rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n, word FROM together_scratch ORDER BY n")
        return cursor.fetchall()


def test_kept_statements_go_with_the_next_one_in_order_and_it_answers_for_itself(scratch):
    with CaptureQueriesContext(connection) as queries, sent_together():
        execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "it's 100%"])
        execute_soon("UPDATE together_scratch SET word = word || %s WHERE n = 1", ["!"])
        assert len(queries.captured_queries) == 0, "nothing sent yet"
        with connection.cursor() as cursor:
            cursor.execute("SELECT word FROM together_scratch WHERE n = %s", [1])
            answer = cursor.fetchall()
    assert answer == [("it's 100%!",)], "the next statement sees the kept ones' writes"
    assert len(queries.captured_queries) == 1, "one round trip"


def test_what_is_still_kept_is_sent_when_the_block_ends(scratch):
    with CaptureQueriesContext(connection) as queries:
        with sent_together():
            execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "a"])
            execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [2, "b"])
        assert len(queries.captured_queries) == 1
    assert _rows() == [(1, "a"), (2, "b")]


def test_outside_the_block_a_statement_runs_at_once(scratch):
    execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "now"])
    assert _rows() == [(1, "now")]


def test_a_statement_with_a_literal_percent_and_no_parameters_sends_the_kept_ones_first(scratch):
    with sent_together():
        execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "a"])
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM together_scratch WHERE word LIKE 'a%'")
            assert cursor.fetchone() == (1,)


def test_a_kept_statement_that_fails_fails_the_block_and_its_transaction(scratch):
    execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "first"])

    def fails() -> None:
        with transaction.atomic(), sent_together():
            execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [2, "kept"])
            execute_soon("INSERT INTO together_scratch VALUES (%s, %s)", [1, "a duplicate"])

    with pytest.raises(IntegrityError):
        fails()
    assert _rows() == [(1, "first")], "nothing of the failed block stays"
