from django.urls import path
from rest_framework.routers import SimpleRouter

from executions.api import ExecutionViewSet
from executions.callback_api import ExecutionCallbackView
from tasks_app.api import TaskViewSet
from tasks_app.artifact_api import ArtifactViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # both /tasks and /tasks/ resolve, without a redirect
router.register("tasks", TaskViewSet, basename="task")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("artifacts", ArtifactViewSet, basename="artifact")

urlpatterns = [
    path("executions/<int:pk>/callback", ExecutionCallbackView.as_view(), name="execution-callback"),
    *router.urls,
]
