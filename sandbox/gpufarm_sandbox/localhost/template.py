"""Reading a SAM template for the local function host: CloudFormation short tags as data, functions and triggers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FUNCTION_TYPE = "AWS::Serverless::Function"
QUEUE_TYPE = "AWS::SQS::Queue"
DEFAULT_ASYNC_RETRIES = 2  # Lambda's default for async invokes without an EventInvokeConfig
DEFAULT_MAX_RECEIVES = 3  # local bound for queues without a RedrivePolicy (SQS itself would retry until expiry)
HANDLER_RE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.(?P<function>[A-Za-z_]\w*)$")

# Short tag -> long form. `!GetAtt A.B` is split into ["A", "B"] as CloudFormation does.
_FN_TAGS = (
    "Base64",
    "Cidr",
    "FindInMap",
    "GetAZs",
    "ImportValue",
    "Join",
    "Select",
    "Split",
    "Sub",
    "Transform",
    "If",
    "Equals",
    "Not",
    "And",
    "Or",
    "ToJsonString",
    "Length",
)


class TemplateError(ValueError):
    """The template cannot be served locally (missing handler, unknown queue, malformed trigger...)."""


class CfnLoader(yaml.SafeLoader):
    """A YAML loader that reads CloudFormation's short tags (`!Ref`, `!GetAtt`, `!Sub`...) as plain data."""


def _construct(node: yaml.Node, loader: CfnLoader) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    assert isinstance(node, yaml.MappingNode)
    return loader.construct_mapping(node, deep=True)


def _tag(key: str) -> Any:
    def constructor(loader: CfnLoader, node: yaml.Node) -> Any:
        return {key: _construct(node, loader)}

    return constructor


def _get_att(loader: CfnLoader, node: yaml.Node) -> Any:
    value = _construct(node, loader)
    if isinstance(value, str):
        resource, _, attribute = value.partition(".")
        return {"Fn::GetAtt": [resource, attribute]}
    return {"Fn::GetAtt": value}


CfnLoader.add_constructor("!Ref", _tag("Ref"))
CfnLoader.add_constructor("!Condition", _tag("Condition"))
CfnLoader.add_constructor("!GetAtt", _get_att)
for _name in _FN_TAGS:
    CfnLoader.add_constructor(f"!{_name}", _tag(f"Fn::{_name}"))


def load_yaml(text: str) -> Any:
    """Parse CloudFormation YAML; intrinsic functions come back in their long JSON form."""
    return yaml.load(text, Loader=CfnLoader)  # noqa: S506 - CfnLoader is a SafeLoader plus data-only tags


@dataclass(frozen=True)
class ScheduleSpec:
    """A ScheduleV2 (EventBridge Scheduler) or Schedule (EventBridge rule) trigger."""

    name: str
    kind: str  # "ScheduleV2" | "Schedule"
    expression: str
    input: str | None = None
    enabled: bool = True
    timezone: str = "UTC"


@dataclass(frozen=True)
class QueueEventSpec:
    """An SQS trigger: which queue, how many messages per event, whether partial failures are reported."""

    name: str
    queue: str  # logical id of the queue
    batch_size: int = 10
    report_failures: bool = False


@dataclass(frozen=True)
class FunctionSpec:
    """One AWS::Serverless::Function as the local host needs it."""

    logical_id: str
    code_uri: str
    handler: str
    module: str
    function: str
    runtime: str
    timeout: int
    memory: int
    environment: dict[str, Any]
    url: bool
    schedules: tuple[ScheduleSpec, ...]
    queues: tuple[QueueEventSpec, ...]
    max_retries: int
    max_event_age: int

    @property
    def dir_name(self) -> str:
        """The function's folder name (`functions/slack_ingress` -> `slack_ingress`); its URL path segment."""
        return Path(self.code_uri).name


@dataclass(frozen=True)
class QueueSpec:
    """One AWS::SQS::Queue."""

    logical_id: str
    fifo: bool
    content_dedup: bool
    visibility_timeout: int
    max_receives: int
    dead_letter_queue: str | None
    name: Any  # the raw QueueName (often a !Sub); resolved by the environment builder


@dataclass(frozen=True)
class Template:
    """What the local host reads from template.yaml."""

    path: Path
    parameters: dict[str, dict[str, Any]]
    conditions: dict[str, Any]
    resources: dict[str, dict[str, Any]]
    global_function: dict[str, Any]
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    queues: dict[str, QueueSpec] = field(default_factory=dict)

    def function_for_dir(self, dir_name: str) -> FunctionSpec | None:
        """The function served at /fn/<dir_name>/."""
        return next((f for f in self.functions.values() if f.dir_name == dir_name), None)


def _int(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise TemplateError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def _ref_target(value: Any) -> str | None:
    """The logical id a `!Ref X` or `!GetAtt X.Arn` points at."""
    if isinstance(value, dict) and len(value) == 1:
        if "Ref" in value and isinstance(value["Ref"], str):
            return value["Ref"]
        att = value.get("Fn::GetAtt")
        if isinstance(att, list) and att and isinstance(att[0], str):
            return att[0]
    return None


def _merged(global_function: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    """SAM's Globals semantics: maps (Environment.Variables) merge, scalars and lists are replaced."""
    merged = dict(global_function)
    for key, value in props.items():
        if key == "Environment" and isinstance(value, dict) and isinstance(merged.get(key), dict):
            variables = {**(merged[key].get("Variables") or {}), **(value.get("Variables") or {})}
            merged[key] = {**merged[key], **value, "Variables": variables}
        else:
            merged[key] = value
    return merged


def _schedule(name: str, kind: str, props: dict[str, Any], fn: str) -> ScheduleSpec:
    expression = props.get("ScheduleExpression") if kind == "ScheduleV2" else props.get("Schedule")
    if not isinstance(expression, str) or not expression.strip():
        raise TemplateError(f"{fn}.Events.{name}: a {kind} needs a schedule expression")
    raw_input = props.get("Input")
    if raw_input is not None and not isinstance(raw_input, str):
        raise TemplateError(f"{fn}.Events.{name}: Input must be a JSON string")
    enabled = props.get("State", "ENABLED") != "DISABLED" and props.get("Enabled", True) is not False
    timezone = props.get("ScheduleExpressionTimezone") or "UTC"
    return ScheduleSpec(name, kind, expression.strip(), raw_input, enabled, str(timezone))


def _function(logical_id: str, props: dict[str, Any], queues: set[str]) -> FunctionSpec:
    handler = props.get("Handler")
    if not isinstance(handler, str) or not (match := HANDLER_RE.match(handler)):
        raise TemplateError(f"{logical_id}: Handler must look like module.function, got {handler!r}")
    code_uri = props.get("CodeUri")
    if not isinstance(code_uri, str) or not code_uri.strip():
        raise TemplateError(f"{logical_id}: CodeUri must be a local folder")
    schedules, queue_events = _events(logical_id, props.get("Events") or {}, queues)
    invoke_config = props.get("EventInvokeConfig") or {}
    environment = props.get("Environment") or {}
    return FunctionSpec(
        logical_id=logical_id,
        code_uri=code_uri.strip().rstrip("/"),
        handler=handler,
        module=match["module"],
        function=match["function"],
        runtime=str(props.get("Runtime", "python3.12")),
        timeout=_int(props.get("Timeout"), f"{logical_id}.Timeout", 3),
        memory=_int(props.get("MemorySize"), f"{logical_id}.MemorySize", 128),
        environment=dict(environment.get("Variables") or {}),
        url=isinstance(props.get("FunctionUrlConfig"), dict),
        schedules=tuple(schedules),
        queues=tuple(queue_events),
        max_retries=_int(
            invoke_config.get("MaximumRetryAttempts"), f"{logical_id}.MaximumRetryAttempts", DEFAULT_ASYNC_RETRIES
        ),
        max_event_age=_int(invoke_config.get("MaximumEventAgeInSeconds"), f"{logical_id}.MaximumEventAge", 21600),
    )


def _events(
    logical_id: str, events: dict[str, Any], queues: set[str]
) -> tuple[list[ScheduleSpec], list[QueueEventSpec]]:
    """A function's schedules and SQS triggers (other event types are served otherwise or not at all)."""
    schedules: list[ScheduleSpec] = []
    queue_events: list[QueueEventSpec] = []
    for name, event in events.items():
        kind = event.get("Type") if isinstance(event, dict) else None
        eprops = event.get("Properties") or {} if isinstance(event, dict) else {}
        if kind in ("ScheduleV2", "Schedule"):
            schedules.append(_schedule(name, kind, eprops, logical_id))
        elif kind == "SQS":
            target = _ref_target(eprops.get("Queue"))
            if target is None or target not in queues:
                raise TemplateError(f"{logical_id}.Events.{name}: Queue must be !GetAtt <a queue in this template>.Arn")
            report = "ReportBatchItemFailures" in (eprops.get("FunctionResponseTypes") or [])
            batch = _int(eprops.get("BatchSize"), f"{logical_id}.Events.{name}.BatchSize", 10)
            queue_events.append(QueueEventSpec(name, target, batch, report))
    return schedules, queue_events


def _queue(logical_id: str, props: dict[str, Any]) -> QueueSpec:
    redrive = props.get("RedrivePolicy") or {}
    max_receives = DEFAULT_MAX_RECEIVES
    dlq = None
    if isinstance(redrive, dict) and redrive:
        max_receives = _int(redrive.get("maxReceiveCount"), f"{logical_id}.maxReceiveCount", DEFAULT_MAX_RECEIVES)
        dlq = _ref_target(redrive.get("deadLetterTargetArn"))
    return QueueSpec(
        logical_id=logical_id,
        fifo=props.get("FifoQueue") in (True, "true", "True"),
        content_dedup=props.get("ContentBasedDeduplication") in (True, "true", "True"),
        visibility_timeout=_int(props.get("VisibilityTimeout"), f"{logical_id}.VisibilityTimeout", 30),
        max_receives=max(1, max_receives),
        dead_letter_queue=dlq,
        name=props.get("QueueName"),
    )


def load_template(path: Path) -> Template:
    """Read a SAM template: its functions (handler, folder, env, triggers), queues, parameters and conditions."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("Resources"), dict):
        raise TemplateError(f"{path} has no Resources")
    template = _outline(path, data)
    resources = template.resources
    for logical_id, resource in resources.items():
        if resource["Type"] == QUEUE_TYPE:
            template.queues[logical_id] = _queue(logical_id, resource.get("Properties") or {})
    for logical_id, resource in resources.items():
        if resource["Type"] == FUNCTION_TYPE:
            props = _merged(template.global_function, resource.get("Properties") or {})
            template.functions[logical_id] = _function(logical_id, props, set(template.queues))
    dirs = [f.dir_name for f in template.functions.values()]
    duplicates = sorted({d for d in dirs if dirs.count(d) > 1})
    if duplicates:
        raise TemplateError(f"functions share a folder, so their URLs would clash: {', '.join(duplicates)}")
    return template


def _outline(path: Path, data: dict[str, Any]) -> Template:
    """The template's typed resources, parameters, conditions and function globals (no functions or queues yet)."""
    resources: dict[str, dict[str, Any]] = {
        k: v for k, v in data["Resources"].items() if isinstance(v, dict) and isinstance(v.get("Type"), str)
    }
    global_function = (
        ((data.get("Globals") or {}).get("Function") or {}) if isinstance(data.get("Globals"), dict) else {}
    )
    return Template(
        path=path,
        parameters={k: v for k, v in (data.get("Parameters") or {}).items() if isinstance(v, dict)},
        conditions=dict(data.get("Conditions") or {}),
        resources=resources,
        global_function=dict(global_function),
    )
