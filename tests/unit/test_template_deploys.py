"""template.yaml creates as a stack: the SAM transform, then moto's CloudFormation, offline, for two parameter sets.

The stack must reach CREATE_COMPLETE, and every resource moto creates must be in its mocked service as the template
says. What moto cannot show is listed, not hidden: the resource types it has no model for, the resources and outputs
left out because they need one of those, and the properties it accepts and drops. Each list is asserted equal to a
known set, kept in docs/deploy.md, "What the local stack check covers", so a new gap fails here instead of passing
unseen. The known sets are moto 5.2's; an upgrade that closes a gap fails here too, and the check then covers more.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from cfn_stack import (
    ACCOUNT,
    ARTIFACT_BUCKET,
    REGION,
    STACK,
    STAND_IN,
    Created,
    Resolver,
    create_stack,
    dependents,
    load_template,
    package,
    sam_transform,
    stand_in_environment,
    unsupported,
    without,
)
from moto import mock_aws

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"

# What an operator must give (the parameters without a default); the others keep their defaults. With these the
# optional features are off: no Datadog extension, no alarm topic.
REQUIRED = {"OperatorsUsergroup": "S0GPUOPS", "OperatorsChannel": "C0GPUOPS"}
# Every parameter set to a valid value other than its default: the Datadog extension and the alarm topic on.
EVERY_OPTION = {
    **REQUIRED,
    "DatadogSite": "datadoghq.eu",
    "SecretsName": "gpufarm/prod",
    "FarmConfigParameter": "gpufarm/prod/farm",
    "LogRetentionDays": "90",
    "ProfileRetentionDays": "14",
    "LogLevel": "DEBUG",
    "DatadogExtensionLayerArn": "arn:aws:lambda:us-east-1:464622532012:layer:Datadog-Extension-ARM:80",
    "DatadogApiKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpufarm/dd-api-key-AbCdEf",
    "AlarmTopicArn": "arn:aws:sns:us-east-1:123456789012:gpufarm-alarms",
    "SlackIngressConcurrency": "40",
    "IncidentWebhookConcurrency": "16",
    "IdleAlertConcurrency": "8",
    "ProfilePagesConcurrency": "4",
    "ProfileUploadConcurrency": "3",
    "PublicUrl4xxAlarmThreshold": "50",
}
PARAMETER_SETS = {"defaults": REQUIRED, "every-option": EVERY_OPTION}

# The resource types of the transformed template that moto's CloudFormation has no model for (moto 5.2): it skips
# each with a warning and creates nothing.
MOTO_CANNOT_CREATE = {
    "AWS::CloudWatch::Alarm",  # the two dead-letter queue alarms and the five public URLs' 4xx alarms
    "AWS::Lambda::Alias",  # the ingress's `live` alias (AutoPublishAlias, SnapStart)
    "AWS::Lambda::EventInvokeConfig",  # the worker's no-retry setting and its on-failure queue
    "AWS::Lambda::Url",  # the five Function URLs
    "AWS::S3::BucketPolicy",  # the profile bucket's TLS-only policy
    "AWS::Scheduler::Schedule",  # the quota sync's and the digest's schedules
}
# Left out of the stack moto gets, because they refer to a resource of those types: the ingress URL's two public
# permissions name the alias, and the five URL outputs read the URLs.
LEFT_OUT = {"SlackIngressFunctionUrlPublicPermissions", "SlackIngressFunctionURLInvokeAllowPublicAccess"}
LEFT_OUT_OUTPUTS = {"SlackIngressUrl", "IncidentWebhookUrl", "IdleAlertUrl", "ProfilePagesUrl", "ProfileUploadUrl"}
# Function variables that read an attribute moto cannot give (a Function URL's): a stand-in URL naming it is
# deployed instead, so the function is still created and checked (tests/cfn_stack.py, stand_in_environment).
STAND_INS = {
    ("QuotaSyncFunction", "GPUFARM_PROFILE_PAGES_URL"): "ProfilePagesFunctionUrl.FunctionUrl",
    ("ProfileUploadFunction", "GPUFARM_PROFILE_PAGES_URL"): "ProfilePagesFunctionUrl.FunctionUrl",
}
# Properties moto's CloudFormation accepts and drops (moto 5.2): the service holds its default instead.
MOTO_DROPS = {
    ("AWS::IAM::Role", "ManagedPolicyArns"),
    ("AWS::Lambda::Function", "Architectures"),
    ("AWS::Lambda::Function", "EphemeralStorage"),
    ("AWS::Lambda::Function", "Layers"),
    ("AWS::Lambda::Function", "LoggingConfig"),
    ("AWS::Lambda::Function", "SnapStart"),
    ("AWS::Lambda::Function", "Tags"),
    ("AWS::Lambda::LayerVersion", "CompatibleArchitectures"),
    ("AWS::Lambda::LayerVersion", "LayerName"),  # moto names the layer after the stack and logical id
    ("AWS::S3::Bucket", "LifecycleConfiguration"),
    ("AWS::S3::Bucket", "OwnershipControls"),
    ("AWS::S3::Bucket", "PublicAccessBlockConfiguration"),
    ("Outputs", "GpufarmLayerArn"),  # moto resolves a layer version's Ref to its Python object, not its ARN
}

Comparison = tuple[str, Any, Any]  # property, as the template says, as the mocked service holds it


@dataclass
class Deployment:
    """One stack in moto, with what it was made from and the mocked clients to look at it."""

    parameters: dict[str, str]
    transformed: dict[str, Any]
    skipped: dict[str, str]  # logical id -> type moto has no model for
    left_out: set[str]
    left_out_outputs: set[str]
    created: Created
    physical: dict[str, str]
    code: dict[str, str]  # S3 key -> CodeSha256 of the zip uploaded there
    aws: dict[str, Any]

    def resolver(self) -> Resolver:
        """Template values resolved against this stack."""
        return Resolver(self.transformed, self.parameters, self.ref, self.attribute)

    def ref(self, logical_id: str) -> str:
        """What Ref gives: a layer version's ARN, anything else's physical id."""
        if self.transformed["Resources"][logical_id]["Type"] == "AWS::Lambda::LayerVersion":
            return str(self.layer()["LayerVersionArn"])
        return self.physical[logical_id]

    def layer(self) -> dict[str, Any]:
        """The one layer version the stack makes (moto names it itself, and lists no physical id for it)."""
        layers = self.aws["lambda"].list_layers()["Layers"]
        assert len(layers) == 1, layers
        latest = layers[0]["LatestMatchingVersion"]
        name, number = layers[0]["LayerName"], latest["Version"]
        return dict(self.aws["lambda"].get_layer_version(LayerName=name, VersionNumber=number))

    def attribute(self, logical_id: str, name: str) -> str:
        """What Fn::GetAtt gives, read from the mocked service."""
        kind, physical = self.transformed["Resources"][logical_id]["Type"], self.physical[logical_id]
        if (kind, name) == ("AWS::Lambda::Function", "Arn"):
            return str(self.aws["lambda"].get_function_configuration(FunctionName=physical)["FunctionArn"])
        if (kind, name) == ("AWS::SQS::Queue", "Arn"):
            attributes = self.aws["sqs"].get_queue_attributes(QueueUrl=physical, AttributeNames=["QueueArn"])
            return str(attributes["Attributes"]["QueueArn"])
        if (kind, name) == ("AWS::IAM::Role", "Arn"):
            return str(self.aws["iam"].get_role(RoleName=physical)["Role"]["Arn"])
        if (kind, name) == ("AWS::S3::Bucket", "Arn"):
            self.aws["s3"].head_bucket(Bucket=physical)
            return f"arn:aws:s3:::{physical}"
        raise AssertionError(f"Fn::GetAtt {logical_id}.{name} ({kind}) is not read here: add it")


@pytest.fixture(scope="module", params=sorted(PARAMETER_SETS))
def deployed(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """template.yaml packaged, transformed and created as a stack in moto with one parameter set."""
    parameters = PARAMETER_SETS[request.param]
    with pytest.MonkeyPatch.context() as env, mock_aws():
        for name, value in {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "moto",
            "AWS_SECRET_ACCESS_KEY": "moto",
        }.items():
            env.setenv(name, value)
        aws = {
            name: boto3.client(name, region_name=REGION)
            for name in ("cloudformation", "lambda", "sqs", "iam", "s3", "logs")
        }
        aws["s3"].create_bucket(Bucket=ARTIFACT_BUCKET)
        template = load_template(TEMPLATE)
        artifacts = package(
            template, REPO, lambda key, body: aws["s3"].put_object(Bucket=ARTIFACT_BUCKET, Key=key, Body=body)
        )
        transformed = sam_transform(template, parameters)
        skipped = unsupported(transformed)
        stand_ins = stand_in_environment(transformed, set(skipped))
        assert stand_ins == STAND_INS
        left_out, left_out_outputs = dependents(transformed, set(skipped))
        created = create_stack(aws["cloudformation"], without(transformed, left_out, left_out_outputs), parameters)
        yield Deployment(
            parameters=parameters,
            transformed=transformed,
            skipped=skipped,
            left_out=left_out,
            left_out_outputs=left_out_outputs,
            created=created,
            physical={
                r["LogicalResourceId"]: r.get("PhysicalResourceId", "")
                for r in created.resources
                if "LogicalResourceId" in r
            },
            code={a.key: a.sha256 for a in artifacts.values()},
            aws=aws,
        )


# --- What each created resource holds in its mocked service, beside what the template says -----------------------
# A checker reads the resource from its service (failing if it is not there) and returns one comparison per property
# the template sets; a property it does not compare fails the test as unchecked.


def _function(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    client = d.aws["lambda"]
    config = client.get_function_configuration(FunctionName=d.physical[logical_id])
    return [
        *((name, props[name], config.get(name)) for name in ("Handler", "Runtime", "Role", "Timeout", "MemorySize")),
        ("Description", props.get("Description", ""), config.get("Description", "")),
        ("Code", d.code[props["Code"]["S3Key"]], config["CodeSha256"]),
        ("Environment", props.get("Environment", {}), config.get("Environment", {})),
        ("Architectures", props.get("Architectures", ["x86_64"]), config.get("Architectures")),
        ("Layers", props.get("Layers", []), [layer["Arn"] for layer in config.get("Layers", [])]),
        ("LoggingConfig", props.get("LoggingConfig"), config.get("LoggingConfig")),
        ("SnapStart", props.get("SnapStart", {"ApplyOn": "None"}), {"ApplyOn": config["SnapStart"]["ApplyOn"]}),
        ("EphemeralStorage", props.get("EphemeralStorage", {"Size": 512}), config.get("EphemeralStorage")),
        (
            "ReservedConcurrentExecutions",
            props.get("ReservedConcurrentExecutions"),
            client.get_function_concurrency(FunctionName=d.physical[logical_id]).get("ReservedConcurrentExecutions"),
        ),
        (
            "Tags",
            {t["Key"]: t["Value"] for t in props.get("Tags", [])},
            client.list_tags(Resource=config["FunctionArn"])["Tags"],
        ),
    ]


def _layer_version(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    version = d.layer()
    return [
        ("LayerName", props["LayerName"], version["LayerArn"].rsplit(":", 1)[-1]),
        ("Content", d.code[props["Content"]["S3Key"]], version["Content"]["CodeSha256"]),
        *((name, props[name], version.get(name, [])) for name in ("CompatibleRuntimes", "CompatibleArchitectures")),
        ("Description", props["Description"], version.get("Description")),
    ]


def _permission(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    statements = json.loads(d.aws["lambda"].get_policy(FunctionName=props["FunctionName"])["Policy"])["Statement"]
    statement = next((s for s in statements if s.get("Action") == props["Action"]), {})
    return [(name, value, statement.get(name)) for name, value in props.items()]


def _event_source(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    mapping = d.aws["lambda"].get_event_source_mapping(UUID=d.physical[logical_id])
    return [
        ("FunctionName", props["FunctionName"], mapping["FunctionArn"].rsplit(":", 1)[-1]),
        *((name, props[name], mapping.get(name)) for name in ("EventSourceArn", "BatchSize", "FunctionResponseTypes")),
    ]


def _version(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    versions = d.aws["lambda"].list_versions_by_function(FunctionName=props["FunctionName"])["Versions"]
    published = [v["FunctionName"] for v in versions if v["Version"] != "$LATEST"]
    return [("FunctionName", [props["FunctionName"]], published)]


def _queue(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    url = d.physical[logical_id]
    attributes = d.aws["sqs"].get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    held: dict[str, Any] = {**attributes, "QueueName": url.rsplit("/", 1)[-1]}
    if "RedrivePolicy" in attributes:
        held["RedrivePolicy"] = json.loads(attributes["RedrivePolicy"])
    return [(name, value, held.get(name)) for name, value in props.items()]


def _role(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    iam, name = d.aws["iam"], d.physical[logical_id]
    role = iam.get_role(RoleName=name)["Role"]
    inline = {
        p: _document(iam.get_role_policy(RoleName=name, PolicyName=p))
        for p in iam.list_role_policies(RoleName=name)["PolicyNames"]
    }
    attached = [p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]]
    return [
        ("AssumeRolePolicyDocument", props["AssumeRolePolicyDocument"], role["AssumeRolePolicyDocument"]),
        ("Policies", {p["PolicyName"]: p["PolicyDocument"] for p in props.get("Policies", [])}, inline),
        ("ManagedPolicyArns", sorted(props.get("ManagedPolicyArns", [])), sorted(attached)),
        ("Tags", props.get("Tags", []), role.get("Tags", [])),
    ]


def _document(answer: dict[str, Any]) -> Any:
    """An inline policy's document: moto 5.2 keeps the one a stack gave as the Python text of its dict."""
    document = answer["PolicyDocument"]
    return ast.literal_eval(document) if isinstance(document, str) else document


def _managed_policy(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    iam, arn = d.aws["iam"], d.physical[logical_id]
    policy = iam.get_policy(PolicyArn=arn)["Policy"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=policy["DefaultVersionId"])["PolicyVersion"]["Document"]
    return [
        ("Description", props["Description"], policy.get("Description")),
        ("PolicyDocument", props["PolicyDocument"], document),
    ]


def _log_group(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    groups = d.aws["logs"].describe_log_groups(logGroupNamePrefix=d.physical[logical_id])["logGroups"]
    group = next((g for g in groups if g["logGroupName"] == d.physical[logical_id]), {})
    return [
        ("LogGroupName", props["LogGroupName"], group.get("logGroupName")),
        ("RetentionInDays", props["RetentionInDays"], group.get("retentionInDays")),
    ]


def _absent_or(call: Callable[[], Any]) -> Any:
    """The answer, or None where the service has no such configuration (an S3 NoSuch... error)."""
    try:
        return call()
    except ClientError as error:
        if error.response["Error"]["Code"].startswith("NoSuch") or "NotFound" in error.response["Error"]["Code"]:
            return None
        raise


def _bucket(d: Deployment, logical_id: str, props: dict[str, Any]) -> list[Comparison]:
    s3, name = d.aws["s3"], d.physical[logical_id]
    s3.head_bucket(Bucket=name)
    encryption = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]
    lifecycle = _absent_or(lambda: s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]) or []
    return [
        (
            "BucketEncryption",
            [
                r["ServerSideEncryptionByDefault"]
                for r in props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ],
            [r["ApplyServerSideEncryptionByDefault"] for r in encryption],
        ),
        (
            "PublicAccessBlockConfiguration",
            props["PublicAccessBlockConfiguration"],
            _absent_or(lambda: s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]),
        ),
        (
            "OwnershipControls",
            props["OwnershipControls"],
            _absent_or(lambda: s3.get_bucket_ownership_controls(Bucket=name)["OwnershipControls"]),
        ),
        (
            "LifecycleConfiguration",
            [
                _rule(r["Id"], r["Status"], r["Prefix"], r["ExpirationInDays"], r)
                for r in props["LifecycleConfiguration"]["Rules"]
            ],
            [
                _rule(r["ID"], r["Status"], r.get("Filter", r).get("Prefix"), r["Expiration"]["Days"], r)
                for r in lifecycle
            ],
        ),
    ]


def _rule(rule_id: str, status: str, prefix: str, days: int, rule: dict[str, Any]) -> tuple[Any, ...]:
    """A lifecycle rule in one shape, whether CloudFormation's or S3's API spelling."""
    return (rule_id, status, prefix, days, rule.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation"))


CHECKERS: dict[str, Callable[[Deployment, str, dict[str, Any]], list[Comparison]]] = {
    "AWS::IAM::ManagedPolicy": _managed_policy,
    "AWS::IAM::Role": _role,
    "AWS::Lambda::EventSourceMapping": _event_source,
    "AWS::Lambda::Function": _function,
    "AWS::Lambda::LayerVersion": _layer_version,
    "AWS::Lambda::Permission": _permission,
    "AWS::Lambda::Version": _version,
    "AWS::Logs::LogGroup": _log_group,
    "AWS::S3::Bucket": _bucket,
    "AWS::SQS::Queue": _queue,
}


def _normal(value: Any) -> Any:
    """One spelling for a value: services answer "true" and "30" where the template says true and 30."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def _with_defaults(values: dict[str, str]) -> dict[str, str]:
    """Every parameter's value: the given ones, the template's defaults for the rest."""
    declared = load_template(TEMPLATE)["Parameters"]
    return {name: values.get(name, str(spec.get("Default", ""))) for name, spec in declared.items()}


def _violations(name: str, spec: dict[str, Any], value: str) -> list[str]:
    """How a value breaks its parameter's declared constraints (CloudFormation refuses the stack for any)."""
    broken = []
    if "AllowedValues" in spec and value not in [str(v) for v in spec["AllowedValues"]]:
        broken.append(f"{name}={value!r} is not one of {spec['AllowedValues']}")
    if "AllowedPattern" in spec and not re.fullmatch(spec["AllowedPattern"], value):
        broken.append(f"{name}={value!r} does not match {spec['AllowedPattern']}")
    if spec["Type"] == "Number" and not (spec.get("MinValue", -1e18) <= float(value) <= spec.get("MaxValue", 1e18)):
        broken.append(f"{name}={value!r} is outside [{spec.get('MinValue')}, {spec.get('MaxValue')}]")
    return broken


def _no_resources(*names: str) -> str:
    raise AssertionError(f"a parameter check reads no resource ({names})")


@pytest.mark.parametrize("set_name", sorted(PARAMETER_SETS))
def test_the_parameter_sets_are_valid_and_cover_the_template(set_name: str) -> None:
    template = load_template(TEMPLATE)
    declared, values = template["Parameters"], PARAMETER_SETS[set_name]
    # The operator's minimum is exactly the parameters without a default; the other set moves every one of them.
    assert set(REQUIRED) == {name for name, spec in declared.items() if "Default" not in spec}
    assert set(EVERY_OPTION) == set(declared)
    assert [n for n, v in EVERY_OPTION.items() if str(declared[n].get("Default")) == v] == []
    full = _with_defaults(values)
    assert [v for name, spec in declared.items() for v in _violations(name, spec, full[name])] == []
    resolver = Resolver(template, values, _no_resources, _no_resources)
    broken_rules = [
        assertion["AssertDescription"]
        for rule in template.get("Rules", {}).values()
        if resolver.condition(rule.get("RuleCondition", {"Fn::Equals": ["", ""]}))
        for assertion in rule["Assertions"]
        if not resolver.condition(assertion["Assert"])
    ]
    assert broken_rules == []


def test_the_stack_creates(deployed: Deployment) -> None:
    stack = deployed.created.stack
    assert (stack["StackStatus"], stack.get("StackStatusReason")) == ("CREATE_COMPLETE", None)
    print(f"\n{len(deployed.physical)} resources created, {len(deployed.skipped)} skipped by moto")


def test_moto_skips_exactly_the_known_resource_types(deployed: Deployment) -> None:
    by_type: dict[str, list[str]] = {}
    for logical_id, kind in sorted(deployed.skipped.items()):
        by_type.setdefault(kind, []).append(logical_id)
    print("\nResource types moto's CloudFormation cannot create (the stack lacks them):")
    for kind, names in sorted(by_type.items()):
        print(f"  {kind}: {', '.join(names)}")
    # What moto said it skipped is what its model map predicts, and both are the documented set.
    assert set(deployed.created.skipped_types) == set(by_type)
    assert set(by_type) == MOTO_CANNOT_CREATE


def test_what_needs_a_skipped_resource_is_left_out(deployed: Deployment) -> None:
    print(f"\nLeft out: resources {sorted(deployed.left_out)}, outputs {sorted(deployed.left_out_outputs)}")
    assert deployed.left_out == LEFT_OUT
    assert deployed.left_out_outputs == LEFT_OUT_OUTPUTS


def test_every_created_resource_is_in_its_service_as_the_template_says(deployed: Deployment) -> None:
    resources = deployed.transformed["Resources"]
    assert set(deployed.physical) == set(resources) - set(deployed.skipped) - deployed.left_out
    resolver = deployed.resolver()
    unchecked: list[str] = []
    dropped: dict[tuple[str, str], list[str]] = {}
    for logical_id in sorted(deployed.physical):
        kind = resources[logical_id]["Type"]
        assert kind in CHECKERS, f"{logical_id}: no check reads a {kind} from its service: add one"
        props = resolver.value(resources[logical_id].get("Properties", {}))
        comparisons = CHECKERS[kind](deployed, logical_id, props)
        unchecked += [f"{logical_id}.{name}" for name in sorted(set(props) - {c[0] for c in comparisons})]
        for name, expected, held in comparisons:
            if _normal(expected) != _normal(held):
                dropped.setdefault((kind, name), []).append(f"{logical_id}: template {expected!r}, moto {held!r}")
    held_outputs = {o["OutputKey"]: o["OutputValue"] for o in deployed.created.stack.get("Outputs", [])}
    for name, output in deployed.transformed["Outputs"].items():
        if name not in deployed.left_out_outputs and resolver.value(output["Value"]) != held_outputs.get(name):
            dropped[("Outputs", name)] = [
                f"template {resolver.value(output['Value'])!r}, moto {held_outputs.get(name)!r}"
            ]
    print("\nProperties moto's CloudFormation drops:", ", ".join(f"{k}.{p}" for k, p in sorted(dropped)))
    assert unchecked == []
    surprises = {key: lines for key, lines in dropped.items() if key not in MOTO_DROPS}
    assert surprises == {}, "\n".join(line for lines in surprises.values() for line in lines)
    assert set(dropped) == MOTO_DROPS


def test_the_allocation_queue_is_fifo_and_feeds_the_incident_webhook(deployed: Deployment) -> None:
    sqs, physical = deployed.aws["sqs"], deployed.physical
    queue = sqs.get_queue_attributes(QueueUrl=physical["AllocationQueue"], AttributeNames=["All"])["Attributes"]
    dead = sqs.get_queue_attributes(QueueUrl=physical["AllocationDeadLetterQueue"], AttributeNames=["All"])[
        "Attributes"
    ]
    assert physical["AllocationQueue"].endswith(f"/{STACK}-allocation.fifo")
    # Content-based deduplication off: every command carries its own deduplication id.
    assert (queue["FifoQueue"], queue["ContentBasedDeduplication"], queue["VisibilityTimeout"]) == (
        "true",
        "false",
        "360",
    )
    assert json.loads(queue["RedrivePolicy"]) == {"deadLetterTargetArn": dead["QueueArn"], "maxReceiveCount": 3}
    assert dead["FifoQueue"] == "true"
    mapping = deployed.aws["lambda"].get_event_source_mapping(UUID=physical["IncidentWebhookFunctionAllocation"])
    assert mapping["EventSourceArn"] == queue["QueueArn"]
    assert mapping["FunctionArn"].endswith(f":function:{physical['IncidentWebhookFunction']}")
    assert (mapping["BatchSize"], mapping["FunctionResponseTypes"]) == (1, ["ReportBatchItemFailures"])


def test_each_function_reads_what_the_parameters_name(deployed: Deployment) -> None:
    full = _with_defaults(deployed.parameters)
    extension = "DatadogExtensionLayerArn" in deployed.parameters
    physical, client = deployed.physical, deployed.aws["lambda"]
    queue, worker = physical["AllocationQueue"], physical["SlackWorkerFunction"]
    own = {
        "SlackIngressFunction": {"GPUFARM_WORKER_FUNCTION": worker},
        "SlackWorkerFunction": {"GPUFARM_ALLOCATION_QUEUE_URL": queue},
        "IncidentWebhookFunction": {"GPUFARM_ALLOCATION_QUEUE_URL": queue},
        "IdleAlertFunction": {"GPUFARM_ALLOCATION_QUEUE_URL": queue},
        "ProfilePagesFunction": {"GPUFARM_PROFILE_BUCKET": physical["ProfileBucket"]},
        "ProfileUploadFunction": {
            "GPUFARM_PROFILE_BUCKET": physical["ProfileBucket"],
            "GPUFARM_ALLOCATION_QUEUE_URL": queue,
            "GPUFARM_PROFILE_PAGES_URL": STAND_IN.format(target="ProfilePagesFunctionUrl", attribute="FunctionUrl"),
        },
        "QuotaSyncFunction": {
            "GPUFARM_ALLOCATION_QUEUE_URL": queue,
            "GPUFARM_PROFILE_PAGES_URL": STAND_IN.format(target="ProfilePagesFunctionUrl", attribute="FunctionUrl"),
        },
        "DailyDigestFunction": {},
    }
    for logical_id, variables in own.items():
        held = client.get_function_configuration(FunctionName=physical[logical_id])["Environment"]["Variables"]
        assert held["GPUFARM_FARM_CONFIG_PARAMETER"] == "/" + full["FarmConfigParameter"]
        assert held["GPUFARM_SECRETS_NAME"] == full["SecretsName"]
        assert held["GPUFARM_DATADOG_SITE"] == full["DatadogSite"]
        assert (held["GPUFARM_OPERATORS_USERGROUP"], held["GPUFARM_OPERATORS_CHANNEL"]) == (
            full["OperatorsUsergroup"],
            full["OperatorsChannel"],
        )
        assert {k: held[k] for k in variables} == variables
        # The extension's own variables only where it is installed.
        extension_variables = {"DD_SITE": full["DatadogSite"], "DD_API_KEY_SECRET_ARN": full["DatadogApiKeySecretArn"]}
        assert {k: v for k, v in held.items() if k in extension_variables} == (extension_variables if extension else {})
    iam, arn = deployed.aws["iam"], physical["FunctionConfigReadPolicy"]
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    resources = {s["Sid"]: s["Resource"] for s in document["Statement"]}
    assert resources.pop("FarmConfiguration") == [
        f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{full['FarmConfigParameter']}"
    ]
    assert resources == ({"DatadogExtensionApiKey": full["DatadogApiKeySecretArn"]} if extension else {})


def test_each_function_role_may_read_the_secret_keys_it_names_under_the_stacks_prefix(deployed: Deployment) -> None:
    """Each role's SecretKeys grants are the deployed secrets `<SecretsName>/<key>` of the function's own
    GPUFARM_SECRET_KEYS, and their Parameter Store references: nothing of another key."""
    prefix = _with_defaults(deployed.parameters)["SecretsName"]
    iam, client, physical = deployed.aws["iam"], deployed.aws["lambda"], deployed.physical
    functions = [k for k, v in deployed.transformed["Resources"].items() if v["Type"] == "AWS::Lambda::Function"]
    assert functions
    for logical_id in functions:
        held = client.get_function_configuration(FunctionName=physical[logical_id])["Environment"]["Variables"]
        keys = held["GPUFARM_SECRET_KEYS"].split(",")
        role = physical[f"{logical_id}Role"]
        statements = [
            s
            for name in iam.list_role_policies(RoleName=role)["PolicyNames"]
            for s in _document(iam.get_role_policy(RoleName=role, PolicyName=name))["Statement"]
        ]
        by_sid = {s.get("Sid"): s for s in statements}
        secrets, references = by_sid["SecretKeys"], by_sid["SecretKeyReferences"]
        assert (secrets["Action"], references["Action"]) == ("secretsmanager:GetSecretValue", "ssm:GetParameters")
        assert sorted(secrets["Resource"]) == sorted(
            f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{prefix}/{key}-??????" for key in keys
        ), logical_id
        assert sorted(references["Resource"]) == sorted(
            f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/aws/reference/secretsmanager/{prefix}/{key}" for key in keys
        ), logical_id


def test_the_public_url_permissions_and_the_schedule_roles(deployed: Deployment) -> None:
    client, physical, iam = deployed.aws["lambda"], deployed.physical, deployed.aws["iam"]
    # The Function URLs themselves are beyond moto; the permissions that open three of them to anyone are not.
    for function in ("IncidentWebhookFunction", "IdleAlertFunction", "ProfilePagesFunction", "ProfileUploadFunction"):
        statements = json.loads(client.get_policy(FunctionName=physical[function])["Policy"])["Statement"]
        assert {
            (s["Action"], s["Principal"], s.get("FunctionUrlAuthType"), s.get("InvokedViaFunctionUrl"))
            for s in statements
        } == {
            ("lambda:InvokeFunctionUrl", "*", "NONE", None),
            ("lambda:InvokeFunction", "*", None, True),
        }
    # The schedules are beyond moto too; the roles they run with may invoke their function and fill their DLQ only.
    for schedule, function in (
        ("QuotaSyncFunctionEvery15Minutes", "QuotaSyncFunction"),
        ("DailyDigestFunctionEveryQuarterHour", "DailyDigestFunction"),
    ):
        role = physical[f"{schedule}Role"]
        trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]["Statement"]
        assert [s["Principal"]["Service"] for s in trust] == [["scheduler.amazonaws.com"]]
        allowed = {
            (s["Action"], s["Resource"])
            for name in iam.list_role_policies(RoleName=role)["PolicyNames"]
            for s in _document(iam.get_role_policy(RoleName=role, PolicyName=name))["Statement"]
        }
        assert allowed == {
            ("lambda:InvokeFunction", deployed.attribute(function, "Arn")),
            ("sqs:SendMessage", deployed.attribute(f"{schedule}Queue", "Arn")),
        }
