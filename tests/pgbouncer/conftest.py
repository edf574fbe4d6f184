"""A private PgBouncer in transaction pooling mode (tooling.harness.pgbouncer) for the tests of
this folder: on a free port, its files under a /tmp/tms-pgbouncer-* folder of its own, in front
of the shared PostgreSQL (it only opens connections to it), killed at the end of the module
whatever happened. Separate from tests/ha's private RabbitMQ cluster."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from tooling.harness.pgbouncer import PgBouncer


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    with PgBouncer() as pgbouncer:
        yield pgbouncer


def pooled_database_url(bouncer: PgBouncer) -> str:
    """The test database through ``bouncer``."""
    return bouncer.url(connection.settings_dict["NAME"])


#: The connection's own server while :func:`django_through` sends it through a PgBouncer.
_direct: dict[str, str | None] = {}


def direct_database_url() -> str:
    """The test database on PostgreSQL itself (what ``TMS_LISTEN_DATABASE_URL`` names)."""
    db = {**connection.settings_dict, **_direct}
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@contextmanager
def django_through(bouncer: PgBouncer) -> Iterator[None]:
    """This process's Django connection goes through ``bouncer`` (with the settings
    ``TMS_DATABASE_POOLER=transaction`` gives it), then back to PostgreSQL directly."""
    db = connection.settings_dict
    saved = {key: db.get(key) for key in ("HOST", "PORT", "DISABLE_SERVER_SIDE_CURSORS")}
    _direct.update(HOST=db.get("HOST"), PORT=db.get("PORT"))
    connection.close()
    db.update(HOST="127.0.0.1", PORT=str(bouncer.port), DISABLE_SERVER_SIDE_CURSORS=True)
    try:
        yield
    finally:
        connection.close()
        db.update(saved)
        _direct.clear()
