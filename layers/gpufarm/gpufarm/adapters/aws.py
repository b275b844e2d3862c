"""AWS adapters: async invokes (Lambda), ordered work (SQS FIFO), and the deployment's secret keys and farm
configuration.

Clients come from botocore, one session per process: boto3 adds nothing a client needs here but its import
(~50 ms: s3transfer, resources), and each extra session parses botocore's endpoint data again (~50 ms). The SSM
and Lambda clients are built from models holding only the operations gpufarm calls (botocore_models.py). botocore
is imported only when a client is first needed, since the Slack ingress must answer within Slack's 3 seconds
(docs/design.md, "Slack's 3 seconds").

In Lambda the function's secret keys (Secrets Manager, one secret each: `<GPUFARM_SECRETS_NAME>/<key>` for the keys
GPUFARM_SECRET_KEYS names) and the farm YAML (SSM, GPUFARM_FARM_CONFIG_PARAMETER) arrive in one SSM GetParameters
call: Parameter Store hands out a Secrets Manager secret under /aws/reference/secretsmanager/<name>, so one client
and one round trip serve all (at most 10 names). Values are cached for CONFIG_MAX_AGE_S: the runtime reads its
secret keys and the farm at most every 5 minutes (and after each SnapStart restore), so a rotated key or an edited
farm reaches a warm container within that time. A missing key is left out, and whoever needs it gets
ConfigurationMissing naming its secret; a missing farm parameter raises it when the farm is read. Never a value.

Once the Slack ingress is prepared for its SnapStart snapshot (use_direct_calls), its GetParameters and Event
Invoke go without the clients' pipeline, through aws_lean on the clients' endpoints, credentials and limits: after
a restore they are most of the first request's CPU (aws_lean.py says why and what it measured).

The local function host (`gpufarm-sandbox`) injects its own invoker and queue through the runtime's seams.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gpufarm.config import SECRET_KEYS, ConfigurationMissing, Settings, running_in_lambda, secret_name
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed

if TYPE_CHECKING:
    # Types only: the ports module loads the incident models, which the Slack ingress's cold path never needs.
    from gpufarm.core.kernel.ports import AsyncInvoker, WorkQueue

log = logging.getLogger(__name__)

# Lambda's async invoke payload limit is 256 KB (1 MB since 2025 in some regions); SQS's message limit is
# 256 KiB. The lower figure keeps a payload valid for both hand-off paths.
MAX_PAYLOAD_BYTES = 262_144
# SQS FIFO MessageGroupId / MessageDeduplicationId: 1-128 characters, alphanumerics and punctuation.
_SQS_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_\-:.]{1,140}$")
# How long a secret or parameter value is reused before SSM is asked again.
CONFIG_MAX_AGE_S = 300.0
# Parameter Store's name for a Secrets Manager secret.
SECRET_REFERENCE = "/aws/reference/secretsmanager/"  # noqa: S105 - a path prefix, not a secret
# GetParameters takes at most 10 names.
_MAX_NAMES = 10


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


_session_lock = threading.Lock()
_session: Any = None
_clients: dict[tuple[str, float, int], Any] = {}


def aws_client(service: str, settings: Settings) -> Any:
    """A botocore client for `service`, one per process and timeout budget, all from one session (thread-safe)."""
    global _session  # noqa: PLW0603 - one session per container is the point
    key = (service, settings.http_timeout, settings.max_retries)
    client = _clients.get(key)
    if client is None:
        with _session_lock:
            client = _clients.get(key)
            if client is None:
                if _session is None:
                    import botocore.session

                    from gpufarm.adapters.botocore_models import MODELS

                    _session = botocore.session.get_session()
                    # SSM and Lambda models cut down to the operations gpufarm calls (botocore_models.py).
                    _session.get_component("data_loader").search_paths.insert(0, str(MODELS))
                config = _boto_config(settings)
                if service == "s3":
                    # Presigned URLs (the profile upload's PUT URLs) signed with SigV4, whose signature covers the
                    # method, bucket, key and expiry; botocore would otherwise presign with SigV2 in us-east-1.
                    from botocore.config import Config

                    config = config.merge(Config(signature_version="s3v4"))
                client = _session.create_client(service, config=config)
                _clients[key] = client
    return client


def forget_connections() -> None:
    """Close every client's pooled connections and the direct calls' connections (after a SnapStart restore they
    point at sockets long gone), and take the direct calls' credentials from the environment again."""
    global _direct_credentials  # noqa: PLW0603 - read again after a restore
    with _session_lock:
        for client in _clients.values():
            client._endpoint.http_session.close()  # botocore has no public way to drop its pool
        for endpoint in _direct.values():
            endpoint.close()
        _direct_credentials = None


def forget_clients() -> None:
    """Close and drop every cached client and the session: the next call builds them again from the environment
    as it is then, endpoints and credentials alike (botocore's session keeps the credentials it first resolved; a
    development host starting a new local environment, whose endpoints and stand-in keys differ; a Lambda
    container never does)."""
    global _session, _direct_credentials, _direct_calls  # noqa: PLW0603 - rebuilt with the clients
    with _session_lock:
        for client in _clients.values():
            client._endpoint.http_session.close()
        _clients.clear()
        for endpoint in _direct.values():
            endpoint.close()
        _direct.clear()
        _direct_credentials = None
        _direct_calls = False
        _session = None


# -- direct calls (adapters/aws_lean.py): the Slack ingress's two calls after a SnapStart restore ------------------

_direct: dict[tuple[str, float, int], Any] = {}
_direct_credentials: Any = None
_direct_calls = False


def use_direct_calls(services: Sequence[str], settings: Settings) -> None:
    """From now on make GetParameters and the Event Invoke without their botocore clients (aws_lean), on the
    endpoint, timeouts and retry limits of the clients built here for `services` (the Slack ingress, before its
    SnapStart snapshot; forget_clients turns it off)."""
    global _direct_calls  # noqa: PLW0603 - one switch per container
    for service in services:
        _direct_endpoint(service, settings)
    _direct_calls = True


def _direct_endpoint(service: str, settings: Settings) -> Any:
    """The aws_lean endpoint of `service`, made from the client botocore built for it (endpoint, region, limits)."""
    key = (service, settings.http_timeout, settings.max_retries)
    endpoint = _direct.get(key)
    if endpoint is None:
        from gpufarm.adapters.aws_lean import AwsEndpoint

        client = aws_client(service, settings)
        config = client.meta.config
        with _session_lock:
            endpoint = _direct.get(key)
            if endpoint is None:
                endpoint = AwsEndpoint(
                    service,
                    endpoint_url=client.meta.endpoint_url,
                    region=client.meta.region_name,
                    credentials=_credentials_now,
                    connect_timeout=config.connect_timeout,
                    read_timeout=config.read_timeout,
                    max_attempts=_client_attempts(config),
                )
                _direct[key] = endpoint
    return endpoint


def _client_attempts(config: Any) -> int:
    """How many attempts a client with `config` makes, as botocore counts them: `total_max_attempts`, else
    `max_attempts` retries after the first attempt."""
    retries = config.retries or {}
    if "total_max_attempts" in retries:
        return int(retries["total_max_attempts"])
    return int(retries.get("max_attempts", 2)) + 1


def _credentials_now() -> Any:
    """The credentials the direct calls sign with: the environment's when it holds keys (read again after each
    restore), else those of the session's provider chain, as its clients sign (with SnapStart, Lambda's container
    credentials, which refresh themselves before they expire)."""
    global _direct_credentials  # noqa: PLW0603 - read once per restore
    credentials = _direct_credentials
    if credentials is None:
        from botocore.credentials import EnvProvider

        credentials = EnvProvider().load() or (_session.get_credentials() if _session is not None else None)
        if credentials is None:
            raise ConfigurationMissing("no AWS credentials in the environment or the provider chain")
        _direct_credentials = credentials
    return credentials


def direct_endpoint(service: str, settings: Settings) -> Any:
    """The direct endpoint of `service` when use_direct_calls is on, else None (the botocore client serves)."""
    return _direct_endpoint(service, settings) if _direct_calls else None


class _LazyClient:
    """A client taken from aws_client on first use (or the one a test passes in)."""

    def __init__(self, service: str, settings: Settings, client: Any = None) -> None:
        self._service = service
        self._settings = settings
        self._client = client
        # A client given by a test is what that test means to call.
        self.given = client is not None

    def get(self) -> Any:
        """The client."""
        if self._client is None:
            self._client = aws_client(self._service, self._settings)
        return self._client


class LambdaInvoker:
    """Fire-and-forget Lambda invokes (InvocationType Event: Lambda queues it and answers 202)."""

    def __init__(self, settings: Settings, *, client: Any = None) -> None:
        self._settings = settings
        self._lambda = _LazyClient("lambda", settings, client)

    def invoke(self, function: str, payload: Mapping[str, Any]) -> None:
        """Queue an invocation of `function` with the JSON payload."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = _checked_function(function)
        data = _payload_bytes(payload, "invoke")
        direct = None if self._lambda.given else direct_endpoint("lambda", self._settings)
        if direct is not None:
            return _invoke_directly(direct, name, data)
        try:
            response = self._lambda.get().invoke(FunctionName=name, InvocationType="Event", Payload=data)
        except ClientError as exc:
            raise UpstreamError(f"Lambda invoke of {name} failed: {_client_error_code(exc)}") from None
        except BotoCoreError as exc:
            raise UpstreamError(f"Lambda invoke of {name} failed: {type(exc).__name__}") from None
        status = response.get("StatusCode")
        if status != 202:
            raise UpstreamError(f"Lambda invoke of {name} answered {status}, expected 202")


def _invoke_directly(endpoint: Any, name: str, data: bytes) -> None:
    from gpufarm.adapters.aws_lean import Refused, Unreachable

    try:
        status = endpoint.invoke_event(name, data)
    except Refused as exc:
        raise UpstreamError(f"Lambda invoke of {name} failed: {exc.code}") from None
    except Unreachable as exc:
        raise UpstreamError(f"Lambda invoke of {name} failed: {exc.reason}") from None
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


# -- the deployment's secret and farm configuration ---------------------------------------------------------------

_cache_lock = threading.Lock()
_cache: dict[str, tuple[str, float]] = {}


def clear_config_cache() -> None:
    """Forget every cached secret and parameter value (tests; after a SnapStart restore)."""
    with _cache_lock:
        _cache.clear()


def secret_parameter(secret_name: str) -> str:
    """The Parameter Store name under which SSM hands out a Secrets Manager secret."""
    return SECRET_REFERENCE + secret_name.lstrip("/")


def read_parameters(settings: Settings, names: Sequence[str], *, optional: Sequence[str] = ()) -> dict[str, str]:
    """The decrypted values of SSM parameters (and referenced secrets), one GetParameters call for all uncached.

    A missing name raises ConfigurationMissing naming it, unless it is `optional` (fetched along because it will be
    wanted soon): then it is left out, and whoever needs it asks again and gets the error.
    """
    now = time.monotonic()
    with _cache_lock:
        values = {n: v for n, (v, at) in _cache.items() if n in names and now - at < CONFIG_MAX_AGE_S}
    wanted = [n for n in dict.fromkeys(names) if n not in values]
    if wanted:
        fetched = _get_parameters(settings, wanted, optional)
        with _cache_lock:
            _cache.update({n: (v, now) for n, v in fetched.items()})
        values.update(fetched)
    return values


def _get_parameters(settings: Settings, names: list[str], optional: Sequence[str] = ()) -> dict[str, str]:
    from botocore.exceptions import BotoCoreError, ClientError

    if len(names) > _MAX_NAMES:
        raise ValidationFailed("names", f"at most {_MAX_NAMES} parameters at once")
    direct = direct_endpoint("ssm", settings)
    if direct is not None:
        return _get_parameters_directly(direct, settings, names, optional)
    ssm = aws_client("ssm", settings)
    try:
        response = ssm.get_parameters(Names=names, WithDecryption=True)
    except ClientError as exc:
        return _after_refusal(settings, names, optional, _client_error_code(exc))
    except BotoCoreError as exc:
        raise UpstreamError(f"reading {', '.join(_describe(n) for n in names)} failed: {type(exc).__name__}") from None
    return _values_found(response, names, optional)


def _get_parameters_directly(
    endpoint: Any, settings: Settings, names: list[str], optional: Sequence[str]
) -> dict[str, str]:
    from gpufarm.adapters.aws_lean import Refused, Unreachable

    try:
        response = endpoint.call_json("GetParameters", {"Names": names, "WithDecryption": True})
    except Refused as exc:
        return _after_refusal(settings, names, optional, exc.code)
    except Unreachable as exc:
        raise UpstreamError(f"reading {', '.join(_describe(n) for n in names)} failed: {exc.reason}") from None
    return _values_found(response, names, optional)


def _after_refusal(settings: Settings, names: list[str], optional: Sequence[str], code: str) -> dict[str, str]:
    """What GetParameters refused with `code` leaves: the values asked one by one, nothing (an optional name), or
    ConfigurationMissing / UpstreamError naming what could not be read."""
    if code == "ParameterNotFound" and len(names) > 1:
        # A missing secret reference fails the whole call; ask one by one to name what is missing.
        return {k: v for n in names for k, v in _get_parameters(settings, [n], optional).items()}
    if code == "ParameterNotFound" and names[0] in optional:
        return {}
    if code == "ParameterNotFound":
        raise _missing(names[0]) from None
    if code in ("AccessDeniedException", "AccessDenied"):
        raise ConfigurationMissing(
            f"this function may not read {' or '.join(map(_describe, names))} ({code})"
        ) from None
    raise UpstreamError(f"reading {', '.join(_describe(n) for n in names)} failed: {code}") from None


def _values_found(response: Mapping[str, Any], names: list[str], optional: Sequence[str]) -> dict[str, str]:
    """The values of a GetParameters answer by the names asked; ConfigurationMissing for a required one absent."""
    found: dict[str, str] = {}
    for parameter in response.get("Parameters", []):
        name = str(parameter.get("Name", ""))
        # SSM may name a referenced secret by the secret's own name rather than the reference path.
        key = name if name in names else secret_parameter(name)
        if key in names:
            found[key] = str(parameter.get("Value", ""))
    missing = [n for n in names if n not in found and n not in optional]
    if missing:
        raise _missing(missing[0])
    return found


def _describe(name: str) -> str:
    if name.startswith(SECRET_REFERENCE):
        return f"secret {name.removeprefix(SECRET_REFERENCE)} (Secrets Manager)"
    return f"SSM parameter {name}"


def _missing(name: str) -> ConfigurationMissing:
    return ConfigurationMissing(f"{_describe(name)} does not exist or this function may not read it")


def secret_keys_to_read(settings: Settings) -> tuple[str, ...]:
    """The secret keys this process reads: those GPUFARM_SECRET_KEYS names; without it none in Lambda (a function
    reads only what it declares) and every key elsewhere (an operator's command, which may read them all)."""
    declared = settings.declared_secret_keys()
    if declared is not None:
        return declared
    return () if running_in_lambda() else tuple(SECRET_KEYS)


def read_secrets(settings: Settings) -> dict[str, str]:
    """This process's secret keys (`<GPUFARM_SECRETS_NAME>/<key>`, one Secrets Manager secret each), key -> value,
    and the farm parameter, when there is one, in the same GetParameters call.

    A key that is absent is left out (only profiler runs need the link and upload keys); whoever needs it gets
    ConfigurationMissing naming its secret from Settings.require. When every key exists this is one call; a
    missing one costs a call per name (Parameter Store refuses the whole call for one missing reference).
    """
    if not settings.secrets_name:
        return {}
    keys = secret_keys_to_read(settings)
    names = {secret_parameter(secret_name(settings.secrets_name, key)): key for key in keys}
    farm = [settings.farm_config_parameter] if settings.farm_config_parameter else []
    # At most 9 keys (GPUFARM_SECRET_KEYS' bound; gpufarm has 8) and the farm: one call of at most 10 names.
    wanted = [*names, *farm]
    values = read_parameters(settings, wanted, optional=wanted)
    return {key: values[name] for name, key in names.items() if values.get(name)}


def load_settings() -> Settings:
    """Settings from the environment, then this process's secret keys when GPUFARM_SECRETS_NAME is set (one SSM
    call, with the farm parameter)."""
    settings = Settings()
    if settings.secrets_name:
        settings = settings.with_secrets(read_secrets(settings))
    return settings


def load_farm_text(settings: Settings) -> str:
    """The farm configuration YAML as text: from SSM (GPUFARM_FARM_CONFIG_PARAMETER) or a file (GPUFARM_FARM_CONFIG)."""
    if settings.farm_config_parameter:
        name = settings.farm_config_parameter
        value = read_parameters(settings, [name])[name]
        if not value.strip():
            raise ConfigurationMissing(f"SSM parameter {name} is empty")
        return value
    if settings.farm_config:
        path = Path(settings.farm_config)
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigurationMissing(f"farm configuration file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UpstreamError(f"cannot read the farm configuration file {path}: {type(exc).__name__}") from None
    raise ConfigurationMissing(
        "no farm configuration: set GPUFARM_FARM_CONFIG (a file) or GPUFARM_FARM_CONFIG_PARAMETER (SSM)"
    )


# -- Function URLs from outside -----------------------------------------------------------------------------------

# How much of an answer's body is kept to say why a Function URL answered as it did.
_ANSWER_SNIPPET = 200


def function_url_answer(
    url: str, *, body: bytes | None = None, content_type: str = "application/json", timeout: float = 10.0
) -> tuple[int, str]:
    """What a Lambda Function URL answers a request that carries no signature, token or signed link (a GET, or a
    POST of `body`): its HTTP status and the start of its body. Raises UpstreamError when nothing answers (name
    resolution, connection, time-out), ValidationFailed for a URL that is not http(s)."""
    # Imported here: only `gpufarm doctor` asks, and the functions' cold starts need none of it.
    import urllib.error
    import urllib.request

    parsed = urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValidationFailed("url", f"{url[:80]!r} is not an absolute http(s) URL")
    headers = {"content-type": content_type} if body is not None else {}
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        url.strip(), data=body, method="POST" if body is not None else "GET", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - the scheme is checked above
            return int(answer.status), _snippet(answer.read(_ANSWER_SNIPPET))
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), _snippet(exc.read(_ANSWER_SNIPPET))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UpstreamError(f"no answer from {parsed.netloc} ({type(reason).__name__})") from None


def _snippet(body: bytes) -> str:
    return " ".join(body.decode("utf-8", "replace").split())[:_ANSWER_SNIPPET]


if TYPE_CHECKING:

    def _implements_the_ports(a: LambdaInvoker, c: SqsFifoQueue) -> tuple[AsyncInvoker, WorkQueue]:
        """mypy proves here that each class satisfies the port it is used as."""
        return a, c
