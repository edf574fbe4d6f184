"""What the back office's pages of a team's named objects (business calendars, named limits)
share: the list's context (cut at a bound), who may change one and the refusal of who may not,
and of their forms the ``team`` menu of a new one (the teams where the user is an editor: the
API's rule for a create; an object stays in its team, so an edit form has no menu), the refusal
of a create by someone who edits no team, and a text field parsed into the API's input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.db.models import QuerySet

from tasks_app.models import TeamRole
from tasks_app.teams import includes, teams_with_role
from tms_core.errors import RoleRequired


def editor_team_choices(user: Any) -> list[tuple[str, str]]:
    """A new limit's or calendar's team menu: the teams where ``user`` is an editor (the API's rule
    for a create), the personal team first."""
    teams = sorted(teams_with_role(user, TeamRole.EDITOR), key=lambda team: (not team.personal, team.name.lower()))
    return [(team.slug, f"{team.name} (personal)" if team.personal else team.name) for team in teams]


def editor_may(user: Any, obj: Any, permission: str) -> bool:
    """The API's rule for changing a team's object read with its ``caller_role``
    (:func:`tasks_app.teams.with_role`): an editor of its team, or the model ``permission``."""
    return includes(getattr(obj, "caller_role", None), TeamRole.EDITOR) or user.has_perm(permission)


def editor_required(obj: Any, what: str, plural: str) -> RoleRequired:
    """The refusal of a change of ``obj`` (a ``what``) by a user who may only look at it."""
    held = getattr(obj, "caller_role", None)
    message = (
        f"You may look at this {what} but not change it."
        if held is None
        else f"Your role in this team is {held}: to change its {plural} you need editor or higher."
    )
    return RoleRequired(message, role=TeamRole.EDITOR, held=held)


def parsed_field(parse: Callable[[str], Any], text: str | None) -> Any:
    """``parse(text)`` for a form's ``clean_<field>``: its ValueError's words become the field's error."""
    try:
        return parse(text or "")
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


def list_context(
    objects: QuerySet, form: TeamObjectForm, most: int, rows: Callable[[list[Any]], list[dict[str, Any]]]
) -> dict[str, Any]:
    """A list page's context: the ``rows`` made of the first ``most`` ``objects`` by name (then
    team, id), whether there were more, and the new object's ``form``."""
    shown = list(objects.order_by("name", "team__slug", "id")[: most + 1])
    return {
        "more": len(shown) > most,
        "most": most,
        "rows": rows(shown[:most]),
        "form": form,
        "can_create": form.can_create,
    }


class TeamObjectForm(forms.Form):
    """A form of a team's object; a subclass declares the ``team`` field with its own help text
    and may add choices to :meth:`team_choices`."""

    #: The objects' plural in the refusal of a create ("calendars").
    plural = ""

    def __init__(self, *args: Any, user: Any = None, editing: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["team"]
            return
        field = self.fields["team"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = self.team_choices(user)

    def team_choices(self, user: Any) -> list[tuple[str, str]]:
        """The menu of a new object's team."""
        return editor_team_choices(user)

    @property
    def can_create(self) -> bool:
        """Whether the menu offers a team at all (a new object's form only)."""
        return bool(self.fields["team"].choices)  # type: ignore[attr-defined]

    def require_team(self) -> None:
        """RoleRequired (403) for a create by a user who edits no team (the page shows no form then)."""
        if not self.can_create:
            raise RoleRequired(
                f"You are an editor of no team: you may look at {self.plural}, not define them.",
                role="editor",
                held=None,
            )
