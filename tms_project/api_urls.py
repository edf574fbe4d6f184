from django.urls import re_path
from rest_framework.routers import SimpleRouter

from executions.api import ExecutionViewSet, TaskExecutionListView, WorkerViewSet
from tasks_app.api import TaskViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # both /tasks and /tasks/ resolve, without a redirect
router.register("tasks", TaskViewSet, basename="task")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("workers", WorkerViewSet, basename="worker")

urlpatterns = [
    re_path(r"^tasks/(?P<task_id>[^/.]+)/executions/?$", TaskExecutionListView.as_view(), name="task-executions"),
    *router.urls,
]
