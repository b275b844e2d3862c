"""template.yaml: cfn-lint clean, and the structure the local function host relies on; template and schedule parsing."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import lint, lint_file
from secret_uses import function_keys

from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.localhost.env import Resolver, Urls, build_environment, local_parameters, redacted
from gpufarm_sandbox.localhost.schedule import Expression, ScheduleError
from gpufarm_sandbox.localhost.template import TemplateError, load_template, load_yaml

REPO = Path(__file__).resolve().parent.parent.parent
TEMPLATE = REPO / "template.yaml"
FUNCTIONS = (
    "slack_ingress",
    "slack_worker",
    "incident_webhook",
    "idle_alert",
    "quota_sync",
    "profile_pages",
    "profile_upload",
    "daily_digest",
)
BASE = "http://127.0.0.1:8320"
FN = "  F:\n    Type: AWS::Serverless::Function\n    Properties:"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = load_yaml(TEMPLATE.read_text())
    assert isinstance(data, dict)
    return data


def resources(raw: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in raw["Resources"].items() if v["Type"] == kind}


def test_cfn_lint_passes_without_errors_or_warnings() -> None:
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in lint_file(TEMPLATE)] == []


def test_cfn_lint_checks_the_serverless_schema() -> None:
    # The classic mistake the reference warns about: a bare OFF is YAML false and must fail the lint.
    broken = TEMPLATE.read_text().replace('Mode: "OFF"', "Mode: OFF")
    assert "E3017" in {m.rule.id for m in lint(broken)}


def test_globals_layer_and_parameters(raw: dict[str, Any]) -> None:
    fn = raw["Globals"]["Function"]
    assert (fn["Runtime"], fn["Architectures"]) == ("python3.12", ["arm64"])
    assert fn["Layers"][0] == {"Ref": "GpufarmLayer"}
    variables = fn["Environment"]["Variables"]
    assert variables["GPUFARM_SECRETS_NAME"] == {"Ref": "SecretsName"}
    assert variables["GPUFARM_DATADOG_SITE"] == {"Ref": "DatadogSite"}
    assert variables["GPUFARM_FARM_CONFIG_PARAMETER"] == {"Fn::Sub": "/${FarmConfigParameter}"}
    assert variables["POWERTOOLS_SERVICE_NAME"] == "gpufarm"
    layer = raw["Resources"]["GpufarmLayer"]
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "layers/gpufarm"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    assert layer["Metadata"] == {"BuildMethod": "python3.12", "BuildArchitecture": "arm64"}
    assert {"DatadogSite", "SecretsName", "FarmConfigParameter", "OperatorsUsergroup", "OperatorsChannel"} <= set(
        raw["Parameters"]
    )
    assert (REPO / "layers" / "gpufarm" / "requirements.txt").is_file()


# Every site Datadog lists (its "Getting Started with Datadog Sites" page): the DatadogSite parameter takes each.
DATADOG_SITES = [
    "datadoghq.com",
    "us3.datadoghq.com",
    "us5.datadoghq.com",
    "datadoghq.eu",
    "ap1.datadoghq.com",
    "ap2.datadoghq.com",
    "uk1.datadoghq.com",
    "ddog-gov.com",
    "us2.ddog-gov.com",
]


def test_every_datadog_site_is_a_deployable_site(raw: dict[str, Any]) -> None:
    site = raw["Parameters"]["DatadogSite"]
    assert site["AllowedValues"] == DATADOG_SITES and site["Default"] == "datadoghq.com"


def test_functions_handlers_and_folders() -> None:
    template = load_template(TEMPLATE)
    assert {f.dir_name for f in template.functions.values()} == set(FUNCTIONS)
    for spec in template.functions.values():
        assert spec.handler == f"{spec.dir_name}.handler" and spec.code_uri == f"functions/{spec.dir_name}"
        requirements = REPO / spec.code_uri / "requirements.txt"
        assert requirements.is_file()
        # Dependencies come from the layer: the function's own requirements stay comment-only.
        assert all(not line.strip() or line.startswith("#") for line in requirements.read_text().splitlines())
    ingress = template.functions["SlackIngressFunction"]
    assert (ingress.url, ingress.memory, ingress.timeout) == (True, 512, 10)
    assert ingress.environment["GPUFARM_WORKER_FUNCTION"] == {"Ref": "SlackWorkerFunction"}
    worker = template.functions["SlackWorkerFunction"]
    assert (worker.url, worker.max_retries, worker.max_event_age, worker.timeout) == (False, 0, 900, 60)
    assert template.functions["IdleAlertFunction"].url is True
    uploads = template.functions["ProfileUploadFunction"]
    assert uploads.url is True
    assert uploads.environment["GPUFARM_ALLOCATION_QUEUE_URL"] == {"Ref": "AllocationQueue"}
    webhook = template.functions["IncidentWebhookFunction"]
    assert webhook.url is True
    (event,) = webhook.queues
    assert (event.queue, event.batch_size, event.report_failures) == ("AllocationQueue", 1, True)
    assert webhook.environment["GPUFARM_ALLOCATION_QUEUE_URL"] == {"Ref": "AllocationQueue"}
    schedule, sweep = template.functions["QuotaSyncFunction"].schedules
    assert (schedule.kind, schedule.expression, schedule.enabled) == ("ScheduleV2", "rate(15 minutes)", True)
    # The sweep: every minute, so no step waits on a webhook for more than two (gpufarm.core.sync.sweep).
    assert (sweep.kind, sweep.expression, sweep.enabled) == ("ScheduleV2", "rate(1 minute)", True)
    assert sweep.input is not None and json.loads(sweep.input) == {"job": "sweep"}
    (digest,) = template.functions["DailyDigestFunction"].schedules
    assert (digest.kind, digest.expression, digest.timezone) == ("ScheduleV2", "cron(0/15 * * * ? *)", "UTC")
    assert digest.input is not None and "<aws.scheduler.scheduled-time>" in digest.input


def test_allocation_queue_is_fifo_with_a_dead_letter_queue(raw: dict[str, Any]) -> None:
    template = load_template(TEMPLATE)
    queue = template.queues["AllocationQueue"]
    assert (queue.fifo, queue.content_dedup, queue.max_receives) == (True, False, 3)
    assert queue.visibility_timeout >= 6 * template.functions["IncidentWebhookFunction"].timeout
    assert queue.dead_letter_queue == "AllocationDeadLetterQueue"
    assert template.queues["AllocationDeadLetterQueue"].fifo is True


def test_schedule_quotes_off_and_has_a_dead_letter_queue(raw: dict[str, Any]) -> None:
    props = raw["Resources"]["QuotaSyncFunction"]["Properties"]["Events"]["Every15Minutes"]["Properties"]
    assert props["FlexibleTimeWindow"] == {"Mode": "OFF"}  # a string, not YAML's false
    assert props["DeadLetterConfig"] == {"Type": "SQS"}


# -- least privilege: each function's grants are exactly what its code calls ----------------------------------------

LAYER_CODE = REPO / "layers" / "gpufarm" / "gpufarm"


def secret_grants(function_dir: str) -> set[tuple[str, str]]:
    """The secret keys the function's code reads (tests/secret_uses.py), each its own secret: GetSecretValue, asked
    for through Parameter Store's reference path (adapters.aws.read_secrets)."""
    return {
        grant
        for key in function_keys(function_dir)
        for grant in (
            ("secretsmanager:GetSecretValue", f"secret:SecretsName/{key}"),
            ("ssm:GetParameters", f"parameter:aws/reference/secretsmanager/SecretsName/{key}"),
        )
    }


FARM = {("ssm:GetParameters", "parameter:FarmConfigParameter")}  # adapters.aws.load_farm_text
SEND = ("sqs:SendMessage", "AllocationQueue")  # adapters.aws.SqsFifoQueue, where GPUFARM_ALLOCATION_QUEUE_URL is set
INVOKE = ("lambda:InvokeFunction", "SlackWorkerFunction")  # adapters.aws.LambdaInvoker, the ingress's hand-off
DD_KEY = ("secretsmanager:GetSecretValue", "DatadogApiKeySecretArn")  # the Datadog extension, when installed
WORKER_DLQ = ("sqs:SendMessage", "SlackWorkerDeadLetterQueue")  # Lambda's on-failure destination (SAM adds it)
EVERY = FARM | {DD_KEY}
# adapters.aws_inventory: EC2 describes (no resource-level permission) and the P and G On-Demand quotas.
AWS_INVENTORY = {
    ("ec2:DescribeInstances", "*"),
    ("ec2:DescribeInstanceTypes", "*"),
    ("ec2:DescribeCapacityReservations", "*"),
    ("servicequotas:GetServiceQuota", "quota:ec2/L-417A185B"),
    ("servicequotas:GetServiceQuota", "quota:ec2/L-DB2E81BA"),
    ("servicequotas:GetAWSDefaultServiceQuota", "*"),
}
# The cached list prices (gpufarm.adapters.price_cache): read where GPU-hours are priced; the sync refreshes them.
PRICE_READ = ("s3:GetObject", "ProfileBucket")
PRICE_REFRESH = {("pricing:GetProducts", "*"), ("s3:PutObject", "ProfileBucket"), ("s3:ListBucket", "ProfileBucket")}
# What each function's code calls in AWS (follow each handler through gpufarm.handlers.runtime).
CALLS = {
    "SlackIngressFunction": EVERY | secret_grants("slack_ingress") | {INVOKE},  # verify, farm, modal, hand off
    # Reads; incident changes queued as commands.
    "SlackWorkerFunction": EVERY | secret_grants("slack_worker") | {WORKER_DLQ, SEND, PRICE_READ},
    # URL: read the incident, queue it; SQS: allocate, reclaim.
    "IncidentWebhookFunction": EVERY | secret_grants("incident_webhook") | {SEND, PRICE_READ},
    # Idle warning and reclaim, queued in the incident's pool group.
    "IdleAlertFunction": EVERY | secret_grants("idle_alert") | {SEND},
    # The sync; pool repairs go through the allocation queue.
    "QuotaSyncFunction": EVERY | secret_grants("quota_sync") | {SEND, PRICE_READ} | AWS_INVENTORY | PRICE_REFRESH,
    # A run's page, for a signed link.
    "ProfilePagesFunction": EVERY | secret_grants("profile_pages") | {("s3:GetObject", "ProfileBucket")},
    # An upload-token holder's traces: PUT URLs presigned for incoming/, read, stored under profiles/, deleted; the
    # run recorded as a command in its incident's pool group.
    "ProfileUploadFunction": EVERY
    | secret_grants("profile_upload")
    | {
        SEND,
        ("s3:PutObject", "ProfileBucket"),
        ("s3:GetObject", "ProfileBucket"),
        ("s3:DeleteObject", "ProfileBucket"),
    },
    # Reads Datadog and the cached list prices, posts to Slack; writes nothing.
    "DailyDigestFunction": EVERY | secret_grants("daily_digest") | {PRICE_READ},
}


def _resource_tokens(resource: Any) -> list[str]:
    """A grant's resources as short names: the resource, parameter or secret each points at."""
    if isinstance(resource, list):
        return [token for item in resource for token in _resource_tokens(item)]
    if resource == "*":
        return ["*"]  # only actions AWS authorizes on no resource (EC2 describes)
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        text = str(resource["Fn::Sub"])
        if text.startswith("${ProfileBucket.Arn}"):
            return ["ProfileBucket"]
        if ":servicequotas:" in text:
            return [f"quota:{text.rsplit(':', 1)[1]}"]
        for kind, marker in (("secret", ":secret:"), ("parameter", ":parameter/")):
            if marker in text:
                named = text.split(marker, 1)[1].replace("${", "").replace("}", "")
                return [f"{kind}:{named.removesuffix('-*').removesuffix('-??????')}"]
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        return [str(resource["Fn::GetAtt"][0])]
    if isinstance(resource, dict) and "Ref" in resource:
        return [str(resource["Ref"])]
    raise AssertionError(f"unexpected grant resource {resource!r}")


def _statements(statements: list[Any]) -> set[tuple[str, str]]:
    grants: set[tuple[str, str]] = set()
    for entry in statements:
        # A conditional statement (the Datadog extension's key) counts with its granting branch.
        statement = entry["Fn::If"][1] if "Fn::If" in entry else entry
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions), f"wildcard action in {statement}"
        grants |= {(action, token) for action in actions for token in _resource_tokens(statement["Resource"])}
    return grants


def granted(raw: dict[str, Any], logical_id: str) -> set[tuple[str, str]]:
    """Every (action, resource) the function's role gets; SAM policy templates are refused (they grant more)."""
    props = raw["Resources"][logical_id]["Properties"]
    grants: set[tuple[str, str]] = set()
    for policy in props.get("Policies", []):
        if "Ref" in policy:
            managed = raw["Resources"][policy["Ref"]]
            assert managed["Type"] == "AWS::IAM::ManagedPolicy", policy
            grants |= _statements(managed["Properties"]["PolicyDocument"]["Statement"])
        elif "Statement" in policy:
            grants |= _statements(policy["Statement"])
        else:
            raise AssertionError(f"{logical_id}: {next(iter(policy))} grants more than the code calls")
    on_failure = props.get("EventInvokeConfig", {}).get("DestinationConfig", {}).get("OnFailure")
    if on_failure:
        grants |= {("sqs:SendMessage", token) for token in _resource_tokens(on_failure["Destination"])}
    return grants


def test_each_function_is_granted_exactly_what_its_code_calls(raw: dict[str, Any]) -> None:
    functions = resources(raw, "AWS::Serverless::Function")
    assert set(functions) == set(CALLS)
    for logical_id in functions:
        assert granted(raw, logical_id) == CALLS[logical_id], logical_id
    for group in resources(raw, "AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_grants_follow_the_wiring_the_code_reads(raw: dict[str, Any]) -> None:
    # The queue and the worker are reached only through the variables the runtime reads.
    template = load_template(TEMPLATE)
    for logical_id, spec in template.functions.items():
        assert (SEND in CALLS[logical_id]) == ("GPUFARM_ALLOCATION_QUEUE_URL" in spec.environment), logical_id
        assert (INVOKE in CALLS[logical_id]) == ("GPUFARM_WORKER_FUNCTION" in spec.environment), logical_id


# How the layer's code reaches AWS -> the IAM action it needs. A botocore/boto3 client call is `.<operation>(` with
# keyword arguments; Powertools' parameters utility is `parameters.get_secret(` / `parameters.get_parameter(`.
CODE_CALLS = {
    r"\.invoke\(\s*FunctionName": "lambda:InvokeFunction",
    r"\.send_message\(\s*QueueUrl": "sqs:SendMessage",
    r"\.get_parameters\(\s*Names": "ssm:GetParameters",
    r"\.get_parameter\(\s*Name": "ssm:GetParameter",
    r"\.get_secret_value\(\s*SecretId": "secretsmanager:GetSecretValue",
    r"parameters\.get_parameter\(": "ssm:GetParameter",
    r"parameters\.get_secret\(": "secretsmanager:GetSecretValue",
    # Parameter Store hands out a Secrets Manager secret under this path; the caller needs GetSecretValue too.
    r"/aws/reference/secretsmanager/": "secretsmanager:GetSecretValue",
    # adapters.aws_inventory passes the client's methods to its pager: `ec2.describe_instances,`.
    r"\.describe_instances\b": "ec2:DescribeInstances",
    r"\.describe_instance_types\b": "ec2:DescribeInstanceTypes",
    r"\.describe_capacity_reservations\b": "ec2:DescribeCapacityReservations",
    r"\.get_service_quota\b": "servicequotas:GetServiceQuota",
    r"\.get_aws_default_service_quota\b": "servicequotas:GetAWSDefaultServiceQuota",
    r"\.put_object\(\s*Bucket": "s3:PutObject",
    r"\.get_object\(\s*Bucket": "s3:GetObject",
    r"\.delete_object\(\s*Bucket": "s3:DeleteObject",
    r"\.head_object\(\s*Bucket": "s3:GetObject",
    r"generate_presigned_url\(\s*\"put_object\"": "s3:PutObject",
    r"\.get_products\(": "pricing:GetProducts",
    # adapters.price_cache: S3 answers a missing cache NoSuchKey only to a caller that may list the bucket.
    r"s3:ListBucket": "s3:ListBucket",
}
CLIENT_RE = re.compile(r"(?:_LazyClient|aws_client|boto3\.client|create_client)\(\s*\"(\w+)\"")


def test_the_code_calls_no_aws_api_beyond_the_grants(raw: dict[str, Any]) -> None:
    # A new AWS call in the layer (an EC2 describe, a Service Quotas read...) needs a grant and a row in CALLS; a
    # grant whose call has gone is a permission nothing uses.
    text = "\n".join(path.read_text() for path in LAYER_CODE.rglob("*.py"))
    assert set(CLIENT_RE.findall(text)) <= {"lambda", "sqs", "ssm", "secretsmanager", "s3", "pricing"}
    called = {action for pattern, action in CODE_CALLS.items() if re.search(pattern, text)}
    # No policy for uploaders: researchers hold an upload token, never an AWS credential (docs/security.md).
    assert "ProfileUploadPolicy" not in raw["Resources"]
    granted_actions = {action for fn in CALLS for action, _ in granted(raw, fn)}
    assert granted_actions == called


def test_outputs(raw: dict[str, Any]) -> None:
    outputs = {k: v["Value"] for k, v in raw["Outputs"].items()}
    assert outputs["SlackIngressUrl"] == {"Fn::GetAtt": ["SlackIngressFunctionUrl", "FunctionUrl"]}
    assert outputs["IncidentWebhookUrl"] == {"Fn::GetAtt": ["IncidentWebhookFunctionUrl", "FunctionUrl"]}
    assert outputs["IdleAlertUrl"] == {"Fn::GetAtt": ["IdleAlertFunctionUrl", "FunctionUrl"]}
    assert outputs["AllocationQueueUrl"] == {"Ref": "AllocationQueue"}
    assert outputs["GpufarmLayerArn"] == {"Ref": "GpufarmLayer"}


# -- local resolution of the real template -------------------------------------------------------------------------


def test_local_environment_of_the_real_template() -> None:
    template = load_template(TEMPLATE)
    sandbox = Sandbox(base_url=BASE)
    env = build_environment(template, sandbox, Urls(BASE), REPO)
    assert env["GPUFARM_WORKER_FUNCTION"] == "SlackWorkerFunction"
    assert env["GPUFARM_ALLOCATION_QUEUE_URL"] == f"{BASE}/_local/queues/AllocationQueue"
    assert (env["GPUFARM_OPERATORS_USERGROUP"], env["GPUFARM_OPERATORS_CHANNEL"]) == ("S0000000001", "C0000000001")
    assert "GPUFARM_SECRETS_NAME" not in env and "GPUFARM_FARM_CONFIG_PARAMETER" not in env
    assert env["GPUFARM_SLACK_API_URL"] == f"{BASE}/slack/api/"
    assert env["SLACK_SIGNING_SECRET"] == sandbox.slack_signing_secret
    assert env["GPUFARM_IDLE_WEBHOOK_URL"] == f"{BASE}/fn/idle_alert/"
    assert env["GPUFARM_SLACK_INGRESS_URL"] == f"{BASE}/fn/slack_ingress/"
    shown = redacted(env)
    assert shown["SLACK_SIGNING_SECRET"] == shown["DD_API_KEY"] == shown["GPUFARM_WEBHOOK_SECRET"] == "***"
    resolver = Resolver(template, Urls(BASE), local_parameters(template))
    assert resolver.resolve({"Fn::GetAtt": ["SlackIngressFunctionUrl", "FunctionUrl"]}) == f"{BASE}/fn/slack_ingress/"
    assert resolver.queue_name("AllocationQueue") == "gpufarm-local-allocation.fifo"
    assert resolver.unresolved == set()


# -- template parsing ------------------------------------------------------------------------------------------------


def test_short_tags_become_long_form() -> None:
    data = load_yaml(
        "a: !Ref X\nb: !GetAtt Q.Arn\nc: !Sub '${X}-y'\nd: !If [C, 1, 2]\ne: !GetAtt [Q, QueueName]\nf: !Condition C\n"
    )
    assert data == {
        "a": {"Ref": "X"},
        "b": {"Fn::GetAtt": ["Q", "Arn"]},
        "c": {"Fn::Sub": "${X}-y"},
        "d": {"Fn::If": ["C", 1, 2]},
        "e": {"Fn::GetAtt": ["Q", "QueueName"]},
        "f": {"Condition": "C"},
    }


def write(tmp_path: Path, resources_yaml: str) -> Path:
    path = tmp_path / "template.yaml"
    path.write_text("Transform: AWS::Serverless-2016-10-31\nResources:\n" + resources_yaml)
    return path


@pytest.mark.parametrize(
    ("resources_yaml", "message"),
    [
        (
            "  F:\n    Type: AWS::Serverless::Function\n    Properties: {CodeUri: f, Handler: nodot}\n",
            "module.function",
        ),
        ("  F:\n    Type: AWS::Serverless::Function\n    Properties: {Handler: f.handler}\n", "CodeUri"),
        (
            "  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: f\n      Handler: f.handler\n"
            "      Events: {Q: {Type: SQS, Properties: {Queue: !GetAtt Nope.Arn}}}\n",
            "Queue must be",
        ),
        (
            "  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: f\n      Handler: f.handler\n"
            "      Timeout: soon\n",
            "whole number",
        ),
        (
            "  A:\n    Type: AWS::Serverless::Function\n    Properties: {CodeUri: x/f, Handler: f.h}\n"
            "  B:\n    Type: AWS::Serverless::Function\n    Properties: {CodeUri: y/f, Handler: f.h}\n",
            "share a folder",
        ),
    ],
)
def test_bad_templates_are_refused_with_a_reason(tmp_path: Path, resources_yaml: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        load_template(write(tmp_path, resources_yaml))


def test_unreadable_template(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot read"):
        load_template(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("Resources: [unclosed\n")
    with pytest.raises(TemplateError):
        load_template(bad)


# -- schedule expressions --------------------------------------------------------------------------------------------


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_rate_expressions() -> None:
    every = Expression.parse("rate(15 minutes)")
    start = epoch("2025-01-01T00:00:00")
    assert every.next_after(start, start=start) == start + 900
    assert every.next_after(start + 899, start=start) == start + 900
    assert every.next_after(start + 900, start=start) == start + 1800
    assert every.next_after(start + 86_400 + 1, start=start) == start + 86_400 + 900
    assert Expression.parse("rate(1 hour)").interval == 3600
    assert Expression.parse("rate(2 days)").interval == 172_800


def test_cron_and_at_expressions() -> None:
    nightly = Expression.parse("cron(0 3 * * ? *)")
    assert nightly.next_after(epoch("2025-01-01T02:59:00"), start=0) == epoch("2025-01-01T03:00:00")
    assert nightly.next_after(epoch("2025-01-01T03:00:00"), start=0) == epoch("2025-01-02T03:00:00")
    weekdays = Expression.parse("cron(30 9 ? * MON-FRI *)")
    assert weekdays.next_after(epoch("2025-01-03T10:00:00"), start=0) == epoch("2025-01-06T09:30:00")  # Fri -> Mon
    quarter = Expression.parse("cron(0/15 * * * ? *)")
    assert quarter.next_after(epoch("2025-01-01T00:07:00"), start=0) == epoch("2025-01-01T00:15:00")
    first = Expression.parse("cron(0 0 1 JAN,JUL ? 2026)")
    assert first.next_after(epoch("2025-03-01T00:00:00"), start=0) == epoch("2026-01-01T00:00:00")
    berlin = Expression.parse("cron(0 9 * * ? *)", "Europe/Berlin")
    assert berlin.next_after(epoch("2025-01-01T00:00:00"), start=0) == epoch("2025-01-01T08:00:00")
    once = Expression.parse("at(2025-06-01T12:00:00)")
    assert once.next_after(epoch("2025-01-01T00:00:00"), start=0) == epoch("2025-06-01T12:00:00")
    assert once.next_after(epoch("2025-07-01T00:00:00"), start=0) is None


@pytest.mark.parametrize(
    "text",
    [
        "rate(0 minutes)",
        "rate(5 minute)",
        "rate(1 minutes)",
        "cron(0 3 * *)",
        "cron(0 25 * * ? *)",
        "cron(0 3 L * ? *)",
        "every day",
        "cron(0 3 * * ? */0)",
    ],
)
def test_bad_schedule_expressions(text: str) -> None:
    with pytest.raises(ScheduleError):
        Expression.parse(text)


def test_unknown_timezone() -> None:
    with pytest.raises(ScheduleError, match="timezone"):
        Expression.parse("rate(5 minutes)", "Mars/Olympus")
