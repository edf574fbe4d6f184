"""``manage.py tms_quota (--team SLUG | --user USERNAME) [--max-tasks N] [--max-executions-per-hour N]
[--max-artifact-bytes N] [--fair-weight N]``: show a team's quota, or change some of its limits.

Quotas are per team; ``--user`` means that user's personal team (the per-user form of before
teams). A limit given as ``default`` goes back to the ``TMS_QUOTA_*`` / ``TMS_FAIR_WEIGHT``
setting, 0 means no limit. Changes go through :func:`tasks_app.quotas.team_quota_set` (the
admin's and the API's service), audited as ``command:tms_quota``.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from tasks_app.audit import AuditedCommand
from tasks_app.models import Team, TeamQuota
from tasks_app.quotas import QUOTA_FIELDS, team_limits, team_quota_set, team_quota_use
from tasks_app.teams.services import personal_team_of
from tms_core.errors import InvalidInput


def _limit(text: str) -> int | None:
    """A limit on the command line: a whole number, or ``default`` (None)."""
    if text.strip().lower() == "default":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number or 'default'") from None


class Command(AuditedCommand):
    help = (
        "Show a team's quota (its limits as set, in force, and used), or change some of them. "
        "--user USERNAME means that user's personal team. A limit of 'default' goes back to the setting; "
        "0 means no limit."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--team", help="The team's slug or id.")
        which.add_argument("--user", help="A username: that user's personal team.")
        for name in QUOTA_FIELDS:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=str, metavar="N|default")

    def handle(self, *args: Any, **options: Any) -> None:
        team = self._team(options)
        changes: dict[str, int | None] = {}
        for name in QUOTA_FIELDS:
            if options.get(name) is not None:
                try:
                    changes[name] = _limit(options[name])
                except ValueError as exc:
                    raise CommandError(f"--{name.replace('_', '-')}: {exc}") from None
        if changes:
            try:
                team_quota_set(team=team, **changes)
            except InvalidInput as exc:
                raise CommandError(
                    "; ".join(
                        f"--{field.replace('_', '-')}: {' '.join(map(str, msgs))}" for field, msgs in exc.errors.items()
                    )
                ) from None
        row = TeamQuota.objects.filter(pk=team.pk).first() or TeamQuota(team_id=team.pk)
        limits, use = team_limits(team.pk), team_quota_use(team)
        self.stdout.write(f"team {team.slug} (id {team.pk}{', personal' if team.personal else ''})")
        for name in QUOTA_FIELDS:
            value = getattr(row, name)
            shown = "default" if value is None else str(value)
            self.stdout.write(f"  {name}: {shown} (in force: {getattr(limits, name)})")
        self.stdout.write(
            f"  used: {use.tasks} tasks, {use.executions_last_hour} runs on request in the last hour, "
            f"{use.artifact_bytes} artifact bytes"
        )

    @staticmethod
    def _team(options: dict[str, Any]) -> Team:
        if options.get("user"):
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"--user: no user {options['user']!r}.")
            return personal_team_of(user)
        text = str(options["team"]).strip()
        team = Team.objects.filter(slug=text).first()
        if team is None and text.isdigit() and len(text) <= 9:
            team = Team.objects.filter(pk=int(text)).first()
        if team is None:
            raise CommandError(f"--team: no team {text!r} (give its slug or id).")
        return team
