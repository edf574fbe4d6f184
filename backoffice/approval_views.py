"""Approval steps in the back office (issue 48): the pending approvals of the user's teams, and
the Approve/Reject buttons of a waiting run (here and on its execution page), through the same
service as the API (:func:`executions.approvals.approval_decide`)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from backoffice.scope import execution_or_404
from executions.approvals import MAX_COMMENT, approval_decide, approvals_pending, is_waiting, may_decide
from executions.models import Approval, Execution
from runners.approval import approvers_of
from tms_core.form_errors import flash_outcome

#: The most pending approvals the page lists (oldest first).
PAGE_ROWS = 200


def _config(execution: Execution) -> dict[str, Any]:
    config = execution.config_override if execution.config_override is not None else execution.task.config
    return config if isinstance(config, dict) else {}


def approval_panel(user: Any, execution: Execution) -> dict[str, Any] | None:
    """What an execution's page shows of its approval: the question and who may decide while it
    waits (with whether ``user`` may), the decision once made; None for a run of another runner."""
    decided = Approval.objects.filter(execution_id=execution.pk).order_by("-attempt").first()
    waiting = is_waiting(execution, execution.task.runner)
    if decided is None and not waiting:
        return None
    config = _config(execution)
    approvers = approvers_of(config)
    return {
        "waiting": waiting,
        "message": config.get("message") or "",
        "approvers": approvers if isinstance(approvers, str) else ", ".join(approvers),
        "can_decide": waiting and may_decide(user, execution, config),
        "decided": decided,
        "max_comment": MAX_COMMENT,
    }


@login_required
def approvals_page(request: HttpRequest) -> HttpResponse:
    """The runs waiting for a decision in the user's teams, oldest first, with the buttons where
    the user may decide: the decision's own rule (:func:`~executions.approvals.may_decide`: the
    operator role, and the step's ``approvers``, a higher role or named people), asked once per
    team and ``approvers`` on the page, not per row."""
    executions = list(approvals_pending(request.user)[:PAGE_ROWS])
    decides: dict[tuple[int, str], bool] = {}
    rows = []
    for execution in executions:
        config = _config(execution)
        key = (execution.team_id, json.dumps(approvers_of(config), sort_keys=True))
        if key not in decides:
            decides[key] = may_decide(request.user, execution, config)
        rows.append({"execution": execution, "message": config.get("message") or "", "can_decide": decides[key]})
    return render(request, "backoffice/approvals.html", {"rows": rows, "max_comment": MAX_COMMENT})


def _decide(request: HttpRequest, pk: int, *, approve: bool) -> HttpResponse:
    execution = execution_or_404(request.user, pk)
    comment = request.POST.get("comment", "").replace("\x00", "")[:MAX_COMMENT]
    flash_outcome(
        request,
        lambda: approval_decide(user=request.user, execution_id=execution.pk, approve=approve, comment=comment),
        lambda approval: f"Execution {execution.pk} {approval.decision}.",
    )
    if request.POST.get("back") == "approvals":
        return redirect("backoffice:approvals")
    return redirect("backoffice:execution", pk=execution.pk)


@login_required
@require_POST
def approval_approve_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(request, pk, approve=True)


@login_required
@require_POST
def approval_reject_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(request, pk, approve=False)
