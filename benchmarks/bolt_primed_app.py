"""The Bolt app of benchmarks/bolt_lazy_app.py built for SnapStart, as the gpufarm ingress is: everything that is
not a request built at init, so that it lands in the snapshot.

Bolt's example builds its `SlackRequestHandler` on every request and its lazy runner makes its Lambda client at the
first hand-off (`boto3.client("lambda")` inside `LambdaLazyListenerRunner.start`). Here both are built once, at
import: the handler, and the runner with a Lambda client made now (the runner's own `lambda_client` argument).
The app itself (its `auth.test` included) is bolt_lazy_app's, unchanged. benchmarks/ingress.py compares the
gpufarm ingress restored from a snapshot with this app restored from one.
"""

from __future__ import annotations

from typing import Any

import boto3
from bolt_lazy_app import app  # beside this file, first on sys.path
from slack_bolt.adapter.aws_lambda import SlackRequestHandler
from slack_bolt.adapter.aws_lambda.lazy_listener_runner import LambdaLazyListenerRunner

_slack_handler = SlackRequestHandler(app=app)
# SlackRequestHandler installs a runner without a client; this one carries its client from init on.
app.listener_runner.lazy_listener_runner = LambdaLazyListenerRunner(
    _slack_handler.logger, lambda_client=boto3.client("lambda")
)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler: the handler built at init handles the request."""
    answer: dict[str, Any] = _slack_handler.handle(event, context)
    return answer
