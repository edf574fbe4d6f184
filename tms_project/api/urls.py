from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from accounts.api import AccessTokenViewSet
from accounts.service_accounts_api import (
    ServiceAccountListView,
    ServiceAccountTokenListView,
    ServiceAccountTokenView,
    ServiceAccountView,
)
from executions.api import (
    ExecutionViewSet,
    TaskArchiveFileView,
    TaskArchiveListView,
    TaskExecutionListView,
    WorkerViewSet,
)
from executions.approval_api import ApprovalListView
from executions.callback_api import ExecutionCallbackView
from executions.workflow_api import WorkflowRunViewSet, WorkflowViewSet
from notifications.api import ChannelViewSet, DeliveryViewSet, RuleViewSet
from tasks_api.api import SchedulePreviewView, TaskViewSet
from tasks_api.artifact_api import ArtifactUploadReceiveView, ArtifactViewSet
from tasks_api.audit_api import AuditEntryViewSet
from tasks_api.calendars_api import CalendarViewSet
from tasks_api.events_api import EventUrlView, EventView
from tasks_api.hooks_api import TaskTriggerUrlView
from tasks_api.limits_api import LimitViewSet
from tasks_api.quota_api import TeamQuotaView
from tasks_api.versions_api import TaskVersionListView, TaskVersionRestoreView
from teams_api.api import TeamMemberListView, TeamMemberView, TeamViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # both /tasks and /tasks/ resolve, without a redirect
router.register("tasks", TaskViewSet, basename="task")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("workers", WorkerViewSet, basename="worker")
router.register("artifacts", ArtifactViewSet, basename="artifact")
router.register("audit", AuditEntryViewSet, basename="audit")
router.register("limits", LimitViewSet, basename="limit")
router.register("calendars", CalendarViewSet, basename="calendar")
router.register("notification-channels", ChannelViewSet, basename="notification-channel")
router.register("notification-rules", RuleViewSet, basename="notification-rule")
router.register("notification-deliveries", DeliveryViewSet, basename="notification-delivery")
router.register("tokens", AccessTokenViewSet, basename="access-token")
router.register("teams", TeamViewSet, basename="team")
router.register("workflows", WorkflowViewSet, basename="workflow")
router.register("workflow-runs", WorkflowRunViewSet, basename="workflow-run")

urlpatterns = [
    re_path(r"^tasks/(?P<task_id>[^/.]+)/executions/?$", TaskExecutionListView.as_view(), name="task-executions"),
    re_path(r"^tasks/(?P<task_id>[^/.]+)/archive/?$", TaskArchiveListView.as_view(), name="task-archive"),
    re_path(
        r"^tasks/(?P<task_id>[^/.]+)/archive/(?P<archive_id>[0-9]{1,18})/?$",
        TaskArchiveFileView.as_view(),
        name="task-archive-file",
    ),
    re_path(r"^tasks/(?P<pk>[^/.]+)/trigger-url/?$", TaskTriggerUrlView.as_view(), name="task-trigger-url"),
    re_path(r"^tasks/(?P<task_id>[^/.]+)/versions/?$", TaskVersionListView.as_view(), name="task-versions"),
    re_path(
        r"^tasks/(?P<task_id>[^/.]+)/versions/(?P<number>[0-9]{1,9})/restore/?$",
        TaskVersionRestoreView.as_view(),
        name="task-version-restore",
    ),
    re_path(r"^teams/(?P<id>[0-9]{1,9})/members/?$", TeamMemberListView.as_view(), name="team-members"),
    re_path(
        r"^teams/(?P<id>[0-9]{1,9})/members/(?P<username>[\w.@+-]{1,150})/?$",
        TeamMemberView.as_view(),
        name="team-member",
    ),
    re_path(r"^teams/(?P<id>[0-9]{1,9})/quota/?$", TeamQuotaView.as_view(), name="team-quota"),
    re_path(
        r"^teams/(?P<id>[0-9]{1,9})/service-accounts/?$", ServiceAccountListView.as_view(), name="team-service-accounts"
    ),
    re_path(
        r"^teams/(?P<id>[0-9]{1,9})/service-accounts/(?P<sa_id>[0-9]{1,18})/?$",
        ServiceAccountView.as_view(),
        name="team-service-account",
    ),
    re_path(
        r"^teams/(?P<id>[0-9]{1,9})/service-accounts/(?P<sa_id>[0-9]{1,18})/tokens/?$",
        ServiceAccountTokenListView.as_view(),
        name="team-service-account-tokens",
    ),
    re_path(
        r"^teams/(?P<id>[0-9]{1,9})/service-accounts/(?P<sa_id>[0-9]{1,18})/tokens/(?P<token_id>[0-9]{1,18})/?$",
        ServiceAccountTokenView.as_view(),
        name="team-service-account-token",
    ),
    re_path(r"^schedules/preview/?$", SchedulePreviewView.as_view(), name="schedule-preview"),
    re_path(r"^approvals/?$", ApprovalListView.as_view(), name="approval-list"),
    re_path(r"^events/(?P<name>[^/]{1,200})/?$", EventView.as_view(), name="event-post"),
    re_path(r"^events/(?P<name>[^/]{1,200})/url/?$", EventUrlView.as_view(), name="event-url"),
    path("executions/<int:pk>/callback", ExecutionCallbackView.as_view(), name="execution-callback"),
    path("artifacts/uploads/<str:token>", ArtifactUploadReceiveView.as_view(), name="artifact-upload-receive"),
    *router.urls,
]
