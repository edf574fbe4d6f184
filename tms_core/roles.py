"""Who may do what in the admin.

* **Superusers** operate: add, change and delete tasks, and pause, resume, run now, cancel and
  retry, all through the same services as the API.
* **Staff** (``tms_create_user --staff``) are read-only support: they are put in the
  support group (:mod:`accounts.support_group`), which may view tasks, executions, their events, skipped
  occurrences, workers and artifacts, and change nothing. Grant more per user or group in the
  admin (``tasks_app.change_task`` lets a user edit, pause, resume and run tasks;
  ``executions.change_execution`` lets them cancel and retry executions).

The same rule holds in the API and the back office (:func:`may_act_for`): everyone acts on their
own objects; staff read everyone's, and change another owner's only with the model permission
the admin asks for (superusers have every permission). Every change is in the audit log.
"""

from __future__ import annotations

from typing import Any


def may_act_for(user: Any, owner_id: Any, permission: str) -> bool:
    """Whether ``user`` may change an object owned by ``owner_id``: their own, or anyone's with
    ``permission`` (``"tasks_app.change_task"``, ...; superusers have them all)."""
    return bool(owner_id is not None and owner_id == user.pk) or bool(user.has_perm(permission))
