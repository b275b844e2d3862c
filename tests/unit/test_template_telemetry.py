"""template.yaml: JSON logs, the Datadog extension wired when its parameters are set, every variable read by
something, the worker's dead-letter queue and alarms, and webhook paths bounded by Datadog's 15 s delivery timeout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.shared import constants as powertools

from gpufarm.config import Settings
from gpufarm.handlers import runtime as rt
from gpufarm.handlers.telemetry import SERVICE_ENV
from gpufarm_sandbox.localhost.env import Resolver, Urls, function_environment, local_parameters
from gpufarm_sandbox.localhost.template import load_template, load_yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
BASE = "http://127.0.0.1:8320"
EXTENSION_LAYER = "arn:aws:lambda:us-east-1:464622532012:layer:Datadog-Extension-ARM:88"
API_KEY_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:datadog/api-key-AbCdEf"
# What the Datadog Lambda extension reads (its documented configuration); nothing else of DD_ belongs here.
EXTENSION_VARIABLES = {"DD_SITE", "DD_API_KEY_SECRET_ARN", "DD_SERVICE", "DD_TRACE_ENABLED"}
DATADOG_DELIVERY_TIMEOUT_S = 15  # docs/datadog.md, webhooks: delivery


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = load_yaml(TEMPLATE.read_text())
    assert isinstance(data, dict)
    return data


def functions(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in raw["Resources"].items() if v["Type"] == "AWS::Serverless::Function"}


def test_every_function_logs_json_at_the_configured_level_into_its_own_group(raw: dict[str, Any]) -> None:
    logging_config = raw["Globals"]["Function"]["LoggingConfig"]
    assert logging_config == {"LogFormat": "JSON", "ApplicationLogLevel": {"Ref": "LogLevel"}, "SystemLogLevel": "INFO"}
    assert raw["Parameters"]["LogLevel"]["AllowedValues"] == ["DEBUG", "INFO", "WARN", "ERROR"]
    for logical_id, props in functions(raw).items():
        # Per function only the log group: SAM merges it into the global LoggingConfig.
        assert set(props["LoggingConfig"]) == {"LogGroup"}, logical_id
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert raw["Resources"][group]["Type"] == "AWS::Logs::LogGroup"


def _readers() -> set[str]:
    """Every environment variable gpufarm's code or its tools read."""
    names = {rt.QUEUE_URL_ENV, SERVICE_ENV, powertools.POWERTOOLS_LOG_LEVEL_ENV}
    for setting in Settings.FIELDS.values():
        names |= set(setting.variables)
    return names | EXTENSION_VARIABLES | _library_readers()


def _library_readers() -> set[str]:
    """Variables a library the functions ship reads, each found in that library's own source (so it cannot drift)."""
    import inspect

    from pydantic.plugin import _loader

    read = {"PYDANTIC_DISABLE_PLUGINS"}  # pydantic's plugin loader: gpufarm uses no pydantic plugins
    assert all(name in inspect.getsource(_loader) for name in read)
    return read


def test_every_variable_the_template_sets_is_read_by_something(raw: dict[str, Any]) -> None:
    variables = set(raw["Globals"]["Function"]["Environment"]["Variables"])
    for props in functions(raw).values():
        variables |= set((props.get("Environment") or {}).get("Variables") or {})
    assert variables - _readers() == set()
    assert {"LOG_LEVEL", "POWERTOOLS_METRICS_NAMESPACE"} & variables == set()
    assert raw["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_LOG_LEVEL"] == {"Ref": "LogLevel"}


def _resolved(parameters: dict[str, str]) -> tuple[list[Any], dict[str, str], list[Any]]:
    template = load_template(TEMPLATE)
    resolver = Resolver(template, Urls(BASE), local_parameters(template, parameters))
    layers = resolver.resolve(template.global_function["Layers"])
    env = function_environment(resolver, template.global_function["Environment"]["Variables"])
    policy = template.resources["FunctionConfigReadPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert resolver.unresolved == set()
    return layers, env, resolver.resolve(policy)


def test_the_datadog_extension_is_wired_when_its_parameters_are_set() -> None:
    layers, env, statements = _resolved(
        {"DatadogExtensionLayerArn": EXTENSION_LAYER, "DatadogApiKeySecretArn": API_KEY_SECRET}
    )
    assert layers == ["GpufarmLayer", EXTENSION_LAYER]
    assert {k: v for k, v in env.items() if k.startswith("DD_")} == {
        "DD_SITE": "datadoghq.com",
        "DD_API_KEY_SECRET_ARN": API_KEY_SECRET,
        "DD_SERVICE": "gpufarm",
        "DD_TRACE_ENABLED": "false",
    }
    key_grants = [s for s in statements if s["Resource"] == API_KEY_SECRET]
    assert key_grants == [
        {
            "Sid": "DatadogExtensionApiKey",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": API_KEY_SECRET,
        }
    ]


def test_without_its_parameters_there_is_no_extension_nor_its_grant(raw: dict[str, Any]) -> None:
    layers, env, statements = _resolved({})
    assert layers == ["GpufarmLayer"]
    assert not [k for k in env if k.startswith("DD_")]
    assert [s["Sid"] for s in statements] == ["FarmConfiguration"]
    # A layer without the key's secret is refused at deploy time instead of running an extension with no key.
    rule = raw["Rules"]["DatadogExtensionNeedsItsApiKey"]
    assert rule["RuleCondition"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "DatadogExtensionLayerArn"}, ""]}]}
    assert rule["Assertions"][0]["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "DatadogApiKeySecretArn"}, ""]}]}


def test_failed_worker_invocations_land_in_an_encrypted_dead_letter_queue(raw: dict[str, Any]) -> None:
    worker = functions(raw)["SlackWorkerFunction"]["EventInvokeConfig"]
    assert worker["MaximumRetryAttempts"] == 0
    assert worker["DestinationConfig"] == {
        "OnFailure": {"Type": "SQS", "Destination": {"Fn::GetAtt": ["SlackWorkerDeadLetterQueue", "Arn"]}}
    }
    queue = raw["Resources"]["SlackWorkerDeadLetterQueue"]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True and queue["MessageRetentionPeriod"] == 1_209_600
    assert raw["Outputs"]["SlackWorkerDeadLetterQueueUrl"]["Value"] == {"Ref": "SlackWorkerDeadLetterQueue"}


@pytest.mark.parametrize(
    ("alarm", "queue"),
    [
        ("SlackWorkerDeadLetterAlarm", "SlackWorkerDeadLetterQueue"),
        ("AllocationDeadLetterAlarm", "AllocationDeadLetterQueue"),
    ],
)
def test_a_message_in_a_dead_letter_queue_raises_an_alarm(raw: dict[str, Any], alarm: str, queue: str) -> None:
    props = raw["Resources"][alarm]["Properties"]
    assert (props["Namespace"], props["MetricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert props["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
    assert (props["ComparisonOperator"], props["Threshold"], props["TreatMissingData"]) == (
        "GreaterThanThreshold",
        0,
        "notBreaching",
    )
    assert props["AlarmActions"] == {"Fn::If": ["WithAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


def test_webhook_paths_answer_within_datadogs_delivery_timeout() -> None:
    template = load_template(TEMPLATE)
    # The idle alert does its work on the URL path: the function stops before Datadog gives up.
    assert template.functions["IdleAlertFunction"].timeout < DATADOG_DELIVERY_TIMEOUT_S
    # The incident webhook's URL path makes two calls (read the incident, queue it), each once, each bounded by a
    # connect and a read timeout; its 60 s Timeout is for the queue consumer.
    assert 2 * 2 * rt.WEBHOOK_HTTP_TIMEOUT_S < DATADOG_DELIVERY_TIMEOUT_S
    assert template.functions["IncidentWebhookFunction"].timeout == 60


def test_the_webhook_runtime_calls_once_with_short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("GPUFARM_", "DD_", "SLACK_"))]:
        monkeypatch.delenv(name)
    rt.reset()
    try:
        runtime = rt.current()
        bounded = runtime.for_webhook()
        assert (bounded.settings.http_timeout, bounded.settings.max_retries) == (rt.WEBHOOK_HTTP_TIMEOUT_S, 0)
        assert (runtime.settings.http_timeout, runtime.settings.max_retries) == (10.0, 3)
        assert runtime.for_webhook() is bounded
    finally:
        rt.reset()
