from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from accounts.oidc import LogoutView
from tasks_api.compat import CompatTaskDetailView, CompatTaskListView
from tasks_api.events_api import EventHookView
from tasks_api.hooks_api import HookView
from tms_project.pages import favicon

# The admin without its navigation sidebar: it took 300 of a 1440 px screen from every list, and the
# task list no longer fitted beside its filters (the breadcrumbs and the index lead to every model).
admin.site.enable_nav_sidebar = False

urlpatterns = [
    # The operator back office: the dashboard at the root, its pages under /ui/ (not under /tasks/,
    # which is the original service's API).
    path("", include("backoffice.urls")),
    # Every logout ends an SSO session at the provider too (accounts.oidc.LogoutView); listed
    # before the admin's and DRF's own, which they replace.
    path("admin/logout/", LogoutView.as_view()),
    path("admin/", admin.site.urls),
    path("favicon.ico", favicon),
    path("api/v1/", include("tms_project.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema", template_name="tms/redoc.html"), name="redoc"),
    path("api-auth/logout/", LogoutView.as_view()),
    path("api-auth/", include("rest_framework.urls")),
    # Single sign-on (OpenID Connect): answers 404 unless TMS_OIDC_CLIENT_ID is set (docs/sso.md).
    path("oidc/", include("accounts.oidc_urls")),
    # Trigger URLs: outside systems start a task's run, signed with the URL's secret (no user).
    path("hooks/v1/events/<str:hook_id>", EventHookView.as_view(), name="event-hook"),
    path("hooks/v1/<str:hook_id>", HookView.as_view(), name="hook"),
    # The original service's API, at the root as its clients expect.
    re_path(r"^tasks/?$", CompatTaskListView.as_view(), name="compat-task-list"),
    re_path(r"^tasks/(?P<pk>[^/]+)/?$", CompatTaskDetailView.as_view(), name="compat-task-detail"),
]

handler403 = "tms_core.api.errors.handler403"
handler404 = "tms_core.api.errors.handler404"
handler500 = "tms_core.api.errors.handler500"
