"""Single sign-on against a real OpenID Connect provider (oidc-provider-mock, its own process on
127.0.0.1), driven through the whole authorization-code flow by a real HTTP client against a live
TMS web server: redirects to the provider and back, the provider's form, its tokens and keys."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from axes.models import AccessLog
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import SuspiciousOperation
from django.core.management import call_command
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts.models import OidcIdentity
from accounts.oidc import OidcBackend
from accounts.roles import TEAM_ROLES
from accounts.sso import team_roles_for_groups
from accounts.support_group import SUPPORT_GROUP
from accounts.tokens import token_create
from tasks_app.models import AuditEntry, Membership, Team, TeamRole
from tasks_app.teams.services import member_remove, member_set, team_create
from tms_core.errors import InvalidInput
from tms_project.oidc_config import OidcConfigError, build_oidc_settings

SERVER = Path(__file__).with_name("oidc_provider_server.py")
GROUPS = {"tms-support": "staff", "tms-admins": "superuser"}


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """The provider's base URL (its issuer). Fails, never skips, when it cannot start."""
    process = subprocess.Popen(
        [sys.executable, "-W", "ignore", str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first_line: list[str] = []
    reader = threading.Thread(target=lambda: first_line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(20)
    if not first_line or not first_line[0].startswith("listening "):
        process.kill()
        pytest.fail(f"the OpenID Connect provider did not start: {process.stderr.read()[-2000:]}")  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{int(first_line[0].split()[1])}"
    finally:
        process.kill()
        process.wait(10)


def sso_settings(provider: str, **overrides) -> dict:
    return build_oidc_settings(
        client_id="tms-test",
        client_secret="tms-test-secret",
        issuer=provider,
        provider_name="Mock IdP",
        **{"groups": GROUPS, **overrides},
    )


@pytest.fixture
def sso_on(settings, provider):
    for name, value in sso_settings(provider).items():
        setattr(settings, name, value)
    return provider


def set_claims(provider: str, sub: str, **claims) -> None:
    response = requests.put(f"{provider}/users/{sub}", json=claims, timeout=10)
    assert response.status_code == 204, response.text


def sign_in(browser: requests.Session, live_url: str, sub: str, *, next_path: str = "/ui/tasks/") -> requests.Response:
    """Click 'Sign in with', choose ``sub`` on the provider's form, follow the redirects home."""
    at_provider = browser.get(f"{live_url}/oidc/authenticate/", params={"next": next_path}, timeout=10)
    assert at_provider.status_code == 200 and "/oauth2/authorize" in at_provider.url, at_provider.text[:500]
    return browser.post(at_provider.url, data={"sub": sub}, timeout=10)


def test_login_page_offers_sso_and_first_login_creates_the_user_with_mapped_groups(sso_on, live_server):
    set_claims(sso_on, "sub-alice", preferred_username="alice", email="alice@example.com", groups=["tms-support"])
    browser = requests.Session()
    page = browser.get(f"{live_server.url}/ui/login/", timeout=10)
    assert "Sign in with Mock IdP" in page.text and 'name="password"' in page.text
    for login_page in ("/admin/login/", "/api-auth/login/"):
        assert "Sign in with Mock IdP" in browser.get(f"{live_server.url}{login_page}", timeout=10).text

    home = sign_in(browser, live_server.url, "sub-alice")

    assert home.status_code == 200 and urlparse(home.url).path == "/ui/tasks/"
    user = get_user_model().objects.get(username="alice")
    assert (user.email, user.is_staff, user.is_superuser, user.has_usable_password()) == (
        "alice@example.com",
        True,
        False,
        False,
    )
    assert list(user.groups.values_list("name", flat=True)) == [SUPPORT_GROUP]
    identity = OidcIdentity.objects.get(user=user)
    assert (identity.issuer, identity.subject, identity.groups) == (sso_on, "sub-alice", ["tms-support"])
    # Recorded as every login is (django-axes' access log).
    assert AccessLog.objects.filter(username="alice").count() == 1
    # The provider's ID token is kept for its logout; the page now works as the user.
    assert '>alice <span class="tag">staff</span>' in browser.get(f"{live_server.url}/ui/tasks/", timeout=10).text


def test_a_later_login_follows_the_groups_and_matches_on_subject_not_name(sso_on, live_server):
    groups = ["tms-admins", "tms-support"]
    set_claims(sso_on, "sub-bob", preferred_username="bob", email="bob@example.com", groups=groups)
    sign_in(requests.Session(), live_server.url, "sub-bob")
    bob = get_user_model().objects.get(username="bob")
    assert (bob.is_staff, bob.is_superuser) == (True, True)
    assert list(bob.groups.values_list("name", flat=True)) == [SUPPORT_GROUP]

    # Left the admins' group, and renamed at the provider: same user, flags dropped.
    set_claims(sso_on, "sub-bob", preferred_username="robert", email="robert@example.com", groups=["other"])
    home = sign_in(requests.Session(), live_server.url, "sub-bob")

    assert home.status_code == 200
    bob.refresh_from_db()
    assert (bob.username, bob.email, bob.is_staff, bob.is_superuser) == ("robert", "robert@example.com", False, False)
    assert not bob.groups.exists()
    assert get_user_model().objects.count() == 1
    assert OidcIdentity.objects.count() == 1


def test_a_local_account_with_the_same_name_is_not_taken_over(sso_on, live_server, django_user_model, settings):
    local = django_user_model.objects.create_user("carol", email="carol@example.com", password="pw-local-1")
    set_claims(sso_on, "sub-mallory", preferred_username="carol", email="carol@example.com")

    refused = sign_in(requests.Session(), live_server.url, "sub-mallory")

    assert refused.status_code == 403
    assert "belongs to an account that is not linked" in refused.text
    assert OidcIdentity.objects.count() == 0
    assert django_user_model.objects.get().pk == local.pk

    # Refused again and again (past axes' failure limit): nobody's SSO sign-in from this address is locked out.
    for _ in range(settings.AXES_FAILURE_LIMIT):
        assert sign_in(requests.Session(), live_server.url, "sub-mallory").status_code == 403
    set_claims(sso_on, "sub-oscar", preferred_username="oscar", email="oscar@example.com")
    assert sign_in(requests.Session(), live_server.url, "sub-oscar").status_code == 200

    # Linked by an operator: the same sign-in now lands in the local account.
    OidcIdentity.objects.create(user=local, issuer=sso_on, subject="sub-mallory")
    assert sign_in(requests.Session(), live_server.url, "sub-mallory").status_code == 200


def test_logout_ends_the_session_here_and_at_the_provider(sso_on, live_server):
    set_claims(sso_on, "sub-dave", preferred_username="dave", email="dave@example.com")
    browser = requests.Session()
    sign_in(browser, live_server.url, "sub-dave")
    csrf = browser.cookies["csrftoken"]

    out = browser.post(
        f"{live_server.url}/ui/logout/",
        data={"csrfmiddlewaretoken": csrf},
        headers={"Referer": live_server.url},
        allow_redirects=False,
        timeout=10,
    )

    assert out.status_code == 302
    logout_url = urlparse(out.headers["Location"])
    assert f"{logout_url.scheme}://{logout_url.netloc}{logout_url.path}" == f"{sso_on}/oauth2/end_session"
    query = parse_qs(logout_url.query)
    assert query["post_logout_redirect_uri"] == [f"{live_server.url}/ui/login/"]
    assert query["client_id"] == ["tms-test"] and query["id_token_hint"][0].count(".") == 2
    # Ended here at once: the pages want a login again.
    assert browser.get(f"{live_server.url}/ui/tasks/", allow_redirects=False, timeout=10).status_code == 302
    # The provider's logout page sends the browser back to the login page.
    confirm = browser.get(out.headers["Location"], timeout=10)
    back = browser.post(
        f"{sso_on}/oauth2/end_session/confirm", data={"redirect_uri": query["post_logout_redirect_uri"][0]}, timeout=10
    )
    assert confirm.status_code == 200 and back.url == f"{live_server.url}/ui/login/"


def test_a_password_session_logs_out_locally_only(sso_on, live_server, django_user_model):
    django_user_model.objects.create_user("erin", password="pw-local-erin-1")
    browser = requests.Session()
    browser.get(f"{live_server.url}/ui/login/", timeout=10)
    logged_in = browser.post(
        f"{live_server.url}/ui/login/",
        data={"username": "erin", "password": "pw-local-erin-1", "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        headers={"Referer": live_server.url},
        timeout=10,
    )
    assert urlparse(logged_in.url).path == "/"
    out = browser.post(
        f"{live_server.url}/ui/logout/",
        data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        headers={"Referer": live_server.url},
        allow_redirects=False,
        timeout=10,
    )
    assert out.headers["Location"] == "/ui/login/"


def expire_renewal(browser: requests.Session) -> None:
    session = SessionStore(session_key=browser.cookies["sessionid"])
    session["oidc_id_token_expiration"] = 0
    session.save()


def test_an_expired_session_is_sent_back_to_the_provider_and_ends_when_it_no_longer_vouches(sso_on, live_server):
    set_claims(sso_on, "sub-frank", preferred_username="frank", email="frank@example.com")
    browser = requests.Session()
    sign_in(browser, live_server.url, "sub-frank")
    frank = get_user_model().objects.get(username="frank")
    _, key = token_create(user=frank, name="ci", scopes=["read"], expires_at=None)
    # Within TMS_OIDC_RENEW_SECONDS: no trip to the provider.
    assert browser.get(f"{live_server.url}/ui/executions/", allow_redirects=False, timeout=10).status_code == 200
    expire_renewal(browser)

    sent = browser.get(f"{live_server.url}/ui/executions/", allow_redirects=False, timeout=10)

    # Back to the provider, silently (prompt=none), to come back to the page asked for.
    assert sent.status_code == 302 and sent.headers["Location"].startswith(f"{sso_on}/oauth2/authorize?")
    assert parse_qs(urlparse(sent.headers["Location"]).query)["prompt"] == ["none"]
    # A bearer token is not a session: the API answers it as before, with no trip anywhere.
    api = requests.get(f"{live_server.url}/api/v1/tasks", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert api.status_code == 200
    # This provider holds no session of its own (as for a user disabled there): it answers
    # login_required, and the session here ends, with the way back to the page.
    ended = browser.get(sent.headers["Location"], timeout=10)
    assert urlparse(ended.url).path == "/ui/login/" and parse_qs(urlparse(ended.url).query)["next"] == [
        "/ui/executions/"
    ]
    assert "Your session has ended: sign in again with Mock IdP." in ended.text
    later = browser.get(f"{live_server.url}/ui/executions/", allow_redirects=False, timeout=10)
    assert later.status_code == 302 and later.headers["Location"].startswith("/ui/login/")
    assert requests.get(f"{live_server.url}/api/v1/tasks", headers={"Authorization": f"Bearer {key}"}, timeout=10).ok


def test_a_callback_with_a_state_this_browser_did_not_start_is_refused_clearly(sso_on, live_server):
    set_claims(sso_on, "sub-heidi", preferred_username="heidi", email="heidi@example.com")
    browser = requests.Session()
    at_provider = browser.get(f"{live_server.url}/oidc/authenticate/", timeout=10)
    back = browser.post(at_provider.url, data={"sub": "sub-heidi"}, allow_redirects=False, timeout=10)
    callback = urlparse(back.headers["Location"])
    code = parse_qs(callback.query)["code"][0]

    forged = browser.get(f"{live_server.url}/oidc/callback/", params={"code": code, "state": "not-mine"}, timeout=10)

    assert forged.status_code == 400
    assert "could not be verified" in forged.text
    # Another browser (no session state at all) gets the same clear refusal.
    stranger = requests.get(f"{live_server.url}/oidc/callback/?{callback.query}", timeout=10)
    assert stranger.status_code == 400 and "could not be verified" in stranger.text
    assert not get_user_model().objects.filter(username="heidi").exists()


def test_a_wrong_nonce_is_refused_clearly(sso_on, live_server):
    set_claims(sso_on, "sub-ivan", preferred_username="ivan", email="ivan@example.com")
    browser = requests.Session()
    at_provider = browser.get(f"{live_server.url}/oidc/authenticate/", timeout=10)
    back = browser.post(at_provider.url, data={"sub": "sub-ivan"}, allow_redirects=False, timeout=10)
    state = parse_qs(urlparse(back.headers["Location"]).query)["state"][0]
    session = SessionStore(session_key=browser.cookies["sessionid"])
    session["oidc_states"][state]["nonce"] = "another-nonce"
    session.save()

    refused = browser.get(back.headers["Location"], timeout=10)

    assert refused.status_code == 400 and "could not be verified" in refused.text
    assert not get_user_model().objects.filter(username="ivan").exists()


def test_hiding_the_local_form_refuses_password_logins(settings, provider, live_server, django_user_model):
    for name, value in sso_settings(provider, local_login=False).items():
        setattr(settings, name, value)
    django_user_model.objects.create_user("judy", password="pw-local-judy-1")
    browser = requests.Session()
    page = browser.get(f"{live_server.url}/ui/login/", timeout=10)
    assert "Sign in with Mock IdP" in page.text and 'name="password"' not in page.text
    for login_page in ("/admin/login/", "/api-auth/login/"):
        other = browser.get(f"{live_server.url}{login_page}", timeout=10).text
        assert "Sign in with Mock IdP" in other and 'name="password"' not in other

    csrf = "c" * 32  # the page has no form, so no token of its own: a cookie and the same value posted
    browser.cookies.set("csrftoken", csrf)
    posted = browser.post(
        f"{live_server.url}/ui/login/",
        data={"username": "judy", "password": "pw-local-judy-1", "csrfmiddlewaretoken": csrf},
        headers={"Referer": live_server.url},
        allow_redirects=False,
        timeout=10,
    )
    assert posted.status_code == 200  # the form again, not a login
    assert "_auth_user_id" not in SessionStore(session_key=browser.cookies.get("sessionid", "")).load()


def test_sso_off_shows_no_button_and_its_endpoints_are_404(settings, live_server):
    assert settings.TMS_OIDC["ENABLED"] is False  # the suite's own settings: no TMS_OIDC_CLIENT_ID
    browser = requests.Session()
    for login_page in ("/ui/login/", "/admin/login/", "/api-auth/login/"):
        page = browser.get(f"{live_server.url}{login_page}", timeout=10)
        assert page.status_code == 200 and "Sign in with" not in page.text and 'name="password"' in page.text
    for endpoint in ("/oidc/authenticate/", "/oidc/callback/?code=x&state=y"):
        assert browser.get(f"{live_server.url}{endpoint}", timeout=10).status_code == 404


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"issuer": "https://idp.example.com"}, "TMS_OIDC_ISSUER set but TMS_OIDC_CLIENT_ID is not"),
        ({"client_id": "tms"}, "TMS_OIDC_CLIENT_SECRET is required"),
        ({"client_id": "tms", "client_secret": "s"}, "needs TMS_OIDC_ISSUER"),
        (
            {"client_id": "tms", "client_secret": "s", "issuer": "https://idp", "groups": {"ops": "admin"}},
            "group 'ops' maps to 'admin', which is not a role (roles: staff, superuser, or team:<slug>:<role>",
        ),
        (
            {"client_id": "tms", "client_secret": "s", "issuer": "idp.example.com"},
            "TMS_OIDC_ISSUER must be an http(s) URL",
        ),
        ({"client_id": "tms", "client_secret": "s", "issuer": "https://idp", "scopes": "email"}, "must include openid"),
        (
            {"client_id": "tms", "client_secret": "s", "issuer": "https://idp", "renew_seconds": 5},
            "TMS_OIDC_RENEW_SECONDS",
        ),
    ],
)
def test_bad_sso_settings_are_refused_naming_the_variable(given, message):
    with pytest.raises(OidcConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_oidc_settings(**given)


def test_explicit_endpoints_need_no_issuer_and_off_by_default():
    assert build_oidc_settings() == {"TMS_OIDC": {"ENABLED": False, "LOCAL_LOGIN": True}}
    endpoints = {
        "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://idp/auth",
        "OIDC_OP_TOKEN_ENDPOINT": "https://idp/token",
        "OIDC_OP_USER_ENDPOINT": "https://idp/userinfo",
        "OIDC_OP_JWKS_ENDPOINT": "https://idp/jwks",
    }
    built = build_oidc_settings(client_id="tms", client_secret="s", endpoints=endpoints)
    assert built["TMS_OIDC"]["ENABLED"] and built["OIDC_OP_TOKEN_ENDPOINT"] == "https://idp/token"


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ("ops=owner", "'owner', which is not a role"),
        ("ops=team:ops:owner", "whose team role 'owner' is not one of viewer, operator, editor, admin"),
        ("ops=team:ops:viewer,leads", "TMS_OIDC_GROUPS: 'leads' is not group=role"),
    ],
)
def test_the_settings_module_refuses_an_unknown_role_at_start_up(groups, message):
    env = {
        "TMS_OIDC_CLIENT_ID": "tms",
        "TMS_OIDC_CLIENT_SECRET": "s",
        "TMS_OIDC_ISSUER": "https://idp.example.com",
        "TMS_OIDC_GROUPS": groups,
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "tms_project.settings.test"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_an_unreachable_provider_fails_the_sign_in_with_a_message_not_a_500(settings, live_server):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once the socket is closed
    for name, value in sso_settings(f"http://127.0.0.1:{closed}", timeout=2.0).items():
        setattr(settings, name, value)

    answer = requests.get(f"{live_server.url}/oidc/authenticate/", timeout=10)

    assert answer.status_code == 502 and "Mock IdP cannot be reached now" in answer.text


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"aud": "another-client", "iss": "https://idp.example.com"}, "issued to another client"),
        ({"aud": ["x", "tms-test"], "iss": "https://elsewhere.example.com"}, "issued by 'https://elsewhere"),
    ],
)
def test_an_id_token_for_another_client_or_from_another_issuer_is_refused(settings, monkeypatch, claims, refusal):
    for name, value in sso_settings("https://idp.example.com").items():
        setattr(settings, name, value)
    monkeypatch.setattr(OIDCAuthenticationBackend, "verify_token", lambda self, token, **kwargs: dict(claims))

    with pytest.raises(SuspiciousOperation, match=refusal):
        OidcBackend().verify_token("header.payload.signature", nonce="n")


# --- Team roles from the provider's groups (TMS_OIDC_GROUPS team:<slug>:<role>) ----------------

TEAM_GROUPS = {
    **GROUPS,
    "ops": "team:ops:operator",
    "ops-leads": "team:ops:admin",
    "data": "team:data:viewer",
    "ghost": "team:ghost:viewer",
}


@pytest.fixture
def sso_teams(settings, provider, django_user_model):
    """SSO with team grants; teams "ops" and "data" exist (made by olga, an administrator, their
    admin), "ghost" does not."""
    for name, value in sso_settings(provider, groups=TEAM_GROUPS).items():
        setattr(settings, name, value)
    # Staff: only a team an administrator made receives group members (and may take a mapped slug).
    olga = django_user_model.objects.create_user("olga", is_staff=True)
    return {
        "provider": provider,
        "ops": team_create(creator=olga, name="Ops", slug="ops"),
        "data": team_create(creator=olga, name="Data", slug="data"),
    }


def sso_roles(username: str) -> dict[str, tuple[str, bool]]:
    """team slug -> (role, sso) of the user's memberships, their personal team left out."""
    return {
        slug: (role, sso)
        for slug, role, sso in Membership.objects.filter(user__username=username, team__personal_of=None).values_list(
            "team__slug", "role", "sso"
        )
    }


def test_groups_give_team_roles_the_highest_wins_and_the_back_office_shows_the_team(sso_teams, live_server, caplog):
    provider, ops = sso_teams["provider"], sso_teams["ops"]
    set_claims(provider, "sub-pat", preferred_username="pat", groups=["ops", "ops-leads", "data", "ghost", "other"])
    browser = requests.Session()

    with caplog.at_level("WARNING", logger="accounts.sso"):
        home = sign_in(browser, live_server.url, "sub-pat")

    assert home.status_code == 200
    # ops and ops-leads both map to ops: the higher role, admin, wins.
    assert sso_roles("pat") == {"ops": ("admin", True), "data": ("viewer", True)}
    # A team that does not exist is not made: the grant is skipped, with a warning, and the sign-in goes on.
    assert not Team.objects.filter(slug="ghost").exists()
    assert "grant viewer of team 'ghost', which is skipped: there is no team with that slug" in caplog.text
    # Each change is audited as coming from single sign-on, by the user.
    entries = AuditEntry.objects.filter(action="team.member", source="sso").order_by("object_id")
    assert [(e.object_id, e.actor_name, e.changes["role"]["to"], e.changes["sso"]) for e in entries] == [
        (str(ops.pk), "pat", "admin", True),
        (str(sso_teams["data"].pk), "pat", "viewer", True),
    ]
    # The back office shows the teams to the user, with their role, and lets the admin manage ops.
    teams = browser.get(f"{live_server.url}/ui/teams/", timeout=10).text
    assert f'id="team-{ops.pk}"' in teams and f'id="team-{sso_teams["data"].pk}"' in teams
    page = browser.get(f"{live_server.url}/ui/teams/{ops.pk}/", timeout=10)
    assert page.status_code == 200 and "your role: admin" in page.text and 'id="add-member-form"' in page.text
    assert 'id="member-pat"' in page.text and ">SSO</span>" in page.text
    # The API says which memberships single sign-on manages.
    _, key = token_create(user=get_user_model().objects.get(username="pat"), name="t", scopes=["read"], expires_at=None)
    members = requests.get(
        f"{live_server.url}/api/v1/teams/{ops.pk}/members", headers={"Authorization": f"Bearer {key}"}, timeout=10
    ).json()["results"]
    assert {(m["username"], m["role"], m["sso"]) for m in members} == {("olga", "admin", False), ("pat", "admin", True)}


def test_a_later_login_follows_the_groups_and_never_touches_hand_added_memberships(sso_teams, live_server):
    provider, ops, data = sso_teams["provider"], sso_teams["ops"], sso_teams["data"]
    set_claims(provider, "sub-quinn", preferred_username="quinn", groups=["ops-leads", "data"])
    sign_in(requests.Session(), live_server.url, "sub-quinn")
    assert sso_roles("quinn") == {"ops": ("admin", True), "data": ("viewer", True)}
    # Added by hand (the API's service) to a team no group maps to.
    infra = team_create(creator=get_user_model().objects.get(username="olga"), name="Infra", slug="infra")
    member_set(team=infra, username="quinn", role="editor")

    # Moved from ops-leads to ops at the provider, and out of data.
    set_claims(provider, "sub-quinn", preferred_username="quinn", groups=["ops"])
    assert sign_in(requests.Session(), live_server.url, "sub-quinn").status_code == 200

    assert sso_roles("quinn") == {"ops": ("operator", True), "infra": ("editor", False)}
    removed = AuditEntry.objects.filter(action="team.member", source="sso", object_id=str(data.pk)).latest("id")
    assert removed.changes == {"username": "quinn", "role": {"from": "viewer", "to": None}, "sso": True}
    # Out of every mapped group: only what was added by hand is left (and the personal team).
    set_claims(provider, "sub-quinn", preferred_username="quinn", groups=[])
    sign_in(requests.Session(), live_server.url, "sub-quinn")
    assert sso_roles("quinn") == {"infra": ("editor", False)}
    assert Membership.objects.filter(user__username="quinn", team__personal_of__username="quinn").exists()
    assert Membership.objects.filter(team=ops, user__username="olga", role="admin").exists()


def test_a_hand_added_membership_in_a_mapped_team_stays_as_it_is_and_a_role_set_by_hand_takes_one_over(
    sso_teams, live_server
):
    provider, ops, data = sso_teams["provider"], sso_teams["ops"], sso_teams["data"]
    set_claims(provider, "sub-rita", preferred_username="rita", groups=["ops"])
    sign_in(requests.Session(), live_server.url, "sub-rita")
    member_set(team=data, username="rita", role="editor")  # by hand, in a team the group "data" maps to
    # Changed by hand in the back office's service: no longer the sync's.
    member_set(team=ops, username="rita", role="editor")
    assert sso_roles("rita") == {"ops": ("editor", False), "data": ("editor", False)}

    set_claims(provider, "sub-rita", preferred_username="rita", groups=["data"])  # data grants viewer; ops gone
    sign_in(requests.Session(), live_server.url, "sub-rita")

    assert sso_roles("rita") == {"ops": ("editor", False), "data": ("editor", False)}


def test_the_last_admin_rule_does_not_keep_a_role_the_provider_took_away(sso_teams, live_server):
    provider, ops = sso_teams["provider"], sso_teams["ops"]
    set_claims(provider, "sub-sam", preferred_username="sam", groups=["ops-leads"])
    sign_in(requests.Session(), live_server.url, "sub-sam")
    member_remove(team=ops, username="olga")  # sam is now ops' only admin
    with pytest.raises(InvalidInput) as refused:
        member_set(team=ops, username="sam", role="viewer")  # by hand: refused, as always
    assert "last admin" in refused.value.errors["role"][0]

    set_claims(provider, "sub-sam", preferred_username="sam", groups=["ops"])
    sign_in(requests.Session(), live_server.url, "sub-sam")

    assert sso_roles("sam") == {"ops": ("operator", True)}
    assert not Membership.objects.filter(team=ops, role="admin").exists()
    entry = AuditEntry.objects.filter(action="team.member", source="sso").latest("id")
    assert "the team has no admin now" in entry.detail
    # Out of both groups: removed too, last member or not.
    set_claims(provider, "sub-sam", preferred_username="sam", groups=[])
    sign_in(requests.Session(), live_server.url, "sub-sam")
    assert sso_roles("sam") == {}


def test_a_personal_team_is_never_granted(sso_teams, live_server, django_user_model, settings, caplog):
    olga = django_user_model.objects.get(username="olga")
    groups = {**TEAM_GROUPS, "olgas": f"team:{olga.personal_team.slug}:viewer"}
    for name, value in sso_settings(sso_teams["provider"], groups=groups).items():
        setattr(settings, name, value)
    set_claims(sso_teams["provider"], "sub-tom", preferred_username="tom", groups=["olgas"])
    with caplog.at_level("WARNING", logger="accounts.sso"):
        assert sign_in(requests.Session(), live_server.url, "sub-tom").status_code == 200
    assert sso_roles("tom") == {} and "it is a personal team" in caplog.text


def test_without_a_mapping_sso_leaves_memberships_alone(sso_teams, live_server, settings):
    provider = sso_teams["provider"]
    set_claims(provider, "sub-uma", preferred_username="uma", groups=["ops"])
    sign_in(requests.Session(), live_server.url, "sub-uma")
    settings.TMS_OIDC = {**settings.TMS_OIDC, "GROUPS": {}}
    set_claims(provider, "sub-uma", preferred_username="uma", groups=[])
    sign_in(requests.Session(), live_server.url, "sub-uma")
    assert sso_roles("uma") == {"ops": ("operator", True)}


def test_team_roles_of_the_setting_are_those_of_the_model():
    assert list(TEAM_ROLES) == list(TeamRole.values)
    assert team_roles_for_groups(["b", "a", "c"], {"a": "team:x:editor", "b": "team:x:viewer", "c": "staff"}) == {
        "x": "editor"
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ops=team:ops:owner", "group 'ops' maps to 'team:ops:owner', whose team role 'owner' is not one of viewer"),
        ("ops=team:ops", "'team:ops', which is not team:<slug>:<role>"),
        ("ops=team:o.ps:viewer", "whose team slug 'o.ps' is not letters, digits"),
        ("ops=team::viewer", "whose team slug '' is not"),
        ("ops", "'ops' is not group=role"),
        ("=staff", "'=staff' is not group=role"),
        ("ops=staff,ops=team:ops:admin", "group 'ops' is given twice"),
    ],
)
def test_a_malformed_team_grant_is_refused(value, message):
    with pytest.raises(OidcConfigError, match=re.escape(message)):
        build_oidc_settings(client_id="tms", client_secret="s", issuer="https://idp", groups=value)


def test_the_setting_text_is_read_with_team_grants():
    built = build_oidc_settings(
        client_id="tms",
        client_secret="s",
        issuer="https://idp",
        groups=" ops = team:ops:operator, ops-leads=team:ops:admin ,tms-support=staff,",
    )
    assert built["TMS_OIDC"]["GROUPS"] == {
        "ops": "team:ops:operator",
        "ops-leads": "team:ops:admin",
        "tms-support": "staff",
    }


# --- A mapped slug is an administrator's (security audit round 3, item 5) -------------------------

SQUAT_GROUPS = {**GROUPS, "platform": "team:platform:viewer"}


@pytest.fixture
def sso_platform(settings, provider):
    for name, value in sso_settings(provider, groups=SQUAT_GROUPS).items():
        setattr(settings, name, value)
    return provider


def test_a_user_cannot_create_a_team_under_a_mapped_slug_and_staff_can(sso_platform, django_user_model):
    from tests.conftest import client_for

    mallory = client_for(django_user_model.objects.create_user("mallory"))
    for body in ({"name": "Platform", "slug": "platform"}, {"name": "Platform"}, {"name": "x", "slug": "PLATFORM"}):
        response = mallory.post("/api/v1/teams", body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert "only an administrator can create that team" in str(response.json()["errors"]["slug"])
    assert not Team.objects.filter(slug__iexact="platform").exists()
    root = client_for(django_user_model.objects.create_user("root", is_staff=True))
    response = root.post("/api/v1/teams", {"name": "Platform", "slug": "platform"}, format="json")
    assert response.status_code == 201, response.content
    assert Team.objects.get(slug="platform").managed is True
    # A team an ordinary user makes under another slug is theirs, and no group's.
    assert mallory.post("/api/v1/teams", {"name": "Mine"}, format="json").status_code == 201
    assert Team.objects.get(slug="mine").managed is False


def test_a_squatted_mapped_slug_collects_nobody_at_sign_in(sso_platform, live_server, django_user_model, caplog):
    # The attack: a user's team under the mapped slug (made before the rule, or any way but staff's).
    mallory = django_user_model.objects.create_user("mallory")
    squat = Team.objects.create(name="Platform", slug="platform")
    Membership.objects.create(team=squat, user=mallory, role=TeamRole.ADMIN)
    set_claims(sso_platform, "sub-pat", preferred_username="pat", groups=["platform"])

    with caplog.at_level("WARNING", logger="accounts.sso"):
        assert sign_in(requests.Session(), live_server.url, "sub-pat").status_code == 200

    assert sso_roles("pat") == {}
    assert list(Membership.objects.filter(team=squat).values_list("user__username", flat=True)) == ["mallory"]
    assert "grant viewer of team 'platform', which is skipped: the team was not made by an administrator" in caplog.text
    # An administrator who vouches for the team marks it; the next sign-in grants.
    out = io.StringIO()
    call_command("tms_team_managed", "platform", stdout=out)
    assert "managed by administrators" in out.getvalue()
    assert AuditEntry.objects.filter(action="team.update", source="command:tms_team_managed").count() == 1
    sign_in(requests.Session(), live_server.url, "sub-pat")
    assert sso_roles("pat") == {"platform": ("viewer", True)}


def test_a_personal_team_named_like_a_mapped_slug_does_not_block_the_grant(
    sso_platform, live_server, django_user_model
):
    from tests.conftest import client_for

    # A user named like the slug, from before the mapping named it: their personal team holds it.
    holder = django_user_model.objects.create_user("platform")
    Team.objects.filter(personal_of=holder).update(slug="platform")  # made before the mapping named it
    root = client_for(django_user_model.objects.create_user("root", is_staff=True))
    response = root.post("/api/v1/teams", {"name": "Platform", "slug": "platform"}, format="json")
    assert response.status_code == 201, response.content
    holder.refresh_from_db()
    assert holder.personal_team.slug == f"platform-user-{holder.pk}"
    # A personal team made now never takes the mapped slug.
    late = django_user_model.objects.create_user("PLATFORM")
    assert late.personal_team.slug == f"platform-user-{late.pk}"
    set_claims(sso_platform, "sub-pat", preferred_username="pat", groups=["platform"])
    sign_in(requests.Session(), live_server.url, "sub-pat")
    assert sso_roles("pat") == {"platform": ("viewer", True)}
