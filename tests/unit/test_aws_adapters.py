"""AWS adapters: Lambda invokes (botocore Stubber), SQS FIFO, and the secret + farm parameter in one SSM call (moto)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from gpufarm.adapters import aws
from gpufarm.config import SECRET_KEYS, ConfigurationError, ConfigurationMissing, Settings
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed

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
    # Secret and parameter values are cached per process for CONFIG_MAX_AGE_S.
    aws.clear_config_cache()
    yield
    aws.clear_config_cache()


# -- choosing the implementation -------------------------------------------------------------------------


def test_factories_build_lambda_and_sqs() -> None:
    url = f"https://sqs.{REGION}.amazonaws.com/123456789012/alloc.fifo"
    assert isinstance(aws.make_invoker(Settings()), aws.LambdaInvoker)
    assert isinstance(aws.make_queue(Settings(), url), aws.SqsFifoQueue)


def test_building_an_invoker_imports_neither_boto3_nor_botocore() -> None:
    """The Slack ingress builds its invoker at start and must stay fast: botocore loads on the first invoke."""
    code = (
        "import sys; from gpufarm.config import Settings; from gpufarm.adapters.aws import make_invoker; "
        "make_invoker(Settings()); print('boto3' in sys.modules, 'botocore' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False False"


def test_clients_come_from_one_botocore_session_per_budget() -> None:
    """One session parses botocore's endpoint data once; a client is reused per service and timeout budget."""
    ssm = aws.aws_client("ssm", Settings())
    assert aws.aws_client("ssm", Settings()) is ssm
    assert aws.aws_client("ssm", Settings(http_timeout=3, max_retries=0)) is not ssm
    lam = aws.aws_client("lambda", Settings())
    assert lam._endpoint.http_session is not ssm._endpoint.http_session
    assert {type(c).__module__ for c in (ssm, lam)} == {"botocore.client"}
    aws.forget_connections()
    assert aws.aws_client("ssm", Settings()) is ssm


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


# -- the secret and the farm configuration: one SSM call (moto), or a file -------------------------------------------

FARM_YAML = "gpu_models:\n  H100: {}\nenvironments:\n  onprem-hpc:\n    gpu_models: [H100]\n"
SECRET = {
    "datadog_api_key": "dd-api-from-secret",
    "datadog_app_key": "dd-app-from-secret",
    "slack_bot_token": "xoxb-from-secret",
    "slack_signing_secret": "signing-from-secret",
    "webhook_secret": "hook-from-secret",
}


def _count_calls(settings: Settings) -> list[str]:
    """The SSM operations the shared client makes from now on."""
    calls: list[str] = []
    client = aws.aws_client("ssm", settings)
    client.meta.events.register("before-call.ssm.*", lambda model, **_: calls.append(model.name))
    return calls


def _put_keys(values: dict[str, str], prefix: str = "gpufarm/prod") -> None:
    client = boto3.client("secretsmanager", region_name=REGION)
    for key, value in values.items():
        client.create_secret(Name=f"{prefix}/{key}", SecretString=value)


@pytest.fixture
def deployment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Per-key secrets and a farm parameter in moto, and the environment that names them (as the template sets it)."""
    for name in ("DD_API_KEY", "DD_APP_KEY", "DD_APPLICATION_KEY", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"GPUFARM_{name}", raising=False)
    monkeypatch.delenv("GPUFARM_WEBHOOK_SECRET", raising=False)
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", "gpufarm/prod")
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", ",".join(SECRET))
    monkeypatch.setenv("GPUFARM_FARM_CONFIG_PARAMETER", "/gpufarm/farm")
    with mock_aws():
        _put_keys(SECRET)
        boto3.client("ssm", region_name=REGION).put_parameter(
            Name="/gpufarm/farm", Value=FARM_YAML, Type="SecureString"
        )
        yield Settings()


def test_secret_keys_and_farm_arrive_in_one_get_parameters_call(deployment: Settings) -> None:
    calls = _count_calls(deployment)
    settings = aws.load_settings()
    assert settings.slack_signing_secret is not None
    assert settings.slack_signing_secret.get_secret_value() == "signing-from-secret"
    assert settings.require("webhook_secret") == "hook-from-secret"
    assert aws.load_farm_text(settings) == FARM_YAML
    assert calls == ["GetParameters"]


def test_a_function_reads_only_the_keys_it_declares(deployment: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key left out of GPUFARM_SECRET_KEYS is not read, and asking for it names the key and the function."""
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "slack_signing_secret,slack_bot_token")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "gpufarm-SlackIngressFunction")
    calls = _count_calls(deployment)
    settings = aws.load_settings()
    assert settings.require("slack_bot_token") == "xoxb-from-secret"
    assert settings.datadog_api_key is None and settings.webhook_secret is None
    with pytest.raises(
        ConfigurationMissing, match="gpufarm-SlackIngressFunction is not given the secret key 'webhook_secret'"
    ):
        settings.require("webhook_secret")
    assert calls == ["GetParameters"]


def test_in_lambda_without_declared_keys_no_key_is_read(deployment: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFARM_SECRET_KEYS")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "gpufarm-Fn")
    assert aws.secret_keys_to_read(Settings()) == ()
    settings = aws.load_settings()
    assert settings.slack_bot_token is None
    with pytest.raises(ConfigurationMissing, match="gpufarm-Fn is not given the secret key 'slack_bot_token'"):
        settings.require("slack_bot_token")


def test_an_operator_command_reads_every_key_there_is(deployment: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside Lambda and without GPUFARM_SECRET_KEYS (`gpufarm doctor`, `datadog apply`): every key that exists."""
    monkeypatch.delenv("GPUFARM_SECRET_KEYS")
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    assert aws.read_secrets(Settings()) == SECRET


def test_every_key_and_the_farm_fit_one_get_parameters_call(
    deployment: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's command reads every key gpufarm has, with the farm, in one call of at most 10 names."""
    monkeypatch.delenv("GPUFARM_SECRET_KEYS")
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    _put_keys({k: f"{k}-value-0000000000" for k in SECRET_KEYS if k not in SECRET})
    calls = _count_calls(deployment)
    assert len(aws.read_secrets(Settings())) == len(SECRET_KEYS) and len(SECRET_KEYS) + 1 <= 10
    assert calls == ["GetParameters"]


def test_an_unknown_declared_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "slack_bot_token,aws_root_key")
    with pytest.raises(ConfigurationError, match="'aws_root_key', which is not a gpufarm secret key"):
        aws.read_secrets(Settings(secrets_name="gpufarm/prod"))


def test_a_missing_key_is_left_out_and_named_when_needed(deployment: Settings) -> None:
    boto3.client("secretsmanager", region_name=REGION).delete_secret(
        SecretId="gpufarm/prod/slack_signing_secret", ForceDeleteWithoutRecovery=True
    )
    settings = aws.load_settings()
    with pytest.raises(
        ConfigurationMissing, match=r"^secret gpufarm/prod/slack_signing_secret \(Secrets Manager\) does not exist"
    ) as missing:
        settings.require("slack_signing_secret")
    assert isinstance(missing.value, NotFound)
    assert settings.require("slack_bot_token") == "xoxb-from-secret"
    assert aws.load_farm_text(settings) == FARM_YAML


def test_values_are_cached_for_their_max_age(deployment: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_calls(deployment)
    aws.read_secrets(deployment)
    aws.load_farm_text(deployment)
    assert calls == ["GetParameters"]
    later = aws.time.monotonic() + aws.CONFIG_MAX_AGE_S + 1
    monkeypatch.setattr(aws.time, "monotonic", lambda: later)
    assert aws.load_farm_text(deployment) == FARM_YAML
    assert calls == ["GetParameters", "GetParameters"]


def test_farm_text_from_an_ssm_secure_string(deployment: Settings) -> None:
    assert aws.load_farm_text(Settings(secrets_name=None)) == FARM_YAML


def test_a_missing_parameter_names_the_parameter(deployment: Settings) -> None:
    settings = Settings(farm_config_parameter="/gpufarm/absent")
    # The keys still load (the farm parameter only came along); reading the farm names what is missing.
    assert aws.read_secrets(settings) == SECRET
    with pytest.raises(ConfigurationMissing, match=r"^SSM parameter /gpufarm/absent does not exist") as missing:
        aws.load_farm_text(settings)
    assert isinstance(missing.value, NotFound)


def test_without_a_secret_a_missing_setting_names_its_variable() -> None:
    with pytest.raises(ConfigurationMissing, match=r"^GPUFARM_WEBHOOK_SECRET is not set$"):
        Settings(webhook_secret=None).require("webhook_secret")


def test_an_empty_parameter_is_a_configuration_error(deployment: Settings) -> None:
    boto3.client("ssm", region_name=REGION).put_parameter(Name="/gpufarm/empty", Value=" ", Type="String")
    with pytest.raises(ConfigurationMissing, match="SSM parameter /gpufarm/empty is empty"):
        aws.load_farm_text(Settings(farm_config_parameter="/gpufarm/empty"))


def test_ssm_naming_the_reference_path_or_the_secret_both_match() -> None:
    """Parameter Store may answer a referenced secret under the reference path or under the secret's own name."""
    for answered in ("/aws/reference/secretsmanager/gpufarm/prod/slack_bot_token", "gpufarm/prod/slack_bot_token"):
        aws.clear_config_cache()
        client = boto3.client("ssm", region_name=REGION)
        stub = Stubber(client)
        stub.add_response(
            "get_parameters",
            {"Parameters": [{"Name": answered, "Type": "SecureString", "Value": "xoxb-1"}]},
        )
        with stub:
            aws._clients[("ssm", 10.0, 3)] = client
            try:
                settings = Settings(
                    secrets_name="gpufarm/prod", secret_keys="slack_bot_token", farm_config_parameter=None
                )
                assert aws.read_secrets(settings) == {"slack_bot_token": "xoxb-1"}
            finally:
                del aws._clients[("ssm", 10.0, 3)]


def test_access_denied_is_a_configuration_error_naming_what() -> None:
    client = boto3.client("ssm", region_name=REGION)
    stub = Stubber(client)
    stub.add_client_error("get_parameters", service_error_code="AccessDeniedException", http_status_code=400)
    with stub:
        aws._clients[("ssm", 10.0, 3)] = client
        try:
            with pytest.raises(ConfigurationMissing, match="may not read secret gpufarm/prod/webhook_secret"):
                aws.read_secrets(
                    Settings(secrets_name="gpufarm/prod", secret_keys="webhook_secret", farm_config_parameter=None)
                )
        finally:
            del aws._clients[("ssm", 10.0, 3)]


def test_farm_text_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "farm.yaml"
    path.write_text(FARM_YAML)
    assert aws.load_farm_text(Settings(farm_config=str(path))) == FARM_YAML
    with pytest.raises(ConfigurationMissing, match="does not exist"):
        aws.load_farm_text(Settings(farm_config=str(tmp_path / "nope.yaml")))


def test_no_farm_configuration_says_how_to_give_one() -> None:
    with pytest.raises(NotFound, match="GPUFARM_FARM_CONFIG"):
        aws.load_farm_text(Settings())


def test_load_settings_fills_keys_from_the_secret(deployment: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # A value already in the environment wins over the secret (local overrides stay possible).
    monkeypatch.setenv("GPUFARM_DATADOG_APP_KEY", "dd-app-from-env")

    settings = aws.load_settings()

    assert settings.datadog_api_key is not None
    assert settings.datadog_api_key.get_secret_value() == "dd-api-from-secret"
    assert settings.datadog_app_key is not None
    assert settings.datadog_app_key.get_secret_value() == "dd-app-from-env"
    assert settings.webhook_secret is not None
    assert settings.webhook_secret.get_secret_value() == "hook-from-secret"
    assert "from-secret" not in repr(settings)
    assert "from-secret" not in str(settings)


def test_settings_read_the_environment_and_keyword_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DD_SITE", "datadoghq.eu")
    monkeypatch.delenv("GPUFARM_DATADOG_SITE", raising=False)
    monkeypatch.setenv("gpufarm_worker_function", "worker-from-env")
    monkeypatch.setenv("GPUFARM_MAX_RETRIES", "2")
    settings = Settings()
    assert (settings.datadog_site, settings.worker_function, settings.max_retries) == (
        "datadoghq.eu",
        "worker-from-env",
        2,
    )
    assert Settings(max_retries=5).max_retries == 5
    monkeypatch.setenv("GPUFARM_MAX_RETRIES", "99")
    with pytest.raises(ValueError, match="max_retries"):
        Settings()
