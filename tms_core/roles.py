"""Who may do what in the admin.

* **Superusers** operate: add, change and delete tasks, and pause, resume, run now, cancel and
  retry, all through the same services as the API.
* **Staff** (``tms_create_user --staff``) are read-only support: they are put in the
  :data:`SUPPORT_GROUP` group, which may view tasks, executions, their events, skipped
  occurrences, workers and artifacts, and change nothing. Grant more per user or group in the
  admin (``tasks_app.change_task`` lets a user edit, pause, resume and run tasks;
  ``executions.change_execution`` lets them cancel and retry executions).

The same rule holds in the API and the back office (:func:`may_act_for`): everyone acts on their
own objects; staff read everyone's, and change another owner's only with the model permission
the admin asks for (superusers have every permission). Every change is in the audit log.

The group is created after every ``migrate`` and by ``tms_create_user``; it is safe to edit:
permissions an operator adds to it are kept, the view permissions below are put back.
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


def may_act_for(user: Any, owner_id: Any, permission: str) -> bool:
    """Whether ``user`` may change an object owned by ``owner_id``: their own, or anyone's with
    ``permission`` (``"tasks_app.change_task"``, ...; superusers have them all)."""
    return bool(owner_id is not None and owner_id == user.pk) or bool(user.has_perm(permission))


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
