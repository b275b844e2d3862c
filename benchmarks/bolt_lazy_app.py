"""The comparison point of benchmarks/ingress.py: a Slack Bolt app with a lazy listener, as Bolt's docs write it.

The shape is Bolt's own AWS Lambda example (examples/aws_lambda/lazy_aws_lambda.py in slackapi/bolt-python):
`App(process_before_response=True)`, a command listener whose `ack` answers inside Slack's 3 seconds and whose
`lazy` function does the slow part. On Lambda, `SlackRequestHandler` hands a lazy function off by invoking the
same function again, asynchronously (`lambda.invoke(InvocationType="Event")` through boto3) with the original
event; that is the hand-off the gpufarm ingress makes to its worker.

Secrets come from the environment (SLACK_SIGNING_SECRET, SLACK_BOT_TOKEN), as Bolt's examples show; that spares
Bolt the Secrets Manager read the gpufarm ingress makes, so the comparison can only flatter Bolt. With
BOLT_SECRETS_NAME set instead they come from that Secrets Manager JSON secret (the keys gpufarm's secret uses),
read with boto3 at import as a Bolt user keeping secrets out of the environment would: the like-for-like variant.

Bolt checks its token with one `auth.test` call when the app is built (a single-workspace app always does, at
start or on its first request); the benchmark points the Web API at a loopback stub (SLACK_API_URL) that answers
at once, where a real cold start waits for slack.com.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import boto3
from slack_bolt import Ack, App, Respond
from slack_bolt.adapter.aws_lambda import SlackRequestHandler
from slack_sdk import WebClient

# Bolt's example removes the runtime's log handlers and configures logging itself.
SlackRequestHandler.clear_all_log_handlers()
logging.basicConfig(format="%(asctime)s %(message)s", level=logging.WARNING)

if os.environ.get("BOLT_SECRETS_NAME"):
    _secret = json.loads(
        boto3.client("secretsmanager").get_secret_value(SecretId=os.environ["BOLT_SECRETS_NAME"])["SecretString"]
    )
    token, signing_secret = _secret["slack_bot_token"], _secret["slack_signing_secret"]
else:
    token, signing_secret = os.environ["SLACK_BOT_TOKEN"], os.environ["SLACK_SIGNING_SECRET"]

app = App(
    process_before_response=True,
    client=WebClient(token=token, base_url=os.environ.get("SLACK_API_URL", WebClient.BASE_URL)),
    signing_secret=signing_secret,
)


def respond_to_slack_within_3_seconds(body: dict[str, Any], ack: Ack) -> None:
    """The ack: Slack's 3 seconds."""
    text = body.get("text") or ""
    ack(response_type="ephemeral", text=f"Requesting {text[:200]}…")


def process_request(respond: Respond, body: dict[str, Any]) -> None:
    """The lazy part (runs in the re-invoked function; never reached in the benchmark's one request)."""
    respond(f"Completed: {body.get('text', '')[:200]}")


app.command("/gpu")(ack=respond_to_slack_within_3_seconds, lazy=[process_request])


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler, as in Bolt's example."""
    slack_handler = SlackRequestHandler(app=app)
    answer: dict[str, Any] = slack_handler.handle(event, context)
    return answer
