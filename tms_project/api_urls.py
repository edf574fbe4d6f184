from rest_framework.routers import SimpleRouter

from executions.api import ExecutionViewSet
from tasks_app.api import TaskViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # both /tasks and /tasks/ resolve, without a redirect
router.register("tasks", TaskViewSet, basename="task")
router.register("executions", ExecutionViewSet, basename="execution")

urlpatterns = router.urls
