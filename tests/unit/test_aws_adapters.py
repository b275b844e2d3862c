"""AWS adapters: Lambda invokes (botocore Stubber), SQS FIFO and SSM / Secrets Manager (moto)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from botocore.stub import Stubber
from moto import mock_aws

from gpufarm.adapters import aws
from gpufarm.config import Settings, load_settings
from gpufarm.core.errors import NotFound, UpstreamError, ValidationFailed

REGION = "us-east-1"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake credentials and region so boto3 never looks for a real account; no GPUFARM_* leaks in."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name in ("GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    # Powertools caches parameters and secrets per process for max_age seconds.
    parameters.clear_caches()
    yield
    parameters.clear_caches()


# -- choosing the implementation -------------------------------------------------------------------------


def test_factories_build_lambda_and_sqs() -> None:
    url = f"https://sqs.{REGION}.amazonaws.com/123456789012/alloc.fifo"
    assert isinstance(aws.make_invoker(Settings()), aws.LambdaInvoker)
    assert isinstance(aws.make_queue(Settings(), url), aws.SqsFifoQueue)


def test_building_an_invoker_does_not_import_boto3() -> None:
    """The Slack ingress builds its invoker at start and must stay fast: boto3 loads on the first invoke."""
    code = (
        "import sys; from gpufarm.config import Settings; from gpufarm.adapters.aws import make_invoker; "
        "make_invoker(Settings()); print('boto3' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# -- Lambda (Stubber: moto's Lambda without Docker records nothing) ---------------------------------------------


def _stubbed_lambda() -> tuple[Any, Stubber]:
    client = boto3.client("lambda", region_name=REGION)
    return client, Stubber(client)


def test_lambda_invoke_is_async_with_the_json_payload() -> None:
    client, stub = _stubbed_lambda()
    payload = {"kind": "request", "user": "U0000000001", "text": "8 H100"}
    stub.add_response(
        "invoke",
        {"StatusCode": 202},
        {
            "FunctionName": "gpufarm-slack-worker",
            "InvocationType": "Event",
            "Payload": json.dumps(payload, separators=(",", ":"), sort_keys=True).encode(),
        },
    )
    with stub:
        aws.LambdaInvoker(Settings(), client=client).invoke("gpufarm-slack-worker", payload)
    stub.assert_no_pending_responses()


def test_lambda_errors_become_upstream_errors_naming_the_code_only() -> None:
    client, stub = _stubbed_lambda()
    stub.add_client_error("invoke", service_error_code="ResourceNotFoundException", http_status_code=404)
    stub.add_response("invoke", {"StatusCode": 200})
    invoker = aws.LambdaInvoker(Settings(), client=client)
    with stub:
        with pytest.raises(UpstreamError, match="ResourceNotFoundException") as missing:
            invoker.invoke("gpufarm-slack-worker", {"secret": "xoxb-not-in-errors"})
        with pytest.raises(UpstreamError, match="expected 202"):
            invoker.invoke("gpufarm-slack-worker", {})
    assert "xoxb" not in str(missing.value)


@pytest.mark.parametrize(
    ("function", "payload"),
    [("bad name!", {}), ("fn", {"blob": "x" * aws.MAX_PAYLOAD_BYTES}), ("fn", {"when": object()})],
)
def test_lambda_invoke_rejects_bad_input_before_calling_aws(function: str, payload: dict[str, Any]) -> None:
    client, stub = _stubbed_lambda()
    with stub, pytest.raises(ValidationFailed):
        aws.LambdaInvoker(Settings(), client=client).invoke(function, payload)
    stub.assert_no_pending_responses()


# -- SQS FIFO (moto) -------------------------------------------------------------------------------------------


@mock_aws
def test_sqs_fifo_keeps_group_and_drops_duplicates() -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="alloc.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    queue = aws.make_queue(Settings(), url)
    queue.send({"incident_id": "a", "action": "allocate"}, group="pool:onprem-hpc", dedup_id="a-approved")
    queue.send({"incident_id": "a", "action": "allocate"}, group="pool:onprem-hpc", dedup_id="a-approved")
    queue.send({"incident_id": "b", "action": "allocate"}, group="pool:onprem-hpc", dedup_id="b-approved")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"])[
        "Messages"
    ]
    bodies = [json.loads(m["Body"]) for m in got]
    assert [b["incident_id"] for b in bodies] == ["a", "b"]
    assert {m["Attributes"]["MessageGroupId"] for m in got} == {"pool:onprem-hpc"}


@mock_aws
def test_sqs_rejects_bad_ids_and_standard_queues() -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="alloc.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    queue = aws.SqsFifoQueue(Settings(), url)
    with pytest.raises(ValidationFailed, match="group"):
        queue.send({}, group="", dedup_id="x")
    with pytest.raises(ValidationFailed, match="dedup_id"):
        queue.send({}, group="g", dedup_id="x" * 129)
    with pytest.raises(ValidationFailed, match="FIFO"):
        aws.SqsFifoQueue(Settings(), url.removesuffix(".fifo"))


@mock_aws
def test_sqs_missing_queue_is_an_upstream_error() -> None:
    url = f"https://sqs.{REGION}.amazonaws.com/123456789012/missing.fifo"
    with pytest.raises(UpstreamError, match="SQS send failed"):
        aws.SqsFifoQueue(Settings(max_retries=0), url).send({"a": 1}, group="g", dedup_id="d")


# -- farm configuration: SSM (Powertools) or a file ---------------------------------------------------------------

FARM_YAML = "gpu_models:\n  H100: {}\nenvironments:\n  onprem-hpc:\n    gpu_models: [H100]\n"


@mock_aws
def test_farm_text_from_an_ssm_secure_string() -> None:
    boto3.client("ssm", region_name=REGION).put_parameter(Name="/gpufarm/farm", Value=FARM_YAML, Type="SecureString")
    assert aws.load_farm_text(Settings(farm_config_parameter="/gpufarm/farm")) == FARM_YAML


@mock_aws
def test_missing_ssm_parameter_is_not_found() -> None:
    with pytest.raises(NotFound, match="/gpufarm/absent"):
        aws.load_farm_text(Settings(farm_config_parameter="/gpufarm/absent"))


def test_farm_text_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "farm.yaml"
    path.write_text(FARM_YAML)
    assert aws.load_farm_text(Settings(farm_config=str(path))) == FARM_YAML
    with pytest.raises(NotFound, match="does not exist"):
        aws.load_farm_text(Settings(farm_config=str(tmp_path / "nope.yaml")))


def test_no_farm_configuration_says_how_to_give_one() -> None:
    with pytest.raises(NotFound, match="GPUFARM_FARM_CONFIG"):
        aws.load_farm_text(Settings())


# -- settings from Secrets Manager (moto) -------------------------------------------------------------------------


@mock_aws
def test_load_settings_fills_keys_from_secrets_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = {
        "datadog_api_key": "dd-api-from-secret",
        "datadog_app_key": "dd-app-from-secret",
        "slack_bot_token": "xoxb-from-secret",
        "slack_signing_secret": "signing-from-secret",
        "webhook_secret": "hook-from-secret",
    }
    boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="gpufarm/prod", SecretString=json.dumps(secret)
    )
    for name in ("DD_API_KEY", "DD_APP_KEY", "DD_APPLICATION_KEY", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"GPUFARM_{name}", raising=False)
    monkeypatch.delenv("GPUFARM_WEBHOOK_SECRET", raising=False)
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", "gpufarm/prod")
    # A value already in the environment wins over the secret (local overrides stay possible).
    monkeypatch.setenv("GPUFARM_DATADOG_APP_KEY", "dd-app-from-env")

    settings = load_settings()

    assert settings.datadog_api_key is not None
    assert settings.datadog_api_key.get_secret_value() == "dd-api-from-secret"
    assert settings.datadog_app_key is not None
    assert settings.datadog_app_key.get_secret_value() == "dd-app-from-env"
    assert settings.webhook_secret is not None
    assert settings.webhook_secret.get_secret_value() == "hook-from-secret"
    assert "from-secret" not in repr(settings)
    assert "from-secret" not in settings.model_dump_json()
