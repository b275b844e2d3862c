"""The Slack sandbox's App Home and Slack page: views.publish through slack_sdk's real WebClient, the
`app_home_opened` event it sends the installed app (signed JSON, as Slack's Events API does), and the page's read
of the workspace, which shows each member what Slack would show them and no one else's ephemeral messages."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from werkzeug.wrappers import Request, Response

from gpufarm.adapters.slack import SignatureCheck
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN, Sandbox
from gpufarm_sandbox.emulator.server import ServerThread
from gpufarm_sandbox.emulator.slack_page import CSP

HOME = {"type": "home", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Your GPUs*"}}]}


class Receiver:
    """The app's Request URL: records each request and whether its signature holds on the sandbox clock."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.check: SignatureCheck | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        body = request.get_data()
        assert self.check is not None
        self.requests.append(
            {"body": body, "headers": dict(request.headers), "valid": self.check.verify(body, dict(request.headers))}
        )
        return Response(b"", status=200)(environ, start_response)


@pytest.fixture(scope="module")
def receiver_server() -> Iterator[tuple[Receiver, str]]:
    receiver = Receiver()
    with ServerThread(receiver) as server:
        yield receiver, f"{server.url}/slack/events"


@pytest.fixture
def receiver(receiver_server: tuple[Receiver, str], sandbox: Sandbox) -> Iterator[tuple[Receiver, str]]:
    app, url = receiver_server
    app.requests = []
    app.check = SignatureCheck(sandbox.slack_signing_secret, clock=sandbox.clock.now)
    previous = sandbox.slack.app.request_url
    yield app, url
    sandbox.slack.app.request_url = previous


def control(base: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if data is None else "POST"
    request = urllib.request.Request(
        f"{base}{path}", data=data, headers={"Content-Type": "application/json"}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_views_publish_keeps_one_home_per_user_and_refuses_what_slack_refuses(sandbox_url: str) -> None:
    client = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)
    first = client.views_publish(user_id="U0000000001", view=HOME).data["view"]  # type: ignore[index]
    again = client.views_publish(user_id="U0000000001", view={**HOME, "blocks": [{"type": "divider"}]})
    assert again.data["view"]["id"] == first["id"] and again.data["view"]["hash"] != first["hash"]  # type: ignore[index]
    with pytest.raises(SlackApiError) as stale:
        client.views_publish(user_id="U0000000001", view=HOME, hash=first["hash"])
    assert stale.value.response.data["error"] == "hash_conflict"  # type: ignore[index]
    for user, view, error in (
        ("U0000000404", HOME, "user_not_found"),
        ("U0000000001", {**HOME, "type": "modal"}, "invalid_arguments"),
        ("U0000000001", {**HOME, "blocks": [{"type": "divider"}] * 101}, "invalid_arguments"),
    ):
        with pytest.raises(SlackApiError) as refused:
            client.views_publish(user_id=user, view=view)
        assert refused.value.response.data["error"] == error  # type: ignore[index]
    _, page = control(sandbox_url, "/_sandbox/slack/page?user=U0000000001")
    assert page["home"]["id"] == first["id"] and page["home"]["blocks"][0]["type"] == "divider"


def test_opening_the_home_tab_sends_a_signed_app_home_opened(receiver: tuple[Receiver, str], sandbox_url: str) -> None:
    app, url = receiver
    status, body = control(sandbox_url, "/_sandbox/slack/events", {"user": "U0000000001"})
    assert status == 400 and "no app is installed" in json.dumps(body)
    assert control(sandbox_url, "/_sandbox/slack/app", {"request_url": url})[0] == 200
    WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/").views_publish(
        user_id="U0000000001", view=HOME
    )
    status, body = control(sandbox_url, "/_sandbox/slack/events", {"user": "U0000000001"})
    assert status == 200 and body["status"] == 200
    (seen,) = app.requests
    assert seen["valid"] is True and seen["headers"]["Content-Type"] == "application/json"
    payload = json.loads(seen["body"])
    assert payload["type"] == "event_callback" and payload["api_app_id"] == "A0000000001"
    event = payload["event"]
    assert (event["type"], event["user"], event["channel"], event["tab"]) == (
        "app_home_opened",
        "U0000000001",
        "D0000000001",
        "home",
    )
    assert event["view"]["type"] == "home"
    # Bad input is refused by the sandbox and sends nothing.
    for bad in ({"user": "nobody"}, {"user": "U0000000404"}, {"user": "U0000000001", "tab": "files"}):
        assert control(sandbox_url, "/_sandbox/slack/events", bad)[0] == 400
    assert control(sandbox_url, "/_sandbox/slack/app", {"request_url": "file:///etc/passwd"})[0] == 400
    assert len(app.requests) == 1


def test_the_page_shows_each_member_only_what_slack_shows_them(sandbox_url: str) -> None:
    client = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)
    client.chat_postMessage(channel="C0000000001", text="for everyone")
    client.chat_postEphemeral(channel="C0000000001", user="U0000000001", text="for fake.user alone")
    client.chat_postMessage(channel="U0000000002", text="a DM to other.user")
    _, mine = control(sandbox_url, "/_sandbox/slack/page?user=U0000000001")
    _, theirs = control(sandbox_url, "/_sandbox/slack/page?user=U0000000002")
    assert [(m["text"], m["only_you"]) for m in mine["messages"]["C0000000001"]] == [
        ("for everyone", False),
        ("for fake.user alone", True),
    ]
    assert [m["text"] for m in theirs["messages"]["C0000000001"]] == ["for everyone"]
    assert "D0000000002" not in mine["messages"] and [m["text"] for m in theirs["messages"]["D0000000002"]] == [
        "a DM to other.user"
    ]
    assert {u["id"] for u in mine["users"]} == {"U0000000001", "U0000000002"}  # members; the bot is not one
    assert control(sandbox_url, "/_sandbox/slack/page?user=U0000000404")[0] == 400


def test_the_page_is_static_under_a_strict_content_security_policy(sandbox_url: str) -> None:
    for path, kind in (("/slack", "text/html"), ("/slack/page.js", "text/javascript"), ("/slack/page.css", "text/css")):
        with urllib.request.urlopen(f"{sandbox_url}{path}", timeout=5) as response:
            assert response.headers["Content-Type"].startswith(kind)
            assert response.headers["Content-Security-Policy"] == CSP
            text = response.read().decode()
        assert "http://" not in text.replace("http://127.0.0.1", "") and "https://" not in text
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    with urllib.request.urlopen(f"{sandbox_url}/slack/page.js", timeout=5) as response:
        script = response.read().decode()
    # Text from the app and the incidents is only ever set as text: no HTML parsing of it, no evaluated strings.
    for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert risky not in script, risky
    with urllib.request.urlopen(f"{sandbox_url}/slack", timeout=5) as response:
        page = response.read().decode()
    assert '<script src="/slack/page.js"></script>' in page and "<style" not in page and " style=" not in page
