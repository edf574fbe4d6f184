from __future__ import annotations

import pytest


@pytest.fixture
def alice_client(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def crew(db):
    """A team ("crew") with a member of each role (viewer, operator, editor) besides its admin."""
    from django.contrib.auth import get_user_model

    from tasks_app.teams.services import member_set, team_create

    users = get_user_model().objects
    admin = users.create_user("crew-admin")
    team = team_create(creator=admin, name="Crew")
    people = {"admin": admin}
    for role in ("viewer", "operator", "editor"):
        people[role] = users.create_user(f"crew-{role}")
        member_set(team=team, username=f"crew-{role}", role=role)
    return {"team": team, "people": people}
