"""The page's writes through Airflow's own api-server app, in process (issue 53): the app
`airflow api-server` serves (``create_app``), the project's plugins mounted in it, the
SimpleAuthManager of ``infra/airflow.sh test-env`` (users admin and viewer) signing users
in with real JWTs, as the session cookie a browser holds or as a script's bearer token.

A post signed in by the session cookie changes something only with the page's token and
from the page's own Origin, whatever other headers it carries; a script's bearer token,
with no cookie, needs neither. A preview needs the role that may change rules. A click is
timed only for a signed-in user."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.builders import make_rule

from velocity.settings import Settings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

HERE = "http://testserver"  # the TestClient's host: the page's own Origin
PAGE = "/velocity"


@pytest.fixture(scope="module")
def api_server(airflow_home: Path) -> Iterator[Any]:
    """Airflow's api-server app (core: the REST API, the auth manager's login, the plugins'
    apps), with the test-env's users signed in through its own /auth/token."""
    from airflow.api_fastapi.app import create_app, get_auth_manager, purge_cached_app
    from fastapi.testclient import TestClient

    purge_cached_app()
    app = create_app("core")
    # An earlier test of this process may have made the auth manager without its init, which
    # writes the users' generated passwords (a test run alone has create_app do it).
    get_auth_manager().init()
    with TestClient(app, base_url=HERE, follow_redirects=False) as client:
        yield client
    purge_cached_app()


def _jwt(client: Any, home: Path, user: str) -> str:
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    # Where the auth manager keeps them (its config may name a file outside AIRFLOW_HOME).
    passwords = SimpleAuthManager.get_passwords()
    reply = client.post("/auth/token", json={"username": user, "password": passwords[user]})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["access_token"])


class Session:
    """A user signed in to the api-server: the session cookie a browser holds (the user's
    JWT) and the page's token drawn into the page for it."""

    def __init__(self, client: Any, home: Path, user: str) -> None:
        self.client, self.jwt = client, _jwt(client, home, user)
        page = self.get(f"{PAGE}/")
        assert page.status_code == 200, page.text
        self.page = page.text
        found = re.search(r'<meta name="csrf-token" content="([0-9a-f]{64})">', self.page)
        assert found is not None, "the page holds its token for its script"
        self.token = found.group(1)

    def cookie(self, **more: str) -> dict[str, str]:
        cookies = {"_token": self.jwt, **more}
        return {"cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}

    def get(self, path: str, **headers: str) -> Any:
        return self.client.get(path, headers={**self.cookie(), **headers})

    def post(self, path: str, data: dict[str, str], **headers: str) -> Any:
        """A form post with the session cookie (no token unless ``data`` has it)."""
        return self.client.post(path, data=data, headers={**self.cookie(), **headers})


@pytest.fixture
def rules(velocity_conn: Settings, api_server: Any) -> Any:
    """Rules 1 (ACTIVE) and 2 (PAUSE) in this test's data dir, the velocity_default
    connection's; their store."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore

    store = RuleStore(velocity_conn.table_path(RULES))
    store.apply([make_rule(ruleId=1), make_rule(ruleId=2, ruleState="PAUSE")])
    return store


def _states(store: Any) -> dict[int, tuple[int, str]]:
    return {rule_id: (r.version, r.state.value) for rule_id, r in store.book().live.items()}


def test_every_form_that_posts_carries_the_session_s_token(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    admin = Session(api_server, airflow_home, "admin")
    posts = re.findall(r'<form[^>]*method="post".*?</form>', admin.page, re.S)
    # Pause, Delete and Set for each rule, Add or change rules, the backfill form.
    assert len(posts) >= 7
    field = f'<input type="hidden" name="csrf_token" value="{admin.token}">'
    assert all(field in form for form in posts), [f for f in posts if field not in f]
    # The token is the session's: another session's page holds another.
    again = Session(api_server, airflow_home, "admin")
    viewer = Session(api_server, airflow_home, "viewer")
    assert len({admin.token, again.token, viewer.token}) == 3
    # A viewer's page has no form that posts (no change, no preview) but holds its token.
    assert 'method="post"' not in viewer.page and "Your role may read" in viewer.page


def test_a_post_with_the_cookie_needs_the_token_and_the_page_s_origin(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    """Each forged post is refused with 403 and the rules stay as they were; the same post
    with the page's token from the page's own Origin pauses the rule."""
    admin = Session(api_server, airflow_home, "admin")
    other = Session(api_server, airflow_home, "admin")  # the same user, another session
    before = _states(rules)
    assert before == {1: (1, "ACTIVE"), 2: (1, "PAUSE")}
    pause = f"{PAGE}/rules/1/pause"
    token = {"csrf_token": admin.token}
    forged = [
        ("a foreign Origin", token, {"origin": "https://evil.example"}),
        ("a foreign Referer", token, {"referer": "https://evil.example/velocity/"}),
        ("no Origin and no Referer", token, {}),
        ("no token", {}, {"origin": HERE}),
        ("an empty token", {"csrf_token": ""}, {"origin": HERE}),
        ("another session's token", {"csrf_token": other.token}, {"origin": HERE}),
        ("a forged Authorization header", {}, {"origin": HERE, "authorization": "x"}),
        ("Authorization: Basic", {}, {"origin": HERE, "authorization": "Basic YTpi"}),
        ("Authorization: Bearer, no token", {}, {"origin": HERE, "authorization": "Bearer "}),
    ]
    for what, data, headers in forged:
        refused = admin.post(pause, data, **headers)
        assert refused.status_code == 403, (what, refused.text)
        assert _states(rules) == before, f"{what}: nothing written"
    assert "token" in admin.post(pause, {}, origin=HERE).json()["detail"]
    assert "from this page" in admin.post(pause, token, origin="https://evil.example").text
    # A real bearer token beside the cookie does not stand in for the page's token either.
    bearer = f"Bearer {admin.jwt}"
    refused = admin.post(pause, {}, origin=HERE, authorization=bearer)
    assert refused.status_code == 403, refused.text
    # The page's token as the header its script sends, or as the form's field.
    header = admin.post(pause, {}, origin=HERE, **{"x-csrf-token": "0" * 64})
    assert header.status_code == 403 and _states(rules) == before

    done = admin.post(pause, token, origin=HERE)
    assert done.status_code == 303, done.text
    assert _states(rules)[1] == (2, "PAUSE")
    by_header = admin.post(
        f"{PAGE}/rules/1/activate", {}, referer=f"{HERE}{PAGE}/", **{"x-csrf-token": admin.token}
    )
    assert by_header.status_code == 303, by_header.text
    assert _states(rules) == {1: (3, "ACTIVE"), 2: (1, "PAUSE")}


def test_a_script_posts_with_a_bearer_token_and_no_cookie(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    admin, viewer = (_jwt(api_server, airflow_home, u) for u in ("admin", "viewer"))
    activate = f"{PAGE}/rules/2/activate"
    refused = api_server.post(activate, headers={"authorization": f"Bearer {viewer}"})
    assert refused.status_code == 403 and "viewer may not change rules" in refused.text
    unsigned = api_server.post(activate, headers={"authorization": "Bearer not-a-jwt"})
    assert unsigned.status_code == 401
    assert _states(rules)[2] == (1, "PAUSE")
    done = api_server.post(activate, headers={"authorization": f"Bearer {admin}"})
    assert done.status_code == 303, done.text
    assert _states(rules)[2] == (2, "ACTIVE")
    # No cookie and no bearer token: nobody signed in.
    assert api_server.post(f"{PAGE}/rules/2/pause", headers={"origin": HERE}).status_code == 401


def test_a_preview_needs_the_role_that_may_change_rules_and_the_write_check(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    viewer = Session(api_server, airflow_home, "viewer")
    rule = json.dumps(make_rule(ruleId=1, limit=100).to_json())
    form = {"rules_json": rule, "hours": "1", "csrf_token": viewer.token}
    refused = viewer.post(f"{PAGE}/preview", form, origin=HERE)
    assert refused.status_code == 403, refused.text
    assert "viewer may not preview rules" in refused.text
    bearer = {"authorization": f"Bearer {viewer.jwt}"}
    api = api_server.post(f"{PAGE}/api/preview", json={"rules": rule}, headers=bearer)
    assert api.status_code == 403, api.text

    admin = Session(api_server, airflow_home, "admin")
    body = {"rules_json": rule, "hours": "1"}
    cross_site = admin.post(f"{PAGE}/preview", {**body, "csrf_token": admin.token})
    assert cross_site.status_code == 403, "no Origin: refused before any preview runs"
    assert admin.post(f"{PAGE}/preview", body, origin=HERE).status_code == 403
    shown = admin.post(f"{PAGE}/preview", {**body, "csrf_token": admin.token}, origin=HERE)
    # Previewed (this data dir has no events: the page says so, the form kept).
    assert shown.status_code in (200, 422), shown.text
    assert 'data-testid="rule-json"' in shown.text
    assert _states(rules) == {1: (1, "ACTIVE"), 2: (1, "PAUSE")}


def test_a_click_is_timed_only_for_a_signed_in_user(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    admin = Session(api_server, airflow_home, "admin")
    clicked = int(time.time() * 1000) - 100
    anonymous = {"cookie": f"velocity_click=anon1.{clicked}.nobody"}
    assert api_server.get(f"{PAGE}/", headers=anonymous).status_code == 401
    assert api_server.post(f"{PAGE}/rules/1/pause", headers=anonymous).status_code == 401
    signed_in = admin.cookie(velocity_click=f"adm1.{clicked}.somebody")
    assert api_server.get(f"{PAGE}/api/rules", headers=signed_in).status_code == 200
    clicks = admin.get(f"{PAGE}/api/clicks").json()
    assert [c["path"] for c in clicks if c["what"] == "somebody"] == [f"{PAGE}/api/rules"]
    assert not [c for c in clicks if c["what"] == "nobody"], "nothing recorded without a login"


def test_a_click_drawn_in_place_needs_the_token_and_the_origin_too(
    rules: Any, api_server: Any, airflow_home: Path
) -> None:
    """The page's script asks for the parts a click changed (X-Velocity-In-Place): the same
    write check holds, its refusal a 403 the script can say (JSON), nothing written; with
    the token, the rule's row comes back, its forms carrying the session's token."""
    admin = Session(api_server, airflow_home, "admin")
    viewer = Session(api_server, airflow_home, "viewer")
    pause = f"{PAGE}/rules/1/pause"
    in_place = {"x-velocity-in-place": "1"}
    before = _states(rules)
    refusals = [
        admin.post(pause, {}, origin=HERE, **in_place),
        admin.post(pause, {"csrf_token": admin.token}, origin="https://evil.example", **in_place),
        viewer.post(pause, {"csrf_token": viewer.token}, origin=HERE, **in_place),
    ]
    for refused in refusals:
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"], "said where the click was"
    assert "viewer may not change rules" in refusals[2].json()["detail"]
    assert _states(rules) == before, "nothing written"

    done = admin.post(pause, {}, origin=HERE, **in_place, **{"x-csrf-token": admin.token})
    assert done.status_code == 200, done.text
    answer = done.json()
    assert answer["ok"] and "ruleId 1: version 2 PAUSE" in answer["text"]
    row = answer["parts"]["rule-1"]
    assert '<td class="state-PAUSE">PAUSE</td>' in row
    assert f'name="csrf_token" value="{admin.token}"' in row
    assert "set-cookie" not in done.headers
    assert _states(rules) == {1: (2, "PAUSE"), 2: (1, "PAUSE")}
