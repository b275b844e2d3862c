"""The Slack ingress's direct AWS calls (adapters/aws_lean.py) answer as the botocore clients do, against moto.

moto runs in server mode on a loopback port, as benchmarks/ingress.py runs it, behind a small WSGI layer that notes
every request (its operation and signature) and can answer the next ones with a throttling or 5xx error before moto
sees them. Each case runs twice, through the botocore clients and through the direct calls, and must end the same:
the same values, the same exception with the same message, the same number of attempts.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpufarm.adapters import aws
from gpufarm.adapters.aws_lean import AwsEndpoint, Refused, error_code
from gpufarm.config import ConfigurationMissing, Settings
from gpufarm.core.kernel.errors import UpstreamError

REGION = "us-east-1"
PREFIX = "gpufarm/contract"
FARM_PARAMETER = "/gpufarm/contract-farm"
WORKER = "gpufarm-slack-worker"
SIGNING_SECRET = "contract-signing-secret-0123456789"
BOT_TOKEN = "xoxb-contract-0000-token"
AWS_SECRET = "contractsecretaccesskeycontractsecretkey"
PATHS = ("client", "direct")


class Gate:
    """WSGI in front of moto: notes each AWS request; answers the next ones from `faults` when any are queued."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.faults: list[tuple[int, str]] = []
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/moto-api"):
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        with self.lock:
            self.seen.append(
                {
                    "op": environ.get("HTTP_X_AMZ_TARGET") or f"{environ['REQUEST_METHOD']} {path}",
                    "auth": environ.get("HTTP_AUTHORIZATION", ""),
                    "type": environ.get("HTTP_X_AMZ_INVOCATION_TYPE"),
                    "body": body,
                    "method": environ["REQUEST_METHOD"],
                    "path": environ.get("RAW_URI") or path,
                    "headers": _wire_headers(environ),
                }
            )
            fault = self.faults.pop(0) if self.faults else None
        if fault is None:
            return self.app(environ, start_response)
        status, code = fault
        data = json.dumps({"__type": code, "message": "refused by the test"}).encode()
        start_response(
            f"{status} Refused",
            [
                ("Content-Type", "application/x-amz-json-1.1"),
                ("x-amzn-ErrorType", code),
                ("Content-Length", str(len(data))),
            ],
        )
        return [data]


def _wire_headers(environ: dict[str, Any]) -> dict[str, str]:
    """The request's headers as they came over the wire, by lower-case name."""
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = str(environ[name])
    return headers


def signature_holds(seen: dict[str, Any], secret_key: str) -> bool:
    """Whether the Authorization header moto received signs the request as it came over the wire (SigV4, computed
    again with botocore's SigV4Auth from the received method, path, signed headers and body)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = seen["auth"]
    scope = auth.split("Credential=", 1)[1].split(",", 1)[0].split("/")
    signed = auth.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    headers = {name: seen["headers"][name] for name in signed}
    url = f"http://{seen['headers']['host']}{seen['path']}"
    request = AWSRequest(method=seen["method"], url=url, data=seen["body"], headers=headers)
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials(scope[0], secret_key), scope[3], scope[2])
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    return bool(expected == auth.split("Signature=", 1)[1].strip())


@pytest.fixture(scope="module")
def moto_url() -> Iterator[tuple[str, Gate]]:
    """moto in server mode on a free loopback port (Lambda without Docker), seeded with secrets, farm, worker."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    gate = Gate(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, gate, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        config = json.dumps({"lambda": {"use_docker": False}}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/config", data=config), timeout=10).close()
        _seed(url)
        yield url, gate
    finally:
        server.shutdown()
        thread.join()


def _seed(url: str) -> None:
    import boto3

    session = boto3.Session(aws_access_key_id="AKIDSEED", aws_secret_access_key="seed", region_name=REGION)
    secrets = session.client("secretsmanager", endpoint_url=url)
    for key, value in {"slack_signing_secret": SIGNING_SECRET, "slack_bot_token": BOT_TOKEN}.items():
        secrets.create_secret(Name=f"{PREFIX}/{key}", SecretString=value)
    session.client("ssm", endpoint_url=url).put_parameter(
        Name=FARM_PARAMETER, Value="gpu_models: {}\n", Type="SecureString"
    )
    role = session.client("iam", endpoint_url=url).create_role(
        RoleName="contract", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("x.py", "def handler(event, context):\n    return None\n")
    session.client("lambda", endpoint_url=url).create_function(
        FunctionName=WORKER, Runtime="python3.12", Role=role, Handler="x.handler", Code={"ZipFile": code.getvalue()}
    )


@pytest.fixture
def env(moto_url: tuple[str, Gate], monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """The ingress's environment pointed at moto; clients and direct calls built afresh, nothing cached."""
    url, gate = moto_url
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFIRST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", PREFIX)
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "slack_signing_secret,slack_bot_token")
    monkeypatch.setenv("GPUFARM_FARM_CONFIG_PARAMETER", FARM_PARAMETER)
    aws.forget_clients()
    aws.clear_config_cache()
    gate.faults.clear()
    gate.seen.clear()
    yield gate
    gate.faults.clear()
    aws.forget_clients()
    aws.clear_config_cache()


def _settings(path: str, max_retries: int = 1) -> Settings:
    """Settings on a short budget; `direct` turns the direct calls on as the ingress's before-snapshot hook does."""
    aws.forget_clients()
    aws.clear_config_cache()
    settings = Settings(max_retries=max_retries, http_timeout=5)
    if path == "direct":
        aws.use_direct_calls(("ssm", "lambda"), settings)
    return settings


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _both(gate: Gate, run: Callable[[Settings], Any], faults: list[tuple[int, str]], max_retries: int = 1) -> Any:
    """The outcome and the requests made, through the clients and through the direct calls: they must agree."""
    results = {}
    for path in PATHS:
        settings = _settings(path, max_retries)
        gate.seen.clear()
        gate.faults[:] = list(faults)
        outcome = _outcome(lambda settings=settings: run(settings))
        results[path] = (outcome, [seen["op"] for seen in gate.seen])
        gate.faults.clear()
    assert results["direct"] == results["client"]
    return results["direct"]


def _invoke(settings: Settings) -> None:
    aws.LambdaInvoker(settings).invoke(WORKER, {"kind": "request", "n": 8})


def _secrets(settings: Settings) -> dict[str, str]:
    return aws.read_secrets(settings)


GET = "AmazonSSM.GetParameters"
INVOKE = f"POST /2015-03-31/functions/{WORKER}/invocations"


def test_success_same_values_one_call_each(env: Gate) -> None:
    (kind, values), ops = _both(env, _secrets, [])
    assert kind == "value" and ops == [GET]
    assert values == {"slack_signing_secret": SIGNING_SECRET, "slack_bot_token": BOT_TOKEN}
    assert _both(env, _invoke, []) == (("value", None), [INVOKE])


def test_the_direct_invoke_is_an_event_with_the_payload(env: Gate) -> None:
    settings = _settings("direct")
    _invoke(settings)
    (seen,) = env.seen
    assert seen["type"] == "Event"
    assert json.loads(seen["body"]) == {"kind": "request", "n": 8}
    assert "Credential=AKIDFIRST/" in seen["auth"] and "SignedHeaders=" in seen["auth"]


def test_the_signature_covers_the_request_as_sent(env: Gate) -> None:
    settings = _settings("direct")
    _secrets(settings)
    _invoke(settings)
    assert [seen["op"] for seen in env.seen] == [GET, INVOKE]
    for seen in env.seen:
        assert "host" in seen["auth"].split("SignedHeaders=", 1)[1]
        assert signature_holds(seen, AWS_SECRET), seen["op"]
    # The check itself: the botocore client's requests pass it, the same request under another key fails it.
    assert not signature_holds(env.seen[0], "another-secret-key")
    env.seen.clear()
    settings = _settings("client")
    _secrets(settings)
    _invoke(settings)
    assert [signature_holds(seen, AWS_SECRET) for seen in env.seen] == [True, True]


def test_a_missing_parameter_is_a_configuration_error_naming_it(env: Gate) -> None:
    (kind, message), ops = _both(env, lambda s: aws.read_parameters(s, ["/gpufarm/absent"]), [])
    assert kind == ConfigurationMissing.__name__ and "/gpufarm/absent" in message
    assert ops == [GET]


def test_a_missing_secret_reference_is_asked_one_by_one_and_named(env: Gate) -> None:
    names = [aws.secret_parameter(f"{PREFIX}/slack_signing_secret"), aws.secret_parameter(f"{PREFIX}/absent")]
    (kind, message), ops = _both(env, lambda s: aws.read_parameters(s, names), [])
    assert kind == ConfigurationMissing.__name__ and f"{PREFIX}/absent" in message
    assert ops == [GET, GET, GET]


@pytest.mark.parametrize(("status", "code"), [(400, "ThrottlingException"), (503, "ServiceUnavailable")])
def test_one_throttling_or_5xx_answer_is_retried(env: Gate, status: int, code: str) -> None:
    (kind, values), ops = _both(env, _secrets, [(status, code)])
    assert kind == "value" and values["slack_bot_token"] == BOT_TOKEN
    assert ops == [GET, GET]
    assert _both(env, _invoke, [(status, code)]) == (("value", None), [INVOKE, INVOKE])


@pytest.mark.parametrize(("status", "code"), [(400, "ThrottlingException"), (500, "InternalServerError")])
def test_throttling_or_5xx_past_the_retries_is_an_upstream_error(env: Gate, status: int, code: str) -> None:
    # botocore's `retries.max_attempts` counts retries after the first attempt: max_retries=1 is three attempts.
    (kind, message), ops = _both(env, _secrets, [(status, code)] * 4, max_retries=1)
    assert (kind, ops) == (UpstreamError.__name__, [GET] * 3)
    assert code in message
    (kind, message), ops = _both(env, _invoke, [(status, code)] * 4, max_retries=1)
    assert (kind, message, ops) == (UpstreamError.__name__, f"Lambda invoke of {WORKER} failed: {code}", [INVOKE] * 3)


def test_a_refusal_that_is_not_retryable_is_made_once(env: Gate) -> None:
    (kind, message), ops = _both(env, _invoke, [(404, "ResourceNotFoundException")], max_retries=2)
    assert (kind, message, ops) == (
        UpstreamError.__name__,
        f"Lambda invoke of {WORKER} failed: ResourceNotFoundException",
        [INVOKE],
    )
    (kind, message), ops = _both(env, _secrets, [(400, "AccessDeniedException")], max_retries=2)
    assert kind == ConfigurationMissing.__name__ and "AccessDeniedException" in message
    assert ops == [GET]


def test_no_answer_at_all_is_an_upstream_error(env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    for path in PATHS:
        settings = _settings(path, max_retries=0)
        with pytest.raises(UpstreamError, match="failed"):
            _invoke(settings)
        with pytest.raises(UpstreamError, match="failed"):
            _secrets(settings)


def test_credentials_are_read_again_after_a_restore(env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings("direct")
    _invoke(settings)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSECOND")
    _invoke(settings)
    aws.forget_connections()  # what the after-restore hook does
    _invoke(settings)
    keys = [seen["auth"].split("Credential=", 1)[1].split("/", 1)[0] for seen in env.seen]
    assert keys == ["AKIDFIRST", "AKIDFIRST", "AKIDSECOND"]


def test_secrets_reach_no_log_and_no_error(env: Gate, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = _settings("direct")
    assert _secrets(settings)["slack_signing_secret"] == SIGNING_SECRET
    aws.clear_config_cache()
    env.faults[:] = [(400, "ThrottlingException")] * 4
    with pytest.raises(UpstreamError) as failed:
        _secrets(settings)
    endpoint = aws.direct_endpoint("ssm", settings)
    assert endpoint is not None
    env.faults[:] = [(400, "ValidationException")]
    with pytest.raises(Refused) as refused:
        endpoint.call_json("GetParameters", {"Names": [FARM_PARAMETER], "WithDecryption": True})
    said = caplog.text + str(failed.value) + repr(failed.value) + str(refused.value) + repr(refused.value)
    for secret in (SIGNING_SECRET, BOT_TOKEN, AWS_SECRET, "gpu_models"):
        assert secret not in said


def test_error_codes_are_read_as_botocore_reads_them() -> None:
    assert error_code({"x-amzn-errortype": "ResourceNotFoundException:http://internal.amazon.com/"}, b"") == (
        "ResourceNotFoundException"
    )
    assert error_code({}, b'{"__type": "com.amazonaws.ssm#ParameterNotFound"}') == "ParameterNotFound"
    assert error_code({}, b'{"code": "TooManyRequestsException"}') == "TooManyRequestsException"
    assert error_code({}, b"<html>bad gateway</html>") == ""


def test_waits_follow_the_standard_retry_mode(env: Gate) -> None:
    from botocore.credentials import Credentials

    waits: list[float] = []
    url = os.environ["AWS_ENDPOINT_URL"]
    endpoint = AwsEndpoint(
        "ssm",
        endpoint_url=url,
        region=REGION,
        credentials=lambda: Credentials("AKIDWAITS", AWS_SECRET),
        connect_timeout=1,
        read_timeout=5,
        max_attempts=4,
        sleep=waits.append,
        jitter=lambda: 1.0,
    )
    env.faults[:] = [(400, "ThrottlingException"), (503, ""), (429, "")]
    answer = endpoint.call_json("GetParameters", {"Names": [FARM_PARAMETER], "WithDecryption": True})
    assert [p["Name"] for p in answer["Parameters"]] == [FARM_PARAMETER]
    # Throttling: 1 s * 2 ** 0; a 503: 50 ms * 2 ** 1; a 429 naming no code is throttling: 1 s * 2 ** 2.
    assert waits == [1.0, 0.1, 4.0]
    assert len(env.seen) == 4
    with pytest.raises(ValueError, match="not an http"):
        AwsEndpoint(
            "ssm",
            endpoint_url="ftp://x",
            region=REGION,
            credentials=lambda: None,
            connect_timeout=1,
            read_timeout=1,
            max_attempts=1,
        )
