"""The read-only support group staff users join (:mod:`tms_core.roles` says who may do what).

The group is created after every ``migrate`` and by ``tms_create_user``; it is safe to edit:
permissions an operator adds to it are kept, the view permissions below are put back. It lives
here, above the apps whose models it names, rather than in :mod:`tms_core`, which names none.
"""

from __future__ import annotations

from typing import Any

#: The group every staff user made by ``tms_create_user --staff`` joins.
SUPPORT_GROUP = "TMS support"

#: (app label, model) pairs the support group may view.
SUPPORT_VIEWS = (
    ("tasks_app", "task"),
    ("tasks_app", "artifact"),
    ("tasks_app", "auditentry"),
    ("executions", "execution"),
    ("executions", "executionevent"),
    ("executions", "skippedoccurrence"),
    ("executions", "worker"),
)


def ensure_support_group(using: str = "default") -> Any:
    """Create the support group if needed and give it the view permissions; return it.

    Returns None when the permissions do not exist yet (before the first ``migrate`` is done).
    """
    from django.contrib.auth.models import Group, Permission
    from django.db.models import Q

    wanted = Q()
    for app_label, model in SUPPORT_VIEWS:
        wanted |= Q(content_type__app_label=app_label, codename=f"view_{model}")
    permissions = list(Permission.objects.using(using).filter(wanted))
    if len(permissions) < len(SUPPORT_VIEWS):
        return None
    group, _ = Group.objects.using(using).get_or_create(name=SUPPORT_GROUP)
    group.permissions.add(*permissions)
    return group


def ensure_support_group_after_migrate(**kwargs: Any) -> None:
    """post_migrate receiver (connected for the last app whose models the group needs)."""
    ensure_support_group(using=kwargs.get("using", "default"))
