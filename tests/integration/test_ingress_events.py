"""The sample events in events/ are built here, so they stay real-shaped and correctly signed.

`python tests/integration/test_ingress_events.py --write` regenerates them; the test fails when a file differs
from what this module builds (someone edited an event by hand and broke its signature, say). Slack events are
Function URL (payload 2.0) envelopes around bodies encoded exactly as Slack does (field order, PHP-style `+`
for spaces, `payload=` holding compact JSON) and signed with TEST_SIGNING_SECRET at TEST_TIMESTAMP; tests
freeze the verifier's clock at that time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

EVENTS = Path(__file__).resolve().parents[2] / "events"
TEST_SIGNING_SECRET = "fakesigningsecret000000000000000"  # the Slack contract fixtures' secret
TEST_TIMESTAMP = 1700000000
TEST_WEBHOOK_SECRET = "test-webhook-secret-0000"
URL_ID = "abcdefghijklmnopqrstuvwxyz012345"
INCIDENT_UUID = "3f1b9c2e-8a4d-4c6f-9e2a-1b2c3d4e5f60"
TRIGGER_ID = "1111111111111.0000000001.0123456789abcdef0123456789abcdef"
COMMAND_URL = "https://hooks.slack.com/commands/T0000000001/1111111111111/FAKEfakeFAKEfakeFAKEfake"
ACTION_URL = "https://hooks.slack.com/actions/T0000000001/2222222222222/FAKEfakeFAKEfakeFAKEfake"


def sign(body: bytes, timestamp: int = TEST_TIMESTAMP, secret: str = TEST_SIGNING_SECRET) -> str:
    """Slack's v0 signature of a body."""
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def url_event(
    body: str,
    headers: dict[str, str],
    *,
    user_agent: str,
    base64_body: bool = False,
    method: str = "POST",
) -> dict[str, Any]:
    """A Lambda Function URL event (payload format 2.0) as AWS delivers it."""
    all_headers = {
        "host": f"{URL_ID}.lambda-url.us-east-1.on.aws",
        "user-agent": user_agent,
        "x-amzn-trace-id": "Root=1-6553a2a0-0123456789abcdef01234567",
        "x-forwarded-for": "203.0.113.10",
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
        **{k.lower(): v for k, v in headers.items()},
    }
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": all_headers,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": URL_ID,
            "domainName": f"{URL_ID}.lambda-url.us-east-1.on.aws",
            "domainPrefix": URL_ID,
            "http": {
                "method": method,
                "path": "/",
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.10",
                "userAgent": user_agent,
            },
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "routeKey": "$default",
            "stage": "$default",
            "time": "14/Nov/2023:22:13:20 +0000",
            "timeEpoch": TEST_TIMESTAMP * 1000,
        },
        "body": base64.b64encode(body.encode()).decode() if base64_body else body,
        "isBase64Encoded": base64_body,
    }


def slack_event(body: str, *, signature: str | None = None, base64_body: bool = False) -> dict[str, Any]:
    """A signed Slack request to the ingress's Function URL."""
    raw = body.encode()
    headers = {
        "accept": "application/json,*/*",
        "accept-encoding": "gzip,deflate",
        "content-type": "application/x-www-form-urlencoded",
        "content-length": str(len(raw)),
        "x-slack-request-timestamp": str(TEST_TIMESTAMP),
        "x-slack-signature": signature or sign(raw),
    }
    return url_event(body, headers, user_agent="Slackbot 1.0 (+https://api.slack.com/robots)", base64_body=base64_body)


def slack_json_event(payload: dict[str, Any], *, signature: str | None = None) -> dict[str, Any]:
    """A signed Events API delivery (JSON) to the ingress's Function URL."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    headers = {
        "accept": "application/json,*/*",
        "accept-encoding": "gzip,deflate",
        "content-type": "application/json",
        "content-length": str(len(raw)),
        "x-slack-request-timestamp": str(TEST_TIMESTAMP),
        "x-slack-signature": signature or sign(raw),
    }
    return url_event(raw.decode(), headers, user_agent="Slackbot 1.0 (+https://api.slack.com/robots)")


def app_home_opened(user: str = "U0000000001", tab: str = "home") -> dict[str, Any]:
    """Slack's `event_callback` for a user opening the app's Home (or Messages) tab."""
    return {
        "token": "fake-verification-token",
        "team_id": "T0000000001",
        "api_app_id": "A0000000001",
        "event": {
            "type": "app_home_opened",
            "user": user,
            "channel": "D" + user[1:],
            "tab": tab,
            "event_ts": "1700000000.000100",
        },
        "type": "event_callback",
        "event_id": "Ev0000000001",
        "event_time": TEST_TIMESTAMP,
        "authorizations": [
            {"team_id": "T0000000001", "user_id": "U0000000009", "is_bot": True, "is_enterprise_install": False}
        ],
        "is_ext_shared_channel": False,
    }


def command_body(text: str, user: str = "U0000000001", channel: str = "C0000000002") -> str:
    """A /gpu slash command body, fields in Slack's order, PHP-style encoded."""
    fields = [
        ("token", "fake-verification-token"),
        ("team_id", "T0000000001"),
        ("team_domain", "fake-workspace"),
        ("channel_id", channel),
        ("channel_name", "ml-research"),
        ("user_id", user),
        ("user_name", "fake.user"),
        ("command", "/gpu"),
        ("text", text),
        ("api_app_id", "A0000000001"),
        ("is_enterprise_install", "false"),
        ("response_url", COMMAND_URL),
        ("trigger_id", TRIGGER_ID),
    ]
    return "&".join(f"{k}={quote_plus(v)}" for k, v in fields)


def payload_body(payload: dict[str, Any]) -> str:
    """An interactivity body: `payload=` holding compact JSON (Slack escapes forward slashes)."""
    compact = json.dumps(payload, separators=(",", ":")).replace("/", "\\/")
    return "payload=" + quote_plus(compact)


_USER = {"id": "U0000000001", "username": "fake.user", "name": "fake.user", "team_id": "T0000000001"}
_OPERATOR = {"id": "U0000000002", "username": "gpu.operator", "name": "gpu.operator", "team_id": "T0000000001"}


def block_actions(action_id: str, value: str, user: dict[str, str], text: str, style: str | None) -> dict[str, Any]:
    """A button click in a message gpufarm posted."""
    action: dict[str, Any] = {
        "action_id": action_id,
        "block_id": f"decide:{value.split('-')[-1]}",
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "value": value,
        "type": "button",
        "action_ts": "1700000005.123456",
    }
    if style:
        action["style"] = style
    return {
        "type": "block_actions",
        "user": user,
        "api_app_id": "A0000000001",
        "token": "fake-verification-token",
        "container": {
            "type": "message",
            "message_ts": "1700000000.000100",
            "channel_id": "C0000000001",
            "is_ephemeral": False,
        },
        "trigger_id": TRIGGER_ID,
        "team": {"id": "T0000000001", "domain": "fake-workspace"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": "C0000000001", "name": "gpu-ops"},
        "message": {
            "bot_id": "B0000000001",
            "type": "message",
            "text": f"{value} needs approval",
            "user": "U0000000009",
            "ts": "1700000000.000100",
            "app_id": "A0000000001",
            "team": "T0000000001",
        },
        "state": {"values": {}},
        "response_url": ACTION_URL,
        "actions": [action],
    }


def _select(value: str) -> dict[str, Any]:
    return {
        "type": "static_select",
        "selected_option": {"text": {"type": "plain_text", "text": value, "emoji": True}, "value": value},
    }


def view_payload(kind: str, project: str) -> dict[str, Any]:
    """A submission (or close) of gpufarm's request modal."""
    values = {
        "gpu_model": {"gpu_model": _select("H100")},
        "gpu_count": {"gpu_count": {"type": "number_input", "value": "8"}},
        "environment": {"environment": _select("onprem-hpc")},
        "team": {"team": _select("nlp")},
        "project": {"project": {"type": "plain_text_input", "value": project}},
        "duration_days": {"duration_days": {"type": "number_input", "value": "14"}},
        "purpose": {"purpose": {"type": "plain_text_input", "value": "fine-tune the Korean LLM"}},
    }
    payload: dict[str, Any] = {
        "type": kind,
        "team": {"id": "T0000000001", "domain": "fake-workspace"},
        "user": _USER,
        "api_app_id": "A0000000001",
        "token": "fake-verification-token",
        "trigger_id": "1111111111112.0000000001.0123456789abcdef0123456789abcdef",
        "view": {
            "id": "V0000000001",
            "team_id": "T0000000001",
            "type": "modal",
            "private_metadata": '{"channel":"C0000000002"}',
            "callback_id": "gpu_request",
            "state": {"values": values if kind == "view_submission" else {}},
            "hash": "1700000002.FaKeHaSh",
            "title": {"type": "plain_text", "text": "Request GPUs", "emoji": True},
            "clear_on_close": False,
            "notify_on_close": True,
            "previous_view_id": None,
            "root_view_id": "V0000000001",
            "app_id": "A0000000001",
            "external_id": "",
            "app_installed_team_id": "T0000000001",
            "bot_id": "B0000000001",
        },
        "is_enterprise_install": False,
        "enterprise": None,
    }
    if kind == "view_closed":
        payload["is_cleared"] = False
    return payload


def incident_event(phase: str, state: str, date: str, token: str = TEST_WEBHOOK_SECRET) -> dict[str, Any]:
    """Datadog's incident notification webhook as gpufarm's payload template renders it."""
    fields = {
        "state": state,
        "phase": phase,
        "team": "nlp",
        "project": "llm-ko",
        "gpu_model": "H100",
        "gpu_count": "8",
        "environment": "onprem-hpc",
        "requester": "U0000000001",
    }
    body = {
        "event_type": "incident_modified" if phase != "requested" else "incident_created",
        "date": date,
        "incident_uuid": INCIDENT_UUID,
        "incident_public_id": "1",
        "incident_status": state,
        "incident_title": "GPU request: nlp/llm-ko 8xH100 (onprem-hpc)",
        "incident_fields": fields,
    }
    headers = {"content-type": "application/json", "x-gpufarm-token": token}
    return url_event(json.dumps(body), headers, user_agent="Datadog/dd-webhook")


def idle_event(transition: str) -> dict[str, Any]:
    """The idle monitor's webhook for group ir:ir-1."""
    body = {
        "alert_id": "1234567",
        "alert_transition": transition,
        "alert_scope": "ir:ir-1",
        "alert_status": "avg(last_1h):avg:gpufarm.gpu.utilization{gpufarm:managed} by {ir} < 5",
        "alert_title": "[gpufarm] idle GPU allocation ir-1",
        "date": "1700003600000",
    }
    headers = {"content-type": "application/json", "x-gpufarm-token": TEST_WEBHOOK_SECRET}
    return url_event(json.dumps(body), headers, user_agent="Datadog/dd-webhook")


def sqs_event(body: dict[str, Any], group: str, dedup: str) -> dict[str, Any]:
    """An SQS FIFO event as Lambda's event source mapping delivers it."""
    return {
        "Records": [
            {
                "messageId": "059f36b4-87a3-44ab-83d2-661975830a7d",
                "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a",
                "body": json.dumps(body, separators=(",", ":")),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1700000000000",
                    "SequenceNumber": "18849496460467696128",
                    "MessageGroupId": group,
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "MessageDeduplicationId": dedup,
                    "ApproximateFirstReceiveTimestamp": "1700000000010",
                },
                "messageAttributes": {},
                "md5OfBody": hashlib.md5(json.dumps(body, separators=(",", ":")).encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:gpufarm-allocation.fifo",
                "awsRegion": "us-east-1",
            }
        ]
    }


INLINE_REQUEST = 'request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="fine-tune the Korean LLM"'


def build_events() -> dict[str, Any]:
    """Every sample event, by file name."""
    events: dict[str, Any] = {
        "slack_command_request_modal.json": slack_event(command_body("request")),
        "slack_command_request_inline.json": slack_event(command_body(INLINE_REQUEST)),
        "slack_command_request_inline_base64.json": slack_event(command_body(INLINE_REQUEST), base64_body=True),
        "slack_command_request_bad_count.json": slack_event(
            command_body("request 0 H100 project=llm-ko team=nlp env=onprem-hpc")
        ),
        "slack_command_list.json": slack_event(command_body("list mine")),
        "slack_command_status.json": slack_event(command_body("status IR-1")),
        "slack_command_release.json": slack_event(command_body("release IR-1")),
        "slack_command_extend.json": slack_event(command_body("extend IR-1 7")),
        "slack_command_quota.json": slack_event(command_body("quota nlp")),
        "slack_command_reserve.json": slack_event(
            command_body("reserve 8 H100 env=onprem-hpc project=llm-ko from 2026-12-10 09:00 for 3d")
        ),
        "slack_command_calendar.json": slack_event(command_body("calendar onprem-hpc H100")),
        "slack_command_help.json": slack_event(command_body("help")),
        "slack_command_unknown.json": slack_event(command_body("rent 2")),
        "slack_command_forged_signature.json": slack_event(command_body("release IR-1"), signature="v0=" + "0" * 64),
        "slack_ssl_check.json": url_event(
            "ssl_check=1&token=fake-verification-token",
            {"content-type": "application/x-www-form-urlencoded"},
            user_agent="Slackbot 1.0 (+https://api.slack.com/robots)",
        ),
        "slack_block_actions_approve.json": slack_event(
            payload_body(block_actions("gpu_approve", "IR-1", _OPERATOR, "Approve", "primary"))
        ),
        "slack_block_actions_reject.json": slack_event(
            payload_body(block_actions("gpu_reject", "IR-1", _OPERATOR, "Reject", "danger"))
        ),
        "slack_block_actions_release.json": slack_event(
            payload_body(block_actions("gpu_release", "IR-1", _USER, "Release", "danger"))
        ),
        "slack_block_actions_extend.json": slack_event(
            payload_body(block_actions("gpu_extend", "IR-1", _USER, "Extend", None))
        ),
        "slack_view_submission.json": slack_event(payload_body(view_payload("view_submission", "llm-ko"))),
        "slack_view_submission_invalid.json": slack_event(payload_body(view_payload("view_submission", "LLM KO!"))),
        "slack_view_closed.json": slack_event(payload_body(view_payload("view_closed", ""))),
        "slack_event_app_home_opened.json": slack_json_event(app_home_opened()),
        "incident_webhook_created.json": incident_event("requested", "active", "1700000001000"),
        "incident_webhook_approved.json": incident_event("approved", "active", "1700000002000"),
        # Datadog retries a delivery with the same rendered payload: byte for byte the approved event.
        "incident_webhook_approved_duplicate.json": incident_event("approved", "active", "1700000002000"),
        "incident_webhook_resolved.json": incident_event("reclaiming", "resolved", "1700000003000"),
        "incident_webhook_bad_token.json": incident_event("approved", "active", "1700000002000", token="wrong"),
        "idle_alert_triggered.json": idle_event("Triggered"),
        "idle_alert_recovered.json": idle_event("Recovered"),
        "sqs_allocation_message.json": sqs_event(
            {"incident_id": INCIDENT_UUID, "reason": "active/approved"}, "onprem-hpc", "a" * 64
        ),
        "sqs_pool_sync_message.json": sqs_event({"pool": "onprem-hpc", "reason": "sync"}, "onprem-hpc", "sync-1"),
        # ScheduleV2 delivers the template's Input as-is, with no envelope.
        "quota_sync_schedule.json": {"job": "quota_sync"},
        "slack_worker_request.json": {
            "kind": "request",
            "user": "U0000000001",
            "channel": "C0000000002",
            "response_url": COMMAND_URL,
            "request": {
                "team": "nlp",
                "project": "llm-ko",
                "gpu_model": "H100",
                "gpu_count": 8,
                "environment": "onprem-hpc",
                "duration_days": 14,
                "purpose": "fine-tune the Korean LLM",
                "requester": "U0000000001",
                "channel": "C0000000002",
                "request_id": "slack-cmd-0123456789abcdef0123456789abcdef",
            },
        },
    }
    return events


def load_event(name: str) -> Any:
    """A sample event from events/ (what tests/conftest.py's load_event reads, importable from here)."""
    return json.loads((EVENTS / name).read_text())


def render(event: Any) -> str:
    """How an event file is written."""
    return json.dumps(event, indent=2) + "\n"


def test_event_files_match_what_this_module_builds() -> None:
    built = build_events()
    on_disk = {p.name for p in EVENTS.glob("*.json")}
    assert set(built) <= on_disk, f"missing events: {sorted(set(built) - on_disk)}"
    for name, event in built.items():
        assert (EVENTS / name).read_text() == render(event), f"events/{name} differs; regenerate with --write"


def test_slack_events_carry_valid_signatures_except_the_forged_one() -> None:
    from slack_sdk.signature import SignatureVerifier

    class Frozen:
        def now(self) -> float:
            return float(TEST_TIMESTAMP)

    verifier = SignatureVerifier(TEST_SIGNING_SECRET, clock=Frozen())  # type: ignore[arg-type]
    for name, event in build_events().items():
        if not name.startswith("slack_") or name == "slack_ssl_check.json" or name.startswith("slack_worker"):
            continue
        body = event["body"]
        raw = base64.b64decode(body) if event["isBase64Encoded"] else body.encode()
        valid = verifier.is_valid_request(raw, event["headers"])
        assert valid is (name != "slack_command_forged_signature.json"), name


if __name__ == "__main__":
    if "--write" in sys.argv:
        EVENTS.mkdir(exist_ok=True)
        for event_name, content in build_events().items():
            (EVENTS / event_name).write_text(render(content))
        print(f"wrote {len(build_events())} events to {EVENTS}")
