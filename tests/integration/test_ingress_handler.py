"""The Slack ingress with the sample events: signatures, acks, the modal, hand-offs, and every kind of bad input.

In-process (the Lambda entry point called with events/*.json); Slack and the hand-off are recorded fakes, the
verifier's clock is frozen at the events' timestamp. The end-to-end path through the sandbox and the local
function host is in test_lifecycle_*.py.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, unquote_plus

import pytest
from test_ingress_events import (
    TEST_SIGNING_SECRET,
    TEST_TIMESTAMP,
    TRIGGER_ID,
    app_home_opened,
    command_body,
    load_event,
    payload_body,
    sign,
    slack_event,
    slack_json_event,
)

from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.handlers import runtime

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "functions" / "slack_ingress"))
import slack_ingress  # noqa: E402 - the Lambda entry point, imported as Lambda does


class FrozenClock:
    def __init__(self, epoch: float = TEST_TIMESTAMP) -> None:
        self.value = epoch

    def epoch(self) -> float:
        return self.value

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.value, UTC)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def invoke(self, function: str, payload: dict[str, Any]) -> None:
        if self.fail:
            raise UpstreamError("Lambda invoke of SlackWorkerFunction failed: TooManyRequestsException")
        self.calls.append((function, payload))


class ModalChat:
    def __init__(self, fail: bool = False) -> None:
        self.views: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def open_view(self, trigger_id: str, view: dict[str, Any]) -> str:
        if self.fail:
            raise UpstreamError("slack views.open failed: expired_trigger_id")
        self.views.append((trigger_id, view))
        return "V0000000001"


@pytest.fixture
def ingress(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Recorder, ModalChat, FrozenClock]]:
    for name in list(os.environ):
        if name.startswith(("GPUFARM_", "DD_", "SLACK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUFARM_SLACK_SIGNING_SECRET", TEST_SIGNING_SECRET)
    monkeypatch.setenv("GPUFARM_SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("GPUFARM_WORKER_FUNCTION", "SlackWorkerFunction")
    monkeypatch.setenv("GPUFARM_FARM_CONFIG", str(ROOT / "config" / "farm.example.yaml"))
    invoker, chat, clock = Recorder(), ModalChat(), FrozenClock()
    runtime.reset()
    runtime.override(invoker=invoker, ingress_chat=chat, clock=clock)
    yield invoker, chat, clock
    runtime.reset()


def call(event: dict[str, Any]) -> tuple[int, Any]:
    answer = slack_ingress.handler(event, None)
    body = answer["body"]
    return answer["statusCode"], (json.loads(body) if body else None)


# -- signatures ---------------------------------------------------------------------------------------------------


def test_ssl_check_is_answered_before_any_signature_check(ingress: Any) -> None:
    assert call(load_event("slack_ssl_check.json")) == (200, None)


def test_forged_signature_is_401_and_nothing_happens(ingress: Any) -> None:
    invoker, _, _ = ingress
    status, body = call(load_event("slack_command_forged_signature.json"))
    assert status == 401 and body == {"error": "invalid signature"}
    assert invoker.calls == []


def test_stale_signature_is_401(ingress: Any) -> None:
    invoker, _, clock = ingress
    clock.value = TEST_TIMESTAMP + 301
    assert call(load_event("slack_command_release.json"))[0] == 401
    clock.value = TEST_TIMESTAMP + 299
    assert call(load_event("slack_command_release.json"))[0] == 200
    assert len(invoker.calls) == 1


def test_missing_signature_headers_and_tampered_body_are_401(ingress: Any) -> None:
    event = load_event("slack_command_release.json")
    unsigned = copy.deepcopy(event)
    del unsigned["headers"]["x-slack-signature"]
    assert call(unsigned)[0] == 401
    tampered = copy.deepcopy(event)
    tampered["body"] = tampered["body"].replace("IR-1", "IR-2")
    assert call(tampered)[0] == 401


def test_header_names_are_case_insensitive(ingress: Any) -> None:
    event = load_event("slack_command_status.json")
    event["headers"] = {k.title(): v for k, v in event["headers"].items()}
    assert call(event)[0] == 200


# -- slash commands -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["slack_command_request_inline.json", "slack_command_request_inline_base64.json"])
def test_inline_request_is_validated_acked_and_handed_off(ingress: Any, name: str) -> None:
    invoker, _, _ = ingress
    status, body = call(load_event(name))
    assert status == 200
    assert body["response_type"] == "ephemeral"
    assert "Requesting 8x H100 in onprem-hpc for nlp/llm-ko" in body["text"]
    [(function, job)] = invoker.calls
    assert function == "SlackWorkerFunction"
    assert job["kind"] == "request" and job["user"] == "U0000000001" and job["response_url"].startswith("https://")
    request = job["request"]
    assert (request["gpu_count"], request["gpu_model"], request["environment"], request["duration_days"]) == (
        8,
        "H100",
        "onprem-hpc",
        14,
    )
    assert request["request_id"].startswith("slack-cmd-") and request["purpose"] == "fine-tune the Korean LLM"


def test_the_same_trigger_gives_the_same_request_id(ingress: Any) -> None:
    invoker, _, _ = ingress
    call(load_event("slack_command_request_inline.json"))
    call(load_event("slack_command_request_inline_base64.json"))
    ids = {job["request"]["request_id"] for _, job in invoker.calls}
    assert len(ids) == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("request 0 H100 project=llm-ko team=nlp env=onprem-hpc", "at least 1"),
        ("request -4 H100 project=llm-ko team=nlp env=onprem-hpc", "at least 1"),
        ("request 99999 H100 project=llm-ko team=nlp env=onprem-hpc", "at most"),
        ("request many H100 project=llm-ko team=nlp env=onprem-hpc", "whole number"),
        ("request 2 V100 project=llm-ko team=nlp env=onprem-hpc", "unknown GPU model"),
        ("request 2 H100 project=llm-ko team=nlp env=mars", "unknown environment"),
        ("request 2 L4 project=llm-ko team=nlp env=onprem-hpc", "offers no L4"),
        ('request 2 H100 project="llm ko" team=nlp env=onprem-hpc', "project"),
        ("request 2 H100 project=llm,ko team=nlp env=onprem-hpc", "project"),
        ("request 2 H100 project=llm-ko team=marketing env=onprem-hpc", "unknown team"),
        ("request 2 H100 project=llm-ko team=nlp env=onprem-hpc days=90", "at most 30 days"),
        ("request 2 H100 colour=red", "unknown option"),
        ("status IR-abc", "not an incident number"),
        ("extend IR-1 zero", "whole number"),
        # isdigit() is true for these; int() is not: each must be an answer, never an exception.
        ("request ² H100 project=llm-ko team=nlp env=onprem-hpc", "whole number"),
        ("request ² project=llm-ko team=nlp env=onprem-hpc", "say how many GPUs"),
        ("request ⁵ H100 project=llm-ko team=nlp env=onprem-hpc", "whole number"),
        ("request 2 H100 project=llm-ko team=nlp env=onprem-hpc days=⁵", "whole number"),
        ("request 2 H100 project=llm-ko team=nlp env=onprem-hpc days=" + "9" * 1900, "more than 9 digits"),
        ("extend IR-1 ²", "whole number"),
        ("extend IR-² 2", "not an incident number"),
        ("status IR-١٢", "not an incident number"),
    ],
)
def test_bad_command_input_is_an_ephemeral_error_and_nothing_is_handed_off(ingress: Any, text: str, says: str) -> None:
    invoker, _, _ = ingress
    status, body = call(slack_event(command_body(text)))
    assert status == 200
    assert body["response_type"] == "ephemeral"
    assert says in body["text"]
    assert invoker.calls == []


@pytest.mark.parametrize("length", [2_001, 4_001, 100_000])
def test_a_command_of_any_length_past_its_bound_gets_the_same_ephemeral_answer(ingress: Any, length: int) -> None:
    invoker, _, _ = ingress
    status, body = call(slack_event(command_body("status IR-1 " + "x" * (length - 12))))
    assert (status, body["response_type"]) == (200, "ephemeral")
    assert "longer than 2000 characters" in body["text"]
    assert invoker.calls == []


def test_control_characters_in_a_project_are_refused(ingress: Any) -> None:
    invoker, _, _ = ingress
    status, body = call(slack_event(command_body("request 2 H100 project=llm\x07ko team=nlp env=onprem-hpc")))
    assert status == 200 and "project" in body["text"] and "\x07" not in body["text"]
    assert invoker.calls == []


def test_help_and_unknown_subcommands_answer_help_ephemerally(ingress: Any) -> None:
    invoker, _, _ = ingress
    status, body = call(load_event("slack_command_help.json"))
    assert status == 200 and body["response_type"] == "ephemeral" and "/gpu request" in body["text"]
    status, body = call(load_event("slack_command_unknown.json"))
    assert body["response_type"] == "ephemeral" and "I don't know `/gpu reserve`" in body["text"]
    assert invoker.calls == []


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("slack_command_list.json", {"verb": "list", "scope": "mine"}),
        ("slack_command_status.json", {"verb": "status", "ir": 1}),
        ("slack_command_release.json", {"verb": "release", "ir": 1}),
        ("slack_command_extend.json", {"verb": "extend", "ir": 1, "days": 7}),
        ("slack_command_quota.json", {"verb": "quota", "team": "nlp"}),
    ],
)
def test_other_commands_are_handed_to_the_worker(ingress: Any, name: str, command: dict[str, Any]) -> None:
    invoker, _, _ = ingress
    status, body = call(load_event(name))
    assert status == 200 and body["response_type"] == "ephemeral"
    [(_, job)] = invoker.calls
    assert job["kind"] == "command" and job["command"] == command


def test_bare_request_opens_the_modal_inside_the_ingress(ingress: Any) -> None:
    invoker, chat, _ = ingress
    assert call(load_event("slack_command_request_modal.json")) == (200, None)
    [(trigger, view)] = chat.views
    assert trigger == "1111111111111.0000000001.0123456789abcdef0123456789abcdef"
    assert view["callback_id"] == "gpu_request"
    assert [b["block_id"] for b in view["blocks"]] == [
        "gpu_model",
        "gpu_count",
        "environment",
        "team",
        "project",
        "duration_days",
        "idle_window",
        "idle_grace",
        "purpose",
    ]
    assert json.loads(view["private_metadata"]) == {"channel": "C0000000002"}
    assert invoker.calls == []


def test_modal_failure_falls_back_to_the_inline_form(ingress: Any) -> None:
    runtime.override(ingress_chat=ModalChat(fail=True))
    status, body = call(load_event("slack_command_request_modal.json"))
    assert status == 200 and "inline form" in body["text"]


def test_hand_off_failure_says_nothing_was_changed(ingress: Any) -> None:
    runtime.override(invoker=Recorder(fail=True))
    status, body = call(load_event("slack_command_release.json"))
    assert status == 200 and "nothing was changed" in body["text"]


def test_every_hand_off_failure_changes_nothing_and_says_so_where_slack_shows_it(ingress: Any) -> None:
    runtime.override(invoker=Recorder(fail=True))
    # A click's failure can only be the status (Slack shows no body for block_actions).
    status, body = call(load_event("slack_block_actions_release.json"))
    assert status == 503 and "nothing was changed" in body["error"]
    # A modal's failure lands under one of its fields, so the form stays open with what was typed.
    status, body = call(load_event("slack_view_submission.json"))
    assert (status, body) == (
        200,
        {"response_action": "errors", "errors": {"project": "gpufarm is unavailable; try again"}},
    )
    status, body = call(
        slack_event(payload_body(reason_submission('{"action": "gpu_reject", "ir": 1}', "over budget")))
    )
    assert (status, body) == (
        200,
        {"response_action": "errors", "errors": {"reason": "gpufarm is unavailable; try again"}},
    )


def test_another_slash_command_is_not_ours(ingress: Any) -> None:
    body = command_body("help").replace("command=%2Fgpu", "command=%2Fdeploy")
    status, answer = call(slack_event(body))
    assert status == 200 and "only answers /gpu" in answer["text"]


# -- interactivity ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "action", "user"),
    [
        ("slack_block_actions_approve.json", "gpu_approve", "U0000000002"),
        ("slack_block_actions_release.json", "gpu_release", "U0000000001"),
        ("slack_block_actions_extend.json", "gpu_extend", "U0000000001"),
    ],
)
def test_button_clicks_are_acked_empty_and_handed_off(ingress: Any, name: str, action: str, user: str) -> None:
    invoker, _, _ = ingress
    assert call(load_event(name)) == (200, None)
    [(_, job)] = invoker.calls
    assert (job["kind"], job["action"], job["ir"], job["user"]) == ("action", action, 1, user)
    assert job["channel"] == "C0000000001" and job["message_ts"] == "1700000000.000100"


OPERATOR = {"id": "U0000000002", "username": "gpu.operator", "name": "gpu.operator", "team_id": "T0000000001"}


def reason_submission(metadata: str, reason: str) -> dict[str, Any]:
    """The operator's submission of the reason form whose private_metadata is `metadata`."""
    return {
        "type": "view_submission",
        "user": OPERATOR,
        "view": {
            "id": "V0000000009",
            "callback_id": "gpu_reason",
            "private_metadata": metadata,
            "state": {"values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}},
        },
    }


def test_reject_opens_the_reason_form_and_its_submission_is_handed_off(ingress: Any) -> None:
    invoker, chat, _ = ingress
    assert call(load_event("slack_block_actions_reject.json")) == (200, None)
    assert invoker.calls == []  # nothing acts on the click itself
    [(trigger, view)] = chat.views
    assert trigger == TRIGGER_ID and view["callback_id"] == "gpu_reason"
    assert json.loads(view["private_metadata"]) == {"action": "gpu_reject", "ir": 1}
    assert call(slack_event(payload_body(reason_submission(view["private_metadata"], "over\nbudget")))) == (200, None)
    [(_, job)] = invoker.calls
    assert (job["kind"], job["action"], job["ir"], job["user"]) == ("action", "gpu_reject", 1, "U0000000002")
    assert job["reason"] == "over budget" and "response_url" not in job
    status, body = call(slack_event(payload_body(reason_submission(view["private_metadata"], "  "))))
    assert status == 200 and body == {"response_action": "errors", "errors": {"reason": "say why"}}
    assert len(invoker.calls) == 1


def test_a_forged_reason_form_changes_nothing(ingress: Any) -> None:
    invoker, _, _ = ingress
    forged = reason_submission('{"action": "gpu_approve", "ir": 1}', "x")
    status, body = call(slack_event(payload_body(forged)))
    assert status == 200 and list(body["errors"]) == ["reason"]
    assert invoker.calls == []


def test_view_submission_is_validated_and_handed_off(ingress: Any) -> None:
    invoker, _, _ = ingress
    assert call(load_event("slack_view_submission.json")) == (200, None)
    [(_, job)] = invoker.calls
    assert job["kind"] == "request" and "response_url" not in job
    assert job["request"]["request_id"].startswith("slack-view-")
    assert job["request"]["channel"] == "C0000000002"


def test_invalid_view_submission_names_the_block(ingress: Any) -> None:
    invoker, _, _ = ingress
    status, body = call(load_event("slack_view_submission_invalid.json"))
    assert status == 200
    assert body["response_action"] == "errors"
    assert list(body["errors"]) == ["project"]
    assert invoker.calls == []


def test_view_submission_count_errors_land_on_the_count_block(ingress: Any) -> None:
    payload = json.loads(unquote_plus(load_event("slack_view_submission.json")["body"].removeprefix("payload=")))
    payload["view"]["state"]["values"]["gpu_count"]["gpu_count"]["value"] = "0"
    status, body = call(slack_event(payload_body(payload)))
    assert status == 200 and list(body["errors"]) == ["gpu_count"]


@pytest.mark.parametrize("value", ["⁵", "9" * 5000])
def test_view_submission_with_unicode_or_endless_digits_names_the_block(ingress: Any, value: str) -> None:
    invoker, _, _ = ingress
    payload = json.loads(unquote_plus(load_event("slack_view_submission.json")["body"].removeprefix("payload=")))
    payload["view"]["state"]["values"]["gpu_count"]["gpu_count"]["value"] = value
    payload["view"]["state"]["values"]["duration_days"]["duration_days"]["value"] = value
    status, body = call(slack_event(payload_body(payload)))
    assert status == 200 and body["response_action"] == "errors"
    assert invoker.calls == []


@pytest.mark.parametrize("depth", [33, 3000, 20_000])
def test_deeply_nested_payloads_are_400_not_a_crash(ingress: Any, depth: int) -> None:
    invoker, _, _ = ingress
    nested = {"type": "block_actions", "user": {"id": "U0000000001"}, "actions": [{"action_id": "x"}]}
    payload = json.dumps(nested)[:-1] + ',"deep":' + "[" * depth + "]" * depth + "}"
    status, body = call(slack_event("payload=" + quote_plus(payload)))
    assert status == 400 and "nested deeper" in body["error"]
    metadata = json.loads(unquote_plus(load_event("slack_view_submission.json")["body"].removeprefix("payload=")))
    metadata["view"]["private_metadata"] = "[" * 1400 + "]" * 1400
    assert call(slack_event(payload_body(metadata)))[0] == 200
    assert len(invoker.calls) == 1


def test_view_closed_is_acknowledged(ingress: Any) -> None:
    invoker, _, _ = ingress
    assert call(load_event("slack_view_closed.json")) == (200, None)
    assert invoker.calls == []


def test_unknown_button_is_ignored(ingress: Any) -> None:
    invoker, _, _ = ingress
    payload = {
        "type": "block_actions",
        "user": {"id": "U0000000001"},
        "actions": [{"action_id": "other", "value": "x"}],
    }
    assert call(slack_event(payload_body(payload))) == (200, None)
    assert invoker.calls == []


# -- malformed bodies -------------------------------------------------------------------------------------------------


def _signed(body: str) -> dict[str, Any]:
    return slack_event(body)


@pytest.mark.parametrize(
    "body",
    [
        "payload=%7Bnot+json",
        "payload=%5B1%2C2%5D",
        "payload=" + json.dumps({"type": "block_actions", "actions": []}),
        "payload=" + json.dumps({"type": "block_actions", "user": {"id": "bob"}, "actions": [{"action_id": "a"}]}),
        "payload=" + json.dumps({"type": "shortcut", "user": {"id": "U0000000001"}}),
        "payload="
        + json.dumps(
            {
                "type": "block_actions",
                "user": {"id": "U0000000001"},
                "actions": [{"action_id": "gpu_release", "value": "not-an-ir"}],
            }
        ),
        "payload=" + json.dumps({"type": "view_submission", "user": {"id": "U0000000001"}, "view": {"id": "V1"}}),
        "command=%2Fgpu&text=help",
        "text=hello",
        "a=1&&&b",
    ],
)
def test_malformed_but_signed_bodies_are_400(ingress: Any, body: str) -> None:
    invoker, _, _ = ingress
    status, answer = call(_signed(body))
    assert status == 400 and "error" in answer
    assert invoker.calls == []


def test_not_a_url_event_wrong_method_bad_base64_and_huge_bodies(ingress: Any) -> None:
    assert call({"hello": "world"})[0] == 400
    event = load_event("slack_command_help.json")
    event["requestContext"]["http"]["method"] = "GET"
    assert call(event)[0] == 405
    event = load_event("slack_command_help.json")
    event["isBase64Encoded"] = True
    event["body"] = "***"
    assert call(event)[0] == 400
    huge = "text=" + "x" * 300_000
    assert call(slack_event(huge))[0] == 413
    raw = base64.b64encode(b"\xff\xfe").decode()
    event = slack_event("x")
    event.update(body=raw, isBase64Encoded=True)
    event["headers"]["x-slack-signature"] = sign(b"\xff\xfe")
    assert call(event)[0] == 400


def test_missing_signing_secret_is_a_500_without_details(ingress: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFARM_SLACK_SIGNING_SECRET")
    status, body = call(load_event("slack_command_help.json"))
    assert status == 500 and body == {"error": "gpufarm is not configured"}


def test_the_slack_app_manifest_points_both_endpoints_at_the_ingress() -> None:
    import yaml

    manifest = yaml.safe_load((ROOT / "slack" / "manifest.yaml").read_text())
    [command] = manifest["features"]["slash_commands"]
    assert command["command"] == slack_ingress_module_command()
    assert command["url"] == manifest["settings"]["interactivity"]["request_url"]
    assert command["should_escape"] is False  # the ingress parses the raw text
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    assert manifest["settings"]["socket_mode_enabled"] is False
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == {
        "commands",
        "chat:write",
        "im:write",
        "users:read",
        "usergroups:read",
        "files:write",  # /gpu report shares its CSV in the asker's DM
        "channels:read",  # gpufarm doctor: is the bot in the operators' channel
    }
    assert manifest["features"]["bot_user"]["display_name"]


def slack_ingress_module_command() -> str:
    from gpufarm.handlers.slack_ingress import SLASH_COMMAND

    return SLASH_COMMAND


# -- Slack's retries --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("event_name", ["slack_command_request_inline.json", "slack_view_submission.json"])
def test_a_retry_maps_to_the_original_request_and_asks_for_no_more(ingress: Any, event_name: str) -> None:
    invoker, _, _ = ingress
    first = slack_ingress.handler(load_event(event_name), None)
    retried = load_event(event_name)
    retried["headers"].update({"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})
    again = slack_ingress.handler(retried, None)
    assert first["statusCode"] == again["statusCode"] == 200
    assert "X-Slack-No-Retry" not in first["headers"] and again["headers"]["X-Slack-No-Retry"] == "1"
    ids = {job["request"]["request_id"] for _, job in invoker.calls}
    assert len(invoker.calls) == 2 and len(ids) == 1


@pytest.mark.parametrize("num", ["²", "9" * 5000, "", "-1"])
def test_a_garbled_retry_header_is_still_an_answer(ingress: Any, num: str) -> None:
    event = load_event("slack_command_request_inline.json")
    event["headers"].update({"X-Slack-Retry-Num": num, "X-Slack-Retry-Reason": "\x00" * 100})
    assert slack_ingress.handler(event, None)["statusCode"] == 200


# -- the Events API (app_home_opened) -----------------------------------------------------------------------------


def test_app_home_opened_is_acked_and_handed_to_the_worker(ingress: Any) -> None:
    invoker, _, _ = ingress
    assert call(load_event("slack_event_app_home_opened.json")) == (200, None)
    assert invoker.calls == [("SlackWorkerFunction", {"kind": "home", "user": "U0000000001"})]


def test_the_events_url_handshake_answers_its_challenge(ingress: Any) -> None:
    invoker, _, _ = ingress
    status, body = call(
        slack_json_event({"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV", "type": "url_verification"})
    )
    assert (status, body) == (200, {"challenge": "3eZbrw1aBm2rZgRNFdxV"})
    assert invoker.calls == []


def test_the_messages_tab_and_other_events_are_acked_and_change_nothing(ingress: Any) -> None:
    invoker, _, _ = ingress
    assert call(slack_json_event(app_home_opened(tab="messages"))) == (200, None)
    other = {**app_home_opened(), "event": {"type": "member_joined_channel", "user": "U0000000001"}}
    assert call(slack_json_event(other)) == (200, None)
    assert invoker.calls == []


def test_a_forged_or_malformed_event_is_refused_and_nothing_is_handed_off(ingress: Any) -> None:
    invoker, _, _ = ingress
    forged = slack_json_event(app_home_opened(), signature="v0=" + "0" * 64)
    assert call(forged) == (401, {"error": "invalid signature"})
    bad_user = {**app_home_opened(), "event": {"type": "app_home_opened", "user": "<!channel>", "tab": "home"}}
    assert call(slack_json_event(bad_user))[0] == 400
    assert call(slack_json_event({"type": "block_suggestion"}))[0] == 400
    assert call(slack_json_event({"type": "url_verification", "challenge": "x" * 500}))[0] == 400
    raw = slack_json_event(app_home_opened())
    raw["body"] = raw["body"][:-5]  # cut JSON: its signature no longer matches either
    assert call(raw)[0] == 401
    assert invoker.calls == []


def test_a_failed_hand_off_of_the_home_is_503(ingress: Any) -> None:
    invoker, _, _ = ingress
    invoker.fail = True
    assert call(load_event("slack_event_app_home_opened.json")) == (503, {"error": "gpufarm is unavailable"})
