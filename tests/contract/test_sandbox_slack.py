"""The Slack sandbox driven by slack_sdk's real WebClient, checked against the recorded Slack payloads."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
from recorded import key_paths, missing_keys
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from werkzeug.wrappers import Request, Response

from gpufarm.adapters.slack import SignatureCheck
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN, Sandbox
from gpufarm_sandbox.emulator.server import ServerThread
from gpufarm_sandbox.emulator.slack_dispatch import encode_form, encode_payload, sign

pytestmark = pytest.mark.contract

SLACK = Path(__file__).resolve().parent.parent / "fixtures" / "slack"
BUTTONS = [
    {"type": "section", "block_id": "gpu_status", "text": {"type": "mrkdwn", "text": "*gpu-node-01*: 6 of 8 free"}},
    {
        "type": "actions",
        "block_id": "gpu_actions",
        "elements": [
            {
                "type": "button",
                "action_id": "gpu_reserve",
                "text": {"type": "plain_text", "text": "Reserve"},
                "style": "primary",
                "value": "reserve:gpu-node-01",
            },
            {
                "type": "button",
                "action_id": "gpu_release",
                "text": {"type": "plain_text", "text": "Release"},
                "style": "danger",
                "value": "release:gpu-node-01",
            },
        ],
    },
]


def fixture_json(relative: str) -> Any:
    return json.loads((SLACK / relative).read_text())


def fixture_bytes(relative: str) -> bytes:
    return (SLACK / relative).read_bytes()


def modal() -> dict[str, Any]:
    """The GPU modal the fixtures submit (views.open's echo, minus what Slack adds)."""
    view = fixture_json("web_api/views.open.ok.gpu_modal.json")["view"]
    keep = ("type", "blocks", "private_metadata", "callback_id", "title", "notify_on_close", "close", "submit")
    return {k: view[k] for k in keep}


class SlackApp:
    """A stand-in for the app's ingress: verifies every request on the sandbox clock and answers as told."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.check: SignatureCheck | None = None
        self.answer: Callable[[dict[str, Any]], Response] = self.empty

    @staticmethod
    def empty(record: dict[str, Any]) -> Response:
        return Response(b"", status=200)

    def reset(self, sandbox: Sandbox) -> None:
        self.requests = []
        self.check = SignatureCheck(sandbox.slack_signing_secret, clock=sandbox.clock.now)
        self.answer = self.empty

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        body = request.get_data()
        assert self.check is not None
        record = {
            "body": body,
            "headers": dict(request.headers),
            "valid": self.check.verify(body, dict(request.headers)),
            "fields": parse_qsl(body.decode(), keep_blank_values=True),
        }
        if record["fields"] and record["fields"][0][0] == "payload":
            record["payload"] = json.loads(record["fields"][0][1])
        self.requests.append(record)
        return self.answer(record)(environ, start_response)


@pytest.fixture(scope="module")
def app_server() -> Iterator[tuple[SlackApp, str]]:
    # One receiver per module: stopping a server thread costs half a second.
    receiver = SlackApp()
    with ServerThread(receiver) as server:
        yield receiver, f"{server.url}/slack/events"


@pytest.fixture
def app(app_server: tuple[SlackApp, str], sandbox: Sandbox) -> tuple[SlackApp, str]:
    app_server[0].reset(sandbox)
    return app_server


@pytest.fixture
def client(sandbox_url: str) -> WebClient:
    return WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)


def control(base: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{base}{path}",
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if data is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def post_raw(url: str, data: bytes, content_type: str = "application/json") -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def api_error(call: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(SlackApiError) as info:
        call()
    data = info.value.response.data
    assert isinstance(data, dict)
    return data


def messages(base: str, **filters: str) -> list[dict[str, Any]]:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    status, body = control(base, f"/_sandbox/slack/messages?{query}")
    assert status == 200
    return list(body["messages"])


# -- wire encoding -----------------------------------------------------------------------------------------------


def test_slash_command_body_is_byte_identical_to_slacks() -> None:
    recorded = fixture_bytes("inbound/slash_command.txt")
    assert encode_form(parse_qsl(recorded.decode(), keep_blank_values=True)) == recorded


@pytest.mark.parametrize("name", ["block_actions", "view_submission", "view_closed"])
def test_interaction_body_is_byte_identical_to_slacks(name: str) -> None:
    assert encode_payload(fixture_json(f"inbound/{name}.json")) == fixture_bytes(f"inbound/{name}.body.txt")


def test_signatures_match_the_recorded_ones() -> None:
    vectors = fixture_json("inbound/signatures.json")
    for relative in ("inbound/slash_command.txt", "inbound/block_actions.body.txt", "inbound/view_submission.body.txt"):
        expected = vectors["files"][relative]
        got = sign(vectors["signing_secret"], expected["timestamp"], fixture_bytes(relative))
        assert got == expected["signature"]


# -- Web API answers -----------------------------------------------------------------------------------------------


def test_post_message_answers_like_slack(client: WebClient, sandbox_url: str) -> None:
    text = client.chat_postMessage(channel="C0000000001", text="GPU reservation received").data
    assert isinstance(text, dict)
    assert not missing_keys(text, fixture_json("web_api/chat.postMessage.ok.json"))
    assert text["message"]["blocks"][0]["type"] == "rich_text"
    blocks = client.chat_postMessage(channel="gpu-ops", text="gpu-node-01: 6 of 8 free", blocks=BUTTONS).data
    assert isinstance(blocks, dict)
    assert not missing_keys(blocks, fixture_json("web_api/chat.postMessage.ok.with_blocks.json"))
    echoed = blocks["message"]["blocks"][1]["elements"][0]
    assert echoed["text"]["emoji"] is True and echoed["value"] == "reserve:gpu-node-01"
    assert blocks["message"]["blocks"][0]["text"]["verbatim"] is False
    assert float(blocks["ts"]) > float(text["ts"])
    logged = messages(sandbox_url, channel="C0000000001")
    assert [m["ts"] for m in logged] == [text["ts"], blocks["ts"]]
    assert all(m["kind"] == "message" and m["user"] == "U0000000009" for m in logged)


def test_update_keeps_history_and_answers_like_slack(client: WebClient, sandbox_url: str) -> None:
    ts = client.chat_postMessage(channel="C0000000001", text="first")["ts"]
    updated = client.chat_update(channel="C0000000001", ts=ts, text="second", blocks=BUTTONS).data
    assert isinstance(updated, dict)
    assert not missing_keys(updated, fixture_json("web_api/chat.update.ok.json"))
    assert updated["ts"] == ts and updated["message"]["edited"]["user"] == "U0000000009"
    (logged,) = messages(sandbox_url, channel="C0000000001")
    assert logged["text"] == "second" and logged["edited"] is True
    assert [h["text"] for h in logged["history"]] == ["first"]
    assert api_error(lambda: client.chat_update(channel="C0000000001", ts="1.000009", text="x"))["error"] == (
        "message_not_found"
    )


def test_ephemeral_dm_and_directory_methods(client: WebClient, sandbox_url: str) -> None:
    eph = client.chat_postEphemeral(channel="C0000000001", user="U0000000001", text="only you").data
    assert isinstance(eph, dict)
    assert not missing_keys(eph, fixture_json("web_api/chat.postEphemeral.ok.json"))
    opened = client.conversations_open(users="U0000000001").data
    assert opened == fixture_json("web_api/conversations.open.ok.json")
    full = client.conversations_open(users=["U0000000001"], return_im=True).data
    assert not missing_keys(full, fixture_json("web_api/conversations.open.ok.already_open.json"))
    client.chat_postMessage(channel=opened["channel"]["id"], text="your GPUs are ready")
    user = client.users_info(user="U0000000001").data
    assert isinstance(user, dict)
    assert not missing_keys(user, fixture_json("web_api/users.info.ok.json"))
    assert user["user"]["name"] == "fake.user" and user["user"]["is_bot"] is False
    group = client.usergroups_users_list(usergroup="S0000000001").data
    assert set(key_paths(group)) == set(key_paths(fixture_json("web_api/usergroups.users.list.ok.json")))
    assert client.auth_test().data == fixture_json("web_api/auth.test.ok.json")
    mine = messages(sandbox_url, user="U0000000001")
    assert [(m["kind"], m["channel"], m["target"]) for m in mine] == [
        ("ephemeral", "C0000000001", "U0000000001"),
        ("dm", "D0000000001", "U0000000001"),
    ]
    assert messages(sandbox_url, contains="ready", kind="dm")[0]["text"] == "your GPUs are ready"


def test_form_bodies_query_strings_and_get_are_accepted(sandbox_url: str) -> None:
    auth = {"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}"}
    form = urllib.request.Request(
        f"{sandbox_url}/slack/api/chat.postMessage",
        data=b"channel=C0000000001&text=from+a+form",
        headers={**auth, "Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(form, timeout=5) as response:
        assert json.loads(response.read())["ok"] is True
    query = urllib.request.Request(f"{sandbox_url}/slack/api/users.info?user=U0000000002", headers=auth)
    with urllib.request.urlopen(query, timeout=5) as response:
        assert json.loads(response.read())["user"]["id"] == "U0000000002"
    token_in_form = urllib.request.Request(
        f"{sandbox_url}/slack/api/auth.test",
        data=f"token={DEFAULT_SLACK_TOKEN}".encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(token_in_form, timeout=5) as response:
        assert json.loads(response.read())["user_id"] == "U0000000009"


def test_errors_are_slacks(client: WebClient, sandbox_url: str) -> None:
    no_token = WebClient(base_url=f"{sandbox_url}/slack/api/")
    assert api_error(no_token.auth_test) == {"ok": False, "error": "not_authed"}
    bad_token = WebClient(token="xoxb-wrong", base_url=f"{sandbox_url}/slack/api/")
    assert api_error(bad_token.auth_test) == {"ok": False, "error": "invalid_auth"}
    assert api_error(lambda: client.chat_postMessage(channel="C0NOPE", text="x"))["error"] == "channel_not_found"
    assert api_error(lambda: client.api_call("chat.postMessage", json={"channel": "C0000000001"}))["error"] == "no_text"
    bad = api_error(lambda: client.chat_postMessage(channel="C0000000001", text="x", blocks=[{"type": "nope"}]))
    assert set(bad) == set(fixture_json("web_api/errors/invalid_blocks.json"))
    assert bad["errors"] == ["failed to match all allowed schemas [json-pointer:/blocks/0]"]
    assert bad["response_metadata"]["messages"] == ["[ERROR] " + e for e in bad["errors"]]
    long_text = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]
    too_long = api_error(lambda: client.chat_postMessage(channel="C0000000001", text="x", blocks=long_text))
    assert too_long["errors"] == ["must be less than 3001 characters [json-pointer:/blocks/0/text/text]"]
    many = [{"type": "divider"}] * 51
    assert api_error(lambda: client.chat_postMessage(channel="C0000000001", text="x", blocks=many))["error"] == (
        "invalid_blocks"
    )
    assert api_error(lambda: client.users_info(user="U0NOBODY"))["error"] == "user_not_found"
    assert api_error(lambda: client.chat_postEphemeral(channel="C0000000001", user="U0NOBODY", text="x"))["error"] == (
        "user_not_found"
    )
    assert api_error(lambda: client.usergroups_users_list(usergroup="S0NOPE"))["error"] == "no_such_subteam"
    assert api_error(lambda: client.api_call("conversations.open", params={}))["error"] == "users_list_not_supplied"
    assert messages(sandbox_url) == []


def test_rate_limit_comes_from_fault_injection(client: WebClient, sandbox_url: str) -> None:
    status, _ = control(
        sandbox_url, "/_sandbox/faults", {"rate": 1.0, "statuses": [429], "paths": "chat\\.postMessage", "seed": 1}
    )
    assert status == 200
    with pytest.raises(SlackApiError) as info:
        client.chat_postMessage(channel="C0000000001", text="x")
    assert info.value.response.status_code == 429
    assert info.value.response.headers["Retry-After"] == "1"
    assert info.value.response.data == {"ok": False, "error": "ratelimited"}
    assert client.users_info(user="U0000000001")["ok"] is True


# -- views ---------------------------------------------------------------------------------------------------------


def test_views_open_trigger_rules(client: WebClient, sandbox: Sandbox, sandbox_url: str) -> None:
    assert api_error(lambda: client.views_open(trigger_id="not-a-trigger", view=modal()))["error"] == (
        "invalid_trigger_id"
    )
    _, minted = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})
    opened = client.views_open(trigger_id=minted["trigger_id"], view=modal()).data
    assert isinstance(opened, dict)
    assert not missing_keys(opened, fixture_json("web_api/views.open.ok.gpu_modal.json"))
    assert opened["view"]["id"] == "V0000000001" and opened["view"]["callback_id"] == "gpu_reserve_modal"
    again = api_error(lambda: client.views_open(trigger_id=minted["trigger_id"], view=modal()))
    assert again["error"] == "exchanged_trigger_id"
    _, late = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})
    sandbox.clock.advance(3.5)
    assert api_error(lambda: client.views_open(trigger_id=late["trigger_id"], view=modal()))["error"] == (
        "expired_trigger_id"
    )


def test_views_validation_and_update(client: WebClient, sandbox_url: str) -> None:
    _, minted = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})
    trigger = minted["trigger_id"]
    bad_title = {**modal(), "title": {"type": "plain_text", "text": "x" * 25}}
    invalid = api_error(lambda: client.views_open(trigger_id=trigger, view=bad_title))
    assert invalid["error"] == "invalid_arguments"
    assert invalid["response_metadata"]["messages"] == [
        "[ERROR] must be less than 25 characters [json-pointer:/view/title/text]"
    ]
    huge = {
        **modal(),
        "private_metadata": "",
        "blocks": [{"type": "section", "text": {"type": "plain_text", "text": "x" * 3000}}] * 90,
    }
    assert api_error(lambda: client.views_open(trigger_id=trigger, view=huge))["error"] == "view_too_large"
    view = client.views_open(trigger_id=trigger, view=modal())["view"]
    updated = client.views_update(view_id=view["id"], hash=view["hash"], view={**modal(), "callback_id": "v2"}).data
    assert isinstance(updated, dict)
    assert not missing_keys(updated, fixture_json("web_api/views.update.ok.json"), ignore=("view.blocks",))
    assert updated["view"]["hash"] != view["hash"] and updated["view"]["callback_id"] == "v2"
    stale = api_error(lambda: client.views_update(view_id=view["id"], hash=view["hash"], view=modal()))
    assert stale == fixture_json("web_api/errors/hash_conflict.json")
    assert api_error(lambda: client.views_update(view_id="V0NOPE", view=modal()))["error"] == "not_found"


# -- simulated users ---------------------------------------------------------------------------------------------


def test_slash_command_is_signed_like_slack_and_the_ack_is_shown(app: tuple[SlackApp, str], sandbox_url: str) -> None:
    receiver, url = app
    receiver.answer = lambda req: Response(
        json.dumps({"response_type": "in_channel", "text": "request received"}), content_type="application/json"
    )
    status, result = control(
        sandbox_url,
        "/_sandbox/slack/commands",
        {"user": "U0000000001", "channel": "C0000000001", "command": "/gpu", "text": "request 8 H100", "url": url},
    )
    assert status == 200 and result["status"] == 200 and result["latency_ms"] >= 0
    (seen,) = receiver.requests
    assert seen["valid"] is True
    recorded = parse_qsl(fixture_bytes("inbound/slash_command.txt").decode())
    assert [k for k, _ in seen["fields"]] == [k for k, _ in recorded]
    fields = dict(seen["fields"])
    assert fields["text"] == "request 8 H100" and fields["user_id"] == "U0000000001"
    assert fields["trigger_id"] == result["trigger_id"] and fields["response_url"] == result["response_url"]
    recorded_headers = fixture_json("inbound/slash_command.headers.json")
    for name in ("User-Agent", "Content-Type", "X-Slack-Request-Timestamp", "X-Slack-Signature"):
        assert name in seen["headers"], name
    assert seen["headers"]["User-Agent"] == recorded_headers["User-Agent"]
    (ack,) = messages(sandbox_url, kind="ack")
    assert ack["text"] == "request received" and ack["response_type"] == "in_channel"


def test_response_url_rules(app: tuple[SlackApp, str], sandbox: Sandbox, sandbox_url: str) -> None:
    _, url = app
    _, result = control(sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "url": url})
    response_url = result["response_url"]
    assert post_raw(response_url, b"{not json")[:2] == (400, "invalid_payload")
    assert post_raw(response_url, b"{}")[:2] == (400, "no_text")
    body = json.dumps(fixture_json("response_url/in_channel.json")).encode()
    status, text, headers = post_raw(response_url, body)
    assert (status, text) == (200, fixture_bytes("response_url/slack_answer.ok.txt").decode())
    assert headers["Content-Type"].startswith("text/plain")
    replace = json.dumps(fixture_json("response_url/replace_original.with_blocks.json")).encode()
    assert post_raw(response_url, replace)[:2] == (200, "ok")
    (shown,) = messages(sandbox_url, kind="response")
    assert shown["response_type"] == "in_channel" and shown["text"].startswith("Reserved 2 x A100")
    assert [h["text"] for h in shown["history"]] == ["Oh hey, this is a fun message in a channel!"]
    for _ in range(3):
        assert post_raw(response_url, b'{"text": "again"}')[0] == 200
    assert post_raw(response_url, b'{"text": "sixth"}')[:2] == (404, "used_url")
    _, fresh = control(sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "url": url})
    sandbox.clock.advance(1801)
    assert post_raw(fresh["response_url"], b'{"text": "late"}')[:2] == (404, "expired_url")
    assert post_raw(f"{sandbox_url}/slack/response/unknown-token", b'{"text": "x"}')[:2] == (404, "no_service")


def test_block_actions_payload_matches_slacks_and_response_url_edits_the_message(
    app: tuple[SlackApp, str], client: WebClient, sandbox_url: str
) -> None:
    receiver, url = app
    ts = client.chat_postMessage(channel="C0000000001", text="gpu-node-01: 6 of 8 free", blocks=BUTTONS)["ts"]
    status, result = control(
        sandbox_url,
        "/_sandbox/slack/interactions",
        {
            "type": "block_actions",
            "user": "U0000000002",
            "url": url,
            "channel": "C0000000001",
            "message_ts": ts,
            "action_id": "gpu_reserve",
        },
    )
    assert status == 200 and result["status"] == 200
    (seen,) = receiver.requests
    assert seen["valid"] is True and [k for k, _ in seen["fields"]] == ["payload"]
    payload = seen["payload"]
    recorded = fixture_json("inbound/block_actions.json")
    assert list(payload) == list(recorded)
    assert key_paths(payload) == key_paths(recorded)
    assert payload["actions"][0]["value"] == "reserve:gpu-node-01" and payload["user"]["id"] == "U0000000002"
    assert payload["container"] == {
        "type": "message",
        "message_ts": ts,
        "channel_id": "C0000000001",
        "is_ephemeral": False,
    }
    response_url = payload["response_url"]
    replaced = {"replace_original": True, "text": "Reserved by <@U0000000002>"}
    assert post_raw(response_url, json.dumps(replaced).encode())[:2] == (200, "ok")
    (message,) = messages(sandbox_url, channel="C0000000001")
    assert message["text"] == "Reserved by <@U0000000002>" and message["edited"] is True
    assert post_raw(response_url, json.dumps(fixture_json("response_url/delete_original.json")).encode())[0] == 200
    assert messages(sandbox_url, channel="C0000000001")[0]["deleted"] is True
    status, missing = control(
        sandbox_url,
        "/_sandbox/slack/interactions",
        {"type": "block_actions", "url": url, "channel": "C0000000001", "message_ts": ts, "action_id": "nope"},
    )
    assert status == 400 and "errors" in missing


def test_modal_round_trip(app: tuple[SlackApp, str], sandbox_url: str) -> None:
    receiver, url = app
    opener = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)
    verdicts: list[Response] = [
        Response(
            json.dumps({"response_action": "errors", "errors": {"gpu_count_block": "at most 8"}}),
            content_type="application/json",
        ),
        Response(b"", status=200),
    ]

    def answer(req: dict[str, Any]) -> Response:
        if "payload" not in req:  # the slash command: open the modal inside the 3-second ack
            opener.views_open(trigger_id=dict(req["fields"])["trigger_id"], view=modal())
            return Response(b"", status=200)
        if req["payload"]["type"] == "view_submission":
            return verdicts.pop(0)
        return Response(b"", status=200)

    receiver.answer = answer
    _, command = control(
        sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "text": "request", "url": url}
    )
    assert command["status"] == 200
    _, listed = control(sandbox_url, "/_sandbox/slack/views")
    (view,) = listed["views"]
    assert view["user"] == "U0000000001" and view["status"] == "open"
    submit = {
        "type": "view_submission",
        "url": url,
        "view_id": view["id"],
        "values": {
            "gpu_type_block": {"gpu_type": "a100-80gb"},
            "gpu_count_block": {"gpu_count": "9"},
            "notify_channel_block": {"notify_channel": "C0000000001"},
        },
    }
    _, first = control(sandbox_url, "/_sandbox/slack/interactions", submit)
    assert first["outcome"] == "errors" and first["view"]["errors"] == {"gpu_count_block": "at most 8"}
    assert first["view"]["status"] == "open"
    payload = receiver.requests[-1]["payload"]
    recorded = fixture_json("inbound/view_submission.json")
    assert list(payload) == list(recorded)
    assert missing_keys(payload, recorded, ignore=("view.state.values.reason_block",)) == set()
    values = payload["view"]["state"]["values"]
    assert values["gpu_type_block"]["gpu_type"]["selected_option"]["value"] == "a100-80gb"
    assert values["gpu_count_block"]["gpu_count"] == {"type": "number_input", "value": "9"}
    assert payload["response_urls"][0]["channel_id"] == "C0000000001"
    submit["values"]["gpu_count_block"] = {"gpu_count": "2"}
    _, second = control(sandbox_url, "/_sandbox/slack/interactions", submit)
    assert second["outcome"] == "closed" and second["view"]["status"] == "closed"
    status, closed = control(sandbox_url, "/_sandbox/slack/interactions", submit)
    assert status == 400 and "closed" in closed["errors"][0]


def test_required_inputs_and_view_closed(app: tuple[SlackApp, str], client: WebClient, sandbox_url: str) -> None:
    receiver, url = app
    _, minted = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})
    view_id = client.views_open(trigger_id=minted["trigger_id"], view=modal())["view"]["id"]
    status, refused = control(
        sandbox_url,
        "/_sandbox/slack/interactions",
        {"type": "view_submission", "url": url, "view_id": view_id, "values": {}},
    )
    assert status == 400 and "gpu_type_block" in refused["errors"][0]
    assert receiver.requests == []
    _, closed = control(
        sandbox_url, "/_sandbox/slack/interactions", {"type": "view_closed", "url": url, "view_id": view_id}
    )
    assert closed["sent"] is True and closed["status"] == 200
    payload = receiver.requests[0]["payload"]
    assert list(payload) == list(fixture_json("inbound/view_closed.json"))
    assert payload["is_cleared"] is False


def test_control_plane_validates_input(app: tuple[SlackApp, str], sandbox_url: str) -> None:
    _, url = app
    status, body = control(sandbox_url, "/_sandbox/slack/commands", {"user": "U0NOBODY", "url": url})
    assert status == 400 and "unknown user" in body["errors"][0]
    status, body = control(
        sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "url": "file:///etc/passwd"}
    )
    assert status == 400
    status, body = control(sandbox_url, "/_sandbox/slack/commands", {"user": "not-a-user", "url": url})
    assert status == 400 and body["errors"]
    status, body = control(
        sandbox_url,
        "/_sandbox/slack/usergroups",
        {"usergroups": [{"id": "S0000000042", "handle": "ops", "users": ["U0GHOST"]}]},
    )
    assert status == 400 and "U0GHOST" in body["errors"][0]


def test_directory_seeding(client: WebClient, sandbox_url: str) -> None:
    status, _ = control(sandbox_url, "/_sandbox/slack/users", {"users": [{"id": "U0000000042", "name": "ops.lead"}]})
    assert status == 200
    status, _ = control(
        sandbox_url,
        "/_sandbox/slack/usergroups",
        {"usergroups": [{"id": "S0000000042", "handle": "gpu-operators", "users": ["U0000000042"]}]},
    )
    assert status == 200
    status, _ = control(
        sandbox_url, "/_sandbox/slack/channels", {"channels": [{"id": "C0000000042", "name": "gpu-ops-2"}]}
    )
    assert status == 200
    assert client.usergroups_users_list(usergroup="S0000000042")["users"] == ["U0000000042"]
    assert client.chat_postMessage(channel="#gpu-ops-2", text="hi")["channel"] == "C0000000042"
    assert client.users_info(user="U0000000042")["user"]["profile"]["display_name"] == "ops.lead"


def test_unreachable_app_is_reported_not_raised(sandbox_url: str) -> None:
    status, result = control(
        sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "url": "http://127.0.0.1:9/slack/events"}
    )
    assert status == 200 and result["status"] is None and result["error"].startswith("dispatch_failed")


def test_state_dump_never_shows_response_url_tokens(app: tuple[SlackApp, str], sandbox_url: str) -> None:
    _, url = app
    _, result = control(sandbox_url, "/_sandbox/slack/commands", {"user": "U0000000001", "url": url})
    token = result["response_url"].rsplit("/", 1)[-1]
    _, state = control(sandbox_url, "/_sandbox/state")
    assert token not in json.dumps(state)
    assert state["slack"]["response_urls"] == {"count": 1, "uses": 0}
    assert state["slack"]["deliveries"][0]["kind"] == "command"


def test_concurrent_posts_keep_unique_ordered_ts(client: WebClient, sandbox_url: str) -> None:
    def post(i: int) -> None:
        client.chat_postMessage(channel="C0000000001", text=f"m{i}")

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    logged = messages(sandbox_url, channel="C0000000001")
    assert len({m["ts"] for m in logged}) == 8
    assert [m["ts"] for m in logged] == sorted((m["ts"] for m in logged), key=lambda ts: int(ts.split(".")[1]))


def test_buttons_on_ephemeral_messages(app: tuple[SlackApp, str], client: WebClient, sandbox_url: str) -> None:
    receiver, url = app
    ts = client.chat_postEphemeral(channel="C0000000001", user="U0000000001", text="confirm?", blocks=BUTTONS)[
        "message_ts"
    ]
    assert api_error(lambda: client.chat_update(channel="C0000000001", ts=ts, text="x"))["error"] == (
        "message_not_found"
    )
    _, result = control(
        sandbox_url,
        "/_sandbox/slack/interactions",
        {
            "type": "block_actions",
            "user": "U0000000001",
            "url": url,
            "channel": "C0000000001",
            "message_ts": ts,
            "action_id": "gpu_release",
        },
    )
    assert result["status"] == 200
    payload = receiver.requests[0]["payload"]
    assert payload["container"]["is_ephemeral"] is True and payload["actions"][0]["style"] == "danger"
    assert post_raw(result["response_url"], b'{"replace_original": true, "text": "released"}')[0] == 200
    (shown,) = messages(sandbox_url, kind="ephemeral")
    assert shown["text"] == "released" and shown["history"][0]["text"] == "confirm?"


def test_view_errors_must_name_input_blocks(app: tuple[SlackApp, str], client: WebClient, sandbox_url: str) -> None:
    receiver, url = app
    receiver.answer = lambda req: Response(
        json.dumps({"response_action": "errors", "errors": {"not_an_input": "bad"}}), content_type="application/json"
    )
    _, minted = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})
    view_id = client.views_open(trigger_id=minted["trigger_id"], view=modal())["view"]["id"]
    values = {"gpu_type_block": {"gpu_type": "l4-24gb"}, "gpu_count_block": {"gpu_count": "1"}}
    _, result = control(
        sandbox_url,
        "/_sandbox/slack/interactions",
        {"type": "view_submission", "url": url, "view_id": view_id, "values": values},
    )
    assert result["outcome"] == "failed" and result["view"]["status"] == "open" and result["view"]["errors"] == {}
