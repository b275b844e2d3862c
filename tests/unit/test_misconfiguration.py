"""A deployment missing its secret keys, its farm parameter or one key, or a function not given a key it needs, in
every function (moto).

What each must do: one log line naming what is missing (the secret, parameter or key NAME, never a value), and
nothing more for the caller: a 500 with no detail on a Function URL (the ingress, the webhooks), a detail-free
failure for an asynchronous caller (the worker's on-failure destination, the sync's scheduler, the queue's
redelivery).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufarm.adapters import aws
from gpufarm.handlers import idle_alert, incident_webhook, quota_sync, runtime, slack_ingress, slack_worker

REGION = "us-east-1"
EVENTS = Path(__file__).resolve().parents[2] / "events"
FARM = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text()
SECRET_NAME = "gpufarm/prod"
PARAMETER = "/gpufarm/farm"
SIGNING = "signing-secret-value-0000"
WEBHOOK = "test-webhook-secret-0000"
SECRET = {
    "datadog_api_key": "dd-api-key-value",
    "datadog_app_key": "dd-app-key-value",
    "slack_bot_token": "xoxb-bot-token-value",
    "slack_signing_secret": SIGNING,
    "webhook_secret": WEBHOOK,
}
NOT_CONFIGURED = {"error": "gpufarm is not configured"}


def _event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return data


def _signed_command() -> dict[str, Any]:
    """The inline request, signed now with the secret's signing secret (the runtime's clock is the real one)."""
    event = _event("slack_command_request_inline.json")
    timestamp = str(int(time.time()))
    base = f"v0:{timestamp}:{event['body']}".encode()
    event["headers"]["x-slack-request-timestamp"] = timestamp
    event["headers"]["x-slack-signature"] = "v0=" + hmac.new(SIGNING.encode(), base, hashlib.sha256).hexdigest()
    return event


class Invoker:
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.answers: list[str] = []

    def invoke(self, function: str, payload: Any) -> None:
        self.calls.append((function, payload))

    # The worker's Slack answers (it is the chat too): respond(response_url, text, blocks).
    def respond(self, url: str, text: str, blocks: Any = None) -> None:
        self.answers.append(text)

    def tell_user(self, user: str, text: str, blocks: Any = None) -> None:
        self.answers.append(text)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoker]:
    """The environment the template gives every function, against moto; the ingress's hand-off recorded."""
    for name in list(__import__("os").environ):
        if name.startswith(("GPUFARM_", "SLACK_", "DD_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", SECRET_NAME)
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", ",".join(SECRET))
    monkeypatch.setenv("GPUFARM_FARM_CONFIG_PARAMETER", PARAMETER)
    monkeypatch.setenv("GPUFARM_WORKER_FUNCTION", "gpufarm-slack-worker")
    monkeypatch.setenv("GPUFARM_ALLOCATION_QUEUE_URL", f"https://sqs.{REGION}.amazonaws.com/123456789012/alloc.fifo")
    aws.clear_config_cache()
    invoker = Invoker()
    runtime.reset()
    runtime.override(invoker=invoker, chat=invoker)
    with mock_aws():
        yield invoker
    runtime.reset()
    aws.clear_config_cache()


def _put_keys(values: dict[str, str]) -> None:
    """Each key its own secret, `<prefix>/<key>`, as `gpufarm secrets put` writes them."""
    client = boto3.client("secretsmanager", region_name=REGION)
    for key, value in values.items():
        client.create_secret(Name=f"{SECRET_NAME}/{key}", SecretString=value)


def _put_farm() -> None:
    boto3.client("ssm", region_name=REGION).put_parameter(Name=PARAMETER, Value=FARM, Type="SecureString")


def _not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The function declares (and so is granted) a key none of these paths needs first."""
    _put_farm()
    _put_keys(SECRET)
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "profile_link_secret")


def _without(key: str) -> dict[str, str]:
    return {k: v for k, v in SECRET.items() if k != key}


# What is missing, how to set the deployment up that way, and the words the log line must contain.
CASES: dict[str, tuple[Callable[[pytest.MonkeyPatch], object], str]] = {
    "secrets absent": (lambda _: _put_farm(), f"secret {SECRET_NAME}/"),
    "parameter absent": (lambda _: _put_keys(SECRET), f"SSM parameter {PARAMETER} does not exist"),
    "the signing secret absent": (
        lambda _: (_put_farm(), _put_keys(_without("slack_signing_secret"))),
        f"secret {SECRET_NAME}/slack_signing_secret (Secrets Manager) does not exist",
    ),
    "the webhook secret absent": (
        lambda _: (_put_farm(), _put_keys(_without("webhook_secret"))),
        f"secret {SECRET_NAME}/webhook_secret (Secrets Manager) does not exist",
    ),
    "a key not given": (_not_given, "this process is not given the secret key '"),
}


def _check_one_line(caplog: pytest.LogCaptureFixture, words: str) -> None:
    """Exactly one error line, naming what is missing; no secret value anywhere in the log."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert words in errors[0].getMessage()
    assert errors[0].exc_info is None
    text = "\n".join(r.getMessage() for r in caplog.records)
    for value in SECRET.values():
        assert value not in text


def _not_configured(answer: dict[str, Any]) -> None:
    assert answer["statusCode"] == 500
    assert json.loads(answer["body"]) == NOT_CONFIGURED


@pytest.mark.parametrize("case", ["secrets absent", "parameter absent", "the signing secret absent", "a key not given"])
def test_the_ingress_answers_500_and_logs_what_is_missing(
    aws_env: Invoker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    setup, words = CASES[case]
    setup(monkeypatch)
    with caplog.at_level(logging.INFO):
        answer = slack_ingress.handle(_signed_command())
    _not_configured(answer)
    _check_one_line(caplog, words)
    assert aws_env.calls == []


def test_the_ingress_hands_off_once_everything_is_there(aws_env: Invoker) -> None:
    _put_farm()
    _put_keys(SECRET)
    answer = slack_ingress.handle(_signed_command())
    assert answer["statusCode"] == 200
    [(function, payload)] = aws_env.calls
    assert function == "gpufarm-slack-worker" and payload["kind"] == "request"


# The incident webhook's URL path never reads the farm (it queues the incident): its consumer does, below.
@pytest.mark.parametrize(
    ("handle", "event", "case"),
    [
        (idle_alert.handle, "idle_alert_triggered.json", "secrets absent"),
        (idle_alert.handle, "idle_alert_triggered.json", "parameter absent"),
        (idle_alert.handle, "idle_alert_triggered.json", "the webhook secret absent"),
        (incident_webhook.handle, "incident_webhook_approved.json", "secrets absent"),
        (incident_webhook.handle, "incident_webhook_approved.json", "the webhook secret absent"),
        (incident_webhook.handle, "incident_webhook_approved.json", "a key not given"),
    ],
)
def test_the_webhooks_answer_500_and_log_what_is_missing(
    aws_env: Invoker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    handle: Callable[[dict[str, Any]], dict[str, Any]],
    event: str,
) -> None:
    setup, words = CASES[case]
    setup(monkeypatch)
    body = _event(event)
    body["headers"]["x-gpufarm-token"] = WEBHOOK
    with caplog.at_level(logging.INFO):
        answer = handle(body)
    _not_configured(answer)
    _check_one_line(caplog, words)


@pytest.mark.parametrize("case", ["secrets absent", "parameter absent", "a key not given"])
@pytest.mark.parametrize(
    ("handle", "event"),
    [
        (slack_worker.handle, "slack_worker_request.json"),
        (quota_sync.handle, "quota_sync_schedule.json"),
        (incident_webhook.handle, "sqs_allocation_message.json"),
    ],
    ids=["slack worker", "quota sync", "allocation queue consumer"],
)
def test_the_asynchronous_functions_fail_without_detail_and_log_what_is_missing(
    aws_env: Invoker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    handle: Callable[[dict[str, Any]], dict[str, Any]],
    event: str,
) -> None:
    setup, words = CASES[case]
    setup(monkeypatch)
    with caplog.at_level(logging.INFO):
        try:
            outcome: Any = handle(_event(event))
        except runtime.NotConfigured as exc:
            outcome = exc
    if handle is slack_worker.handle:
        # The worker has its Slack client: it tells the user gpufarm is not configured and reports the failure.
        assert outcome["ok"] is False
        assert "not fully configured" in outcome["text"]
        assert aws_env.answers == [outcome["text"]]
    elif handle is incident_webhook.handle:
        # Per message: the record fails (SQS redelivers it, then the DLQ takes it).
        assert outcome == {"batchItemFailures": [{"itemIdentifier": _event(event)["Records"][0]["messageId"]}]}
    else:
        assert isinstance(outcome, runtime.NotConfigured)
        assert str(outcome) == "gpufarm is not configured; the function's log names what is missing"
    _check_one_line(caplog, words)
