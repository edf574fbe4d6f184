"""The ``approval`` runner: a workflow step that waits for a person's decision (issue 48).

Its run holds no worker: ``start`` records nothing outside (there is no external executor) and
asks to be polled once, at the end of the wait the task's ``timeout`` bounds. A person with the
role (or one of the usernames) the config names approves or rejects the run from the API or the
back office (:mod:`executions.approvals`): that decision ends the run at once, as a job's report
through its callback URL does, fenced by the attempt. If nobody decides in time, the poll at the
deadline ends it as ``on_timeout`` says: rejected (FAILED, not retried) or approved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec

#: The roles an ``approvers`` role may name (a team role at least operator).
APPROVER_ROLES = ("operator", "editor", "admin")
#: The poll that ends an undecided wait comes this long before the attempt's timeout, so that the
#: runner's ``on_timeout`` decides, not the worker's timeout (which would fail and retry the run).
DEADLINE_SLACK = 2.0
MAX_APPROVERS = 100


class ApprovalConfigSerializer(serializers.Serializer):
    message = serializers.CharField(
        required=False, allow_blank=True, max_length=2000, help_text="What the approvers are asked, shown to them."
    )
    approvers = serializers.JSONField(
        required=False,
        help_text="Who may decide: a list of usernames (each also needs the operator role in the task's team), or a "
        'team role ("operator", "editor", "admin"). Default: the operators of the task\'s team.',
    )

    def validate_approvers(self, data: Any) -> str | list[str]:
        """A list of usernames, or a team role (``operator``, ``editor``, ``admin``)."""
        if isinstance(data, str) and data in APPROVER_ROLES:
            return data
        if (
            isinstance(data, list)
            and 0 < len(data) <= MAX_APPROVERS
            and all(isinstance(name, str) and 0 < len(name) <= 150 for name in data)
        ):
            return list(dict.fromkeys(data))
        raise serializers.ValidationError(
            f"Expected a list of usernames (at most {MAX_APPROVERS}) or one of the roles {', '.join(APPROVER_ROLES)}."
        )

    on_timeout = serializers.ChoiceField(
        choices=["reject", "approve"],
        default="reject",
        help_text="What an undecided wait comes to when the task's timeout passes: reject (FAILED, not retried) or "
        "approve.",
    )


def approval_output(*, approved: bool, by: str | None, at: str, comment: str, run_input: Any, **extra: Any) -> str:
    """The run's output for a decision (JSON): what the next step gets as its input."""
    return json.dumps(
        {"approved": approved, "by": by, "at": at, "comment": comment, "input": run_input, **extra},
        default=str,
    )


class ApprovalRunner(BaseRunner):
    """Waits for a person's decision; see the module's documentation."""

    default_min_interval = 0.0
    config_serializer_class = ApprovalConfigSerializer
    supports_cancel = True
    #: The services find the runs waiting for a decision by this mark (:mod:`executions.approvals`).
    waits_for_approval: ClassVar[bool] = True

    def start(self, spec: RunSpec) -> RunHandle:
        now = time.time()
        deadline = now + max(spec.timeout - DEADLINE_SLACK, 0.0)
        return RunHandle(spec.idempotency_key, data={"requested_at": now, "deadline": deadline}, poll_at=deadline)

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        deadline = float(handle.data["deadline"])
        if time.time() < deadline:
            return RunResult.running(poll_at=deadline)
        at = datetime.fromtimestamp(time.time(), UTC).isoformat()
        waited = f"no decision within {spec.timeout:g}s"
        if spec.config.get("on_timeout") == "approve":
            output = approval_output(
                approved=True, by=None, at=at, comment=waited, run_input=spec.input, timed_out=True
            )
            return RunResult.succeeded(output)
        output = approval_output(approved=False, by=None, at=at, comment=waited, run_input=spec.input, timed_out=True)
        return RunResult.failed(f"approval rejected: {waited}", output=output, retryable=False)

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None


def approvers_of(config: Mapping[str, Any]) -> str | list[str]:
    """The config's approvers: a role or usernames (default: the operator role)."""
    return config.get("approvers") or "operator"
