from __future__ import annotations

import pytest


@pytest.fixture
def alice_client(client, user):
    client.force_login(user)
    return client
