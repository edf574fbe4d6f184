"""``/oidc/``: single sign-on's endpoints, with mozilla-django-oidc's URL names (404 while SSO is off)."""

from django.urls import path

from accounts import oidc

urlpatterns = [
    path("authenticate/", oidc.AuthenticateView.as_view(), name="oidc_authentication_init"),
    # The redirect URI to register at the provider: <TMS_PUBLIC_URL>/oidc/callback/
    path("callback/", oidc.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("logout/", oidc.OidcLogoutView.as_view(), name="oidc_logout"),
]
