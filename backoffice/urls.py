from django.contrib.auth import views as auth_views
from django.urls import path

from accounts.oidc import LogoutView
from backoffice import dashboard_views, notification_views, team_views, token_views, views

app_name = "backoffice"

urlpatterns = [
    path("", dashboard_views.dashboard, name="dashboard"),
    path("ui/dashboard/live", dashboard_views.dashboard_fragment, name="dashboard-live"),
    path(
        "ui/login/",
        auth_views.LoginView.as_view(template_name="registration/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    # Ends an SSO session at the provider too.
    path("ui/logout/", LogoutView.as_view(), name="logout"),
    path("ui/tasks/", views.task_list, name="tasks"),
    path("ui/tasks/<uuid:pk>/", views.task_detail, name="task"),
    path("ui/tasks/<uuid:pk>/edit/", views.task_edit, name="task-edit"),
    path("ui/tasks/<uuid:pk>/pause/", views.task_pause_view, name="task-pause"),
    path("ui/tasks/<uuid:pk>/resume/", views.task_resume_view, name="task-resume"),
    path("ui/tasks/<uuid:pk>/run/", views.task_trigger_view, name="task-trigger"),
    path("ui/tasks/<uuid:pk>/backfill/", views.task_backfill_view, name="task-backfill"),
    path("ui/tasks/<uuid:pk>/delete/", views.task_delete_view, name="task-delete"),
    path("ui/tasks/<uuid:pk>/trigger-url/", views.task_hook_view, name="task-trigger-url"),
    path("ui/executions/", views.execution_list, name="executions"),
    path("ui/executions/<int:pk>/", views.execution_detail, name="execution"),
    path("ui/executions/<int:pk>/cancel/", views.execution_cancel_view, name="execution-cancel"),
    path("ui/executions/<int:pk>/retry/", views.execution_retry_view, name="execution-retry"),
    path("ui/workflow-runs/<int:pk>/", views.workflow_run_detail, name="workflow-run"),
    path("ui/notifications/", notification_views.notifications_page, name="notifications"),
    path("ui/notifications/channels/<int:pk>/test/", notification_views.channel_test_view, name="channel-test"),
    path("ui/notifications/channels/new/", notification_views.channel_create_view, name="channel-create"),
    path("ui/notifications/channels/<int:pk>/edit/", notification_views.channel_edit_view, name="channel-edit"),
    path("ui/notifications/channels/<int:pk>/delete/", notification_views.channel_delete_view, name="channel-delete"),
    path("ui/notifications/rules/new/", notification_views.rule_create_view, name="rule-create"),
    path("ui/notifications/rules/<int:pk>/edit/", notification_views.rule_edit_view, name="rule-edit"),
    path("ui/notifications/rules/<int:pk>/delete/", notification_views.rule_delete_view, name="rule-delete"),
    path("ui/teams/", team_views.teams_page, name="teams"),
    path("ui/teams/new/", team_views.team_create_view, name="team-create"),
    path("ui/teams/<int:pk>/", team_views.team_page, name="team"),
    path("ui/teams/<int:pk>/members/", team_views.team_member_set_view, name="team-member-set"),
    path(
        "ui/teams/<int:pk>/members/<str:username>/remove/",
        team_views.team_member_remove_view,
        name="team-member-remove",
    ),
    path("ui/teams/<int:pk>/rename/", team_views.team_rename_view, name="team-rename"),
    path("ui/teams/<int:pk>/delete/", team_views.team_delete_view, name="team-delete"),
    path("ui/teams/<int:pk>/service-accounts/", team_views.service_account_create_view, name="service-account-create"),
    path(
        "ui/teams/<int:pk>/service-accounts/<int:account>/",
        team_views.service_account_page,
        name="service-account",
    ),
    path(
        "ui/teams/<int:pk>/service-accounts/<int:account>/delete/",
        team_views.service_account_delete_view,
        name="service-account-delete",
    ),
    path(
        "ui/teams/<int:pk>/service-accounts/<int:account>/tokens/",
        team_views.service_account_token_create_view,
        name="service-account-token-create",
    ),
    path(
        "ui/teams/<int:pk>/service-accounts/<int:account>/tokens/<int:token>/revoke/",
        team_views.service_account_token_revoke_view,
        name="service-account-token-revoke",
    ),
    path("ui/tokens/", token_views.tokens_page, name="tokens"),
    path("ui/tokens/new/", token_views.token_create_view, name="token-create"),
    path("ui/tokens/<int:pk>/revoke/", token_views.token_revoke_view, name="token-revoke"),
]
