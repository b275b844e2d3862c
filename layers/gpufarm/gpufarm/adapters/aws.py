"""AWS adapters: async invokes (Lambda), ordered work (SQS FIFO), and the farm configuration (SSM or a file).

boto3 is imported only when a client is first needed: it costs about 200 ms (docs/design.md, "Slack's
3 seconds") and the Slack ingress, which builds an invoker at start, must answer within Slack's 3 seconds.
The local function host (`gpufarm-sandbox`) injects its own invoker and queue through the runtime's seams.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufarm.config import Settings
from gpufarm.core.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.ports import AsyncInvoker, WorkQueue

log = logging.getLogger(__name__)

# Lambda's async invoke payload limit is 256 KB (1 MB since 2025 in some regions); SQS's message limit is
# 256 KiB. The lower figure keeps a payload valid for both hand-off paths.
MAX_PAYLOAD_BYTES = 262_144
# SQS FIFO MessageGroupId / MessageDeduplicationId: 1-128 characters, alphanumerics and punctuation.
_SQS_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_\-:.]{1,140}$")
FARM_PARAMETER_MAX_AGE_S = 300


def _payload_bytes(payload: Mapping[str, Any], what: str) -> bytes:
    try:
        data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise ValidationFailed("payload", f"{what} payload is not JSON: {exc}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValidationFailed("payload", f"{what} payload is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
    return data


def _checked_function(function: str) -> str:
    if not _FUNCTION_NAME.match(function or ""):
        raise ValidationFailed("function", f"{function[:60]!r} is not a Lambda function name or ARN")
    return function


def _checked_sqs_id(field: str, value: str) -> str:
    if not isinstance(value, str) or not _SQS_ID.match(value):
        raise ValidationFailed(field, f"{field} must be 1-128 letters, digits or punctuation")
    return value


def _boto_config(settings: Settings) -> Any:
    from botocore.config import Config

    return Config(
        connect_timeout=min(5.0, settings.http_timeout),
        read_timeout=settings.http_timeout,
        retries={"max_attempts": settings.max_retries + 1, "mode": "standard"},
    )


def _client_error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error")
        if isinstance(error, Mapping) and error.get("Code"):
            return str(error["Code"])
    return type(exc).__name__


class _LazyClient:
    """A boto3 client created on first use, once per container (thread-safe)."""

    def __init__(self, service: str, settings: Settings, client: Any = None) -> None:
        self._service = service
        self._settings = settings
        self._client = client
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The client, built on the first call."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3

                    self._client = boto3.client(self._service, config=_boto_config(self._settings))  # type: ignore[call-overload]
        return self._client


class LambdaInvoker:
    """Fire-and-forget Lambda invokes (InvocationType Event: Lambda queues it and answers 202)."""

    def __init__(self, settings: Settings, *, client: Any = None) -> None:
        self._lambda = _LazyClient("lambda", settings, client)

    def invoke(self, function: str, payload: Mapping[str, Any]) -> None:
        """Queue an invocation of `function` with the JSON payload."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = _checked_function(function)
        data = _payload_bytes(payload, "invoke")
        try:
            response = self._lambda.get().invoke(FunctionName=name, InvocationType="Event", Payload=data)
        except ClientError as exc:
            raise UpstreamError(f"Lambda invoke of {name} failed: {_client_error_code(exc)}") from None
        except BotoCoreError as exc:
            raise UpstreamError(f"Lambda invoke of {name} failed: {type(exc).__name__}") from None
        status = response.get("StatusCode")
        if status != 202:
            raise UpstreamError(f"Lambda invoke of {name} answered {status}, expected 202")


class SqsFifoQueue:
    """An SQS FIFO queue: one message group is processed in order, duplicates within 5 minutes dropped."""

    def __init__(self, settings: Settings, queue_url: str, *, client: Any = None) -> None:
        if not queue_url or not queue_url.endswith(".fifo"):
            raise ValidationFailed("queue_url", "the work queue must be an SQS FIFO queue (URL ending in .fifo)")
        self.queue_url = queue_url
        self._sqs = _LazyClient("sqs", settings, client)

    def send(self, body: Mapping[str, Any], *, group: str, dedup_id: str) -> None:
        """Enqueue one message in a group."""
        from botocore.exceptions import BotoCoreError, ClientError

        data = _payload_bytes(body, "queue message").decode()
        try:
            self._sqs.get().send_message(
                QueueUrl=self.queue_url,
                MessageBody=data,
                MessageGroupId=_checked_sqs_id("group", group),
                MessageDeduplicationId=_checked_sqs_id("dedup_id", dedup_id),
            )
        except ClientError as exc:
            raise UpstreamError(f"SQS send failed: {_client_error_code(exc)}") from None
        except BotoCoreError as exc:
            raise UpstreamError(f"SQS send failed: {type(exc).__name__}") from None


def make_invoker(settings: Settings) -> AsyncInvoker:
    """Lambda async invokes."""
    return LambdaInvoker(settings)


def make_queue(settings: Settings, queue_url: str) -> WorkQueue:
    """The SQS FIFO work queue at queue_url."""
    return SqsFifoQueue(settings, queue_url)


def load_farm_text(settings: Settings) -> str:
    """The farm configuration YAML as text: from SSM (GPUFARM_FARM_CONFIG_PARAMETER) or a file (GPUFARM_FARM_CONFIG)."""
    if settings.farm_config_parameter:
        return _farm_text_from_ssm(settings.farm_config_parameter)
    if settings.farm_config:
        path = Path(settings.farm_config)
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise NotFound(f"farm configuration file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UpstreamError(f"cannot read the farm configuration file {path}: {type(exc).__name__}") from None
    raise NotFound("no farm configuration: set GPUFARM_FARM_CONFIG (a file) or GPUFARM_FARM_CONFIG_PARAMETER (SSM)")


def _farm_text_from_ssm(name: str) -> str:
    # Powertools caches the value for max_age seconds, so a warm container reads SSM at most every 5 minutes.
    from aws_lambda_powertools.utilities import parameters

    try:
        value = parameters.get_parameter(name, decrypt=True, max_age=FARM_PARAMETER_MAX_AGE_S)
    except parameters.GetParameterError as exc:
        # Powertools re-raises inside `except`, so the boto error is the implicit context, not the cause.
        cause = exc.__cause__ or exc.__context__
        code = _client_error_code(cause) if isinstance(cause, Exception) else "GetParameterError"
        if code == "ParameterNotFound":
            raise NotFound(f"SSM parameter {name} does not exist") from None
        raise UpstreamError(f"reading SSM parameter {name} failed: {code}") from None
    if not value.strip():
        raise NotFound(f"SSM parameter {name} is empty")
    return value


if TYPE_CHECKING:

    def _implements_the_ports(a: LambdaInvoker, c: SqsFifoQueue) -> tuple[AsyncInvoker, WorkQueue]:
        """mypy proves here that each class satisfies the port it is used as."""
        return a, c
