"""SlackChat (core.kernel.ports.Chat over slack_sdk) against the Slack sandbox; SignatureCheck against Slack's
vectors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.wrappers import Response

from gpufarm.adapters.slack import SignatureCheck, SlackChat, SlackError
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import Chat
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN, Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = pytest.mark.contract

INBOUND = Path(__file__).resolve().parent.parent / "fixtures" / "slack" / "inbound"


class Ticker:
    """A monotonic clock the test moves by hand (for the usergroup cache)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticker() -> Ticker:
    return Ticker()


@pytest.fixture
def chat(sandbox_url: str, ticker: Ticker) -> SlackChat:
    return SlackChat(DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5, monotonic=ticker)


@pytest.fixture(scope="module")
def ack_app() -> Iterator[str]:
    """An app that acks everything with an empty 200 (only its response_urls matter here)."""
    with ServerThread(Response(b"")) as server:
        yield f"{server.url}/slack/events"


def control(base: str, path: str, body: Any) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=15) as response:
        return json.loads(response.read())


def messages(base: str, query: str = "") -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/_sandbox/slack/messages?{query}", timeout=5) as response:
        return list(json.loads(response.read())["messages"])


def response_url(base: str, app: str) -> str:
    return str(control(base, "/_sandbox/slack/commands", {"user": "U0000000001", "url": app})["response_url"])


def faults(base: str, **spec: Any) -> None:
    control(base, "/_sandbox/faults", spec)


def test_slackchat_is_a_chat_port(chat: SlackChat) -> None:
    port: Chat = chat
    assert port is chat


def test_messages_dms_and_ephemerals(chat: SlackChat, sandbox_url: str) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*IR-7* approved"}}]
    ts = chat.post_message("C0000000001", "IR-7 approved", blocks)
    chat.update_message("C0000000001", ts, "IR-7 allocated")
    reply = chat.post_message("C0000000001", "details", thread_ts=ts)
    chat.post_ephemeral("C0000000001", "U0000000001", "only you see this")
    dm_ts = chat.tell_user("U0000000001", "your GPUs are ready")
    logged = messages(sandbox_url)
    assert [(m["kind"], m["text"]) for m in logged] == [
        ("message", "IR-7 allocated"),
        ("message", "details"),
        ("ephemeral", "only you see this"),
        ("dm", "your GPUs are ready"),
    ]
    assert logged[0]["history"][0]["text"] == "IR-7 approved" and logged[1]["thread_ts"] == ts
    assert logged[3]["ts"] == dm_ts and logged[3]["target"] == "U0000000001"
    assert reply != ts
    assert chat.open_dm("U0000000001") == "D0000000001"


def test_views(chat: SlackChat, sandbox_url: str) -> None:
    trigger = control(sandbox_url, "/_sandbox/slack/triggers", {"user": "U0000000001"})["trigger_id"]
    view = {"type": "modal", "title": {"type": "plain_text", "text": "Request GPUs"}, "blocks": []}
    view_id = chat.open_view(trigger, view)
    assert view_id.startswith("V")
    chat.update_view(view_id, {**view, "callback_id": "second"})
    with pytest.raises(SlackError) as info:
        chat.open_view(trigger, view)
    assert info.value.code == "exchanged_trigger_id" and info.value.method == "views.open"
    with pytest.raises(SlackError) as info:
        chat.update_view(view_id, view, hash="1.stale")
    assert info.value.code == "hash_conflict"


def test_user_names_fall_back_to_the_id(chat: SlackChat, sandbox_url: str) -> None:
    control(
        sandbox_url, "/_sandbox/slack/users", {"users": [{"id": "U0000000042", "name": "r.lee", "display_name": ""}]}
    )
    assert chat.user_name("U0000000001") == "fake.user"
    assert chat.user_name("U0000000042") == "r.lee"  # empty display name: the real name, which defaults to name
    assert chat.user_name("U0NOBODY") == "U0NOBODY"


def test_usergroup_members_are_cached_for_a_minute(chat: SlackChat, sandbox_url: str, ticker: Ticker) -> None:
    assert chat.usergroup_members("S0000000001") == frozenset({"U0000000002"})
    control(
        sandbox_url,
        "/_sandbox/slack/usergroups",
        {"usergroups": [{"id": "S0000000001", "handle": "gpu-operators", "users": ["U0000000001"]}]},
    )
    ticker.now += 59
    assert chat.usergroup_members("S0000000001") == frozenset({"U0000000002"})
    ticker.now += 2
    assert chat.usergroup_members("S0000000001") == frozenset({"U0000000001"})
    with pytest.raises(SlackError) as info:
        chat.usergroup_members("S0NOPE")
    assert info.value.code == "no_such_subteam"


def test_rate_limit_is_retried_after_retry_after(chat: SlackChat, sandbox: Sandbox, sandbox_url: str) -> None:
    faults(sandbox_url, rate=1.0, statuses=[429], paths=r"chat\.postMessage", seed=1, max_faults=1)
    started = time.monotonic()
    chat.post_message("C0000000001", "after one 429")
    assert time.monotonic() - started >= 1.0  # the sandbox says Retry-After: 1
    assert sandbox.faults.injected == 1
    assert [m["text"] for m in messages(sandbox_url)] == ["after one 429"]


def test_rate_limit_beyond_the_budget_raises(sandbox: Sandbox, sandbox_url: str) -> None:
    # A caller that cannot wait (the ingress) sets max_retry_wait below Retry-After: it fails fast instead.
    impatient = SlackChat(DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5, max_retry_wait=0.5)
    faults(sandbox_url, rate=1.0, statuses=[429], paths=r"chat\.postMessage", seed=1)
    started = time.monotonic()
    with pytest.raises(SlackError) as info:
        impatient.post_message("C0000000001", "never")
    assert time.monotonic() - started < 1.0
    assert (info.value.code, info.value.status) == ("ratelimited", 429)
    assert isinstance(info.value, UpstreamError)


def test_a_retry_past_the_invocations_time_budget_is_not_waited_for(
    chat: SlackChat, sandbox: Sandbox, sandbox_url: str
) -> None:
    from gpufarm.adapters import time_budget

    faults(sandbox_url, rate=1.0, statuses=[429], paths=r"chat\.postMessage", seed=1, max_faults=1)
    started = time.monotonic()
    # 2 s left of the invocation: a Retry-After of 1 s and the retried call would not fit what the work may spend.
    with time_budget.invocation(2.0), pytest.raises(SlackError) as info:
        chat.post_message("C0000000001", "not now")
    assert time.monotonic() - started < 1.0
    assert (info.value.code, info.value.status) == ("ratelimited", 429)
    chat.post_message("C0000000001", "later")  # outside the invocation the next call goes through
    assert [m["text"] for m in messages(sandbox_url)] == ["later"]


def test_server_errors_are_retried(chat: SlackChat, sandbox: Sandbox, sandbox_url: str) -> None:
    faults(sandbox_url, rate=1.0, statuses=[503], paths=r"users\.info", seed=1, max_faults=1)
    assert chat.user_name("U0000000001") == "fake.user"
    assert sandbox.faults.injected == 1


def test_bad_token_is_an_upstream_error_without_the_token(sandbox_url: str) -> None:
    wrong = SlackChat("xoxb-do-not-leak-me", base_url=f"{sandbox_url}/slack/api/", timeout=5)
    with pytest.raises(SlackError) as info:
        wrong.post_message("C0000000001", "x")
    assert info.value.code == "invalid_auth"
    assert "do-not-leak" not in str(info.value) and "do-not-leak" not in repr(info.value.args)


def test_unreachable_slack_is_an_upstream_error() -> None:
    down = SlackChat(DEFAULT_SLACK_TOKEN, base_url="http://127.0.0.1:9/api/", timeout=1)
    with pytest.raises(SlackError) as info:
        down.auth_test()
    assert info.value.code.startswith("connection_error")


def test_respond_through_response_url_and_its_use_limit(chat: SlackChat, sandbox_url: str, ack_app: str) -> None:
    url = response_url(sandbox_url, ack_app)
    chat.respond(url, "working on it")
    chat.respond(url, "IR-7 created", replace_original=True)
    chat.respond(url, "posted for everyone", in_channel=True)
    chat.respond(url, "fourth")
    chat.delete_original(url)
    with pytest.raises(SlackError) as info:
        chat.respond(url, "sixth")
    assert (info.value.code, info.value.status) == ("used_url", 404)
    shown = messages(sandbox_url, "kind=response")
    assert [(m["text"], m["response_type"], m["deleted"]) for m in shown] == [
        ("IR-7 created", "ephemeral", False),
        ("posted for everyone", "in_channel", False),
        ("fourth", "ephemeral", True),
    ]
    assert shown[0]["history"][0]["text"] == "working on it"


def test_respond_retries_rate_limits(chat: SlackChat, sandbox: Sandbox, sandbox_url: str, ack_app: str) -> None:
    url = response_url(sandbox_url, ack_app)
    faults(sandbox_url, rate=1.0, statuses=[429], paths=r"^/slack/response/", seed=1, max_faults=1)
    chat.respond(url, "after a 429")
    assert sandbox.faults.injected == 1
    assert [m["text"] for m in messages(sandbox_url, "kind=response")] == ["after a 429"]
    with pytest.raises(SlackError) as info:
        chat.respond("ftp://example.invalid/x", "x")
    assert info.value.code == "invalid_response_url"


def test_from_settings(sandbox_url: str) -> None:
    settings = Settings(slack_bot_token=DEFAULT_SLACK_TOKEN, slack_api_url=f"{sandbox_url}/slack/api")
    chat = SlackChat.from_settings(settings, timeout=2)
    assert chat.auth_test()["user_id"] == "U0000000009"
    with pytest.raises(ValueError, match="SLACK_BOT_TOKEN"):
        SlackChat.from_settings(Settings(slack_bot_token=None))


# -- signatures ----------------------------------------------------------------------------------------------------


def test_signature_check_accepts_slacks_recorded_requests() -> None:
    vectors = json.loads((INBOUND / "signatures.json").read_text())
    check = SignatureCheck(vectors["signing_secret"], clock=lambda: 1_700_000_000)
    for name in ("slash_command.txt", "block_actions.body.txt", "view_submission.body.txt"):
        entry = vectors["files"][f"inbound/{name}"]
        headers = {"X-Slack-Request-Timestamp": entry["timestamp"], "X-Slack-Signature": entry["signature"]}
        assert check.verify((INBOUND / name).read_bytes(), headers), name
    recorded_headers = json.loads((INBOUND / "slash_command.headers.json").read_text())
    lower = {k.lower(): v for k, v in recorded_headers.items()}
    assert check.verify((INBOUND / "slash_command.txt").read_bytes(), lower)


def test_signature_check_on_slacks_published_vector() -> None:
    vector = json.loads((INBOUND / "signature_test_vector.slack_docs.json").read_text())
    keys = ("signing_secret", "x_slack_request_timestamp", "body", "x_slack_signature")
    secret, ts, body, signature = (vector[k] for k in keys)
    check = SignatureCheck(secret, clock=lambda: float(ts))
    assert check.verify(body, {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": signature})
    assert check.sign(body, ts)["X-Slack-Signature"] == signature


def test_signature_check_rejects_forged_stale_and_malformed() -> None:
    body = (INBOUND / "slash_command.txt").read_bytes()
    now = [1_700_000_000.0]
    check = SignatureCheck("fakesigningsecret000000000000000", clock=lambda: now[0])
    good = check.sign(body, 1_700_000_000)
    assert check.verify(body, good)
    assert not check.verify(body + b"&x=1", good)
    assert not check.verify(body, {**good, "X-Slack-Signature": "v0=" + "0" * 64})
    assert not check.verify(body, {"X-Slack-Signature": good["X-Slack-Signature"]})
    assert not check.verify(body, {**good, "X-Slack-Request-Timestamp": "17e8"})
    assert not check.verify(body, {**good, "X-Slack-Signature": "sha256=abc"})
    assert not SignatureCheck("another-secret", clock=lambda: now[0]).verify(body, good)
    now[0] += 301
    assert not check.verify(body, good)
    now[0] -= 2
    assert check.verify(body, good)
    with pytest.raises(ValueError, match="empty"):
        SignatureCheck("  ")


def test_adapter_imports_fast_and_without_datadog() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import gpufarm.adapters.slack; "
        "print(time.perf_counter() - t); print(any(m.startswith('datadog_api_client') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    seconds, datadog = out.stdout.split()
    assert datadog == "False"
    assert float(seconds) < 1.0
