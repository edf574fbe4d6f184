"""``manage.py tms_team_managed SLUG [--off]``: mark a team as made by administrators (or not).

Only a managed team receives the members single sign-on's group mapping grants
(``TMS_OIDC_GROUPS`` ``team:<slug>:<role>``, :func:`accounts.sso.sync_team_memberships`). Teams
staff create are managed from the start; this is for a team made before the flag existed, once an
administrator has checked who runs it. Through :func:`tasks_app.teams.services.team_set_managed`, audited as
``command:tms_team_managed``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from tasks_app.audit import AuditedCommand
from tasks_app.models import Team
from tasks_app.teams.services import team_set_managed
from tms_core.errors import InvalidInput


class Command(AuditedCommand):
    help = (
        "Mark a team as made by administrators, so that single sign-on's group mapping may add members to it "
        "(--off: no longer)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="The team's slug.")
        parser.add_argument("--off", action="store_true", help="Unmark it: group grants skip it from then on.")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["slug"]).first()
        if team is None:
            raise CommandError(f"There is no team with the slug {options['slug']!r}.")
        try:
            team_set_managed(team=team, managed=not options["off"])
        except InvalidInput as exc:
            raise CommandError(" ".join(str(m) for ms in exc.errors.values() for m in ms)) from None
        state = "managed by administrators" if team.managed else "not managed (group grants skip it)"
        self.stdout.write(f"Team {team.slug}: {state}.")
