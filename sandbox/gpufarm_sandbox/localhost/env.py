"""The environment the local function host gives its functions: template variables resolved to local values.

In Lambda, `!Ref AllocationQueue` is an SQS URL and secrets come from Secrets Manager. Locally the same variables
point at the function host (queues, invokes, Function URLs) and the sandbox (Datadog, Slack, sandbox credentials),
so the handlers run unchanged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.localhost.template import FUNCTION_TYPE, QUEUE_TYPE, Template

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox

log = logging.getLogger("gpufarm_sandbox.localhost")

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
STACK_NAME = "gpufarm-local"
# Fixed, documented local value (like the sandbox's default keys): `gpufarm datadog apply` against the sandbox
# configures the webhooks' secret header with it, so a separately started apply agrees with `gpufarm local`.
LOCAL_WEBHOOK_SECRET = "gpufarm-local-webhook-secret"  # noqa: S105 - documented local-only value
# Signs the upload tokens `/gpu profile-token` gives locally; fixed so a separately started tool agrees with it.
LOCAL_UPLOAD_TOKEN_SECRET = "gpufarm-local-upload-tokens"  # noqa: S105 - documented local-only value
# Template parameters as a local run wants them (anything else: the template's Default, else empty).
LOCAL_PARAMETERS = {
    "DatadogSite": "datadoghq.com",
    "OperatorsUsergroup": "S0000000001",
    "OperatorsChannel": "C0000000001",
}
# Variables that would send a local run to AWS: secrets come from the sandbox, the farm config from a file.
DROPPED_LOCALLY = frozenset({"GPUFARM_SECRETS_NAME", "GPUFARM_SECRET_KEYS", "GPUFARM_FARM_CONFIG_PARAMETER"})
# Variables only a local run with profiler runs sets (gpufarm_sandbox.localhost.profiles, with the bucket the pages
# function serves from): without it the pages function is not configured, so nothing should link to it.
SET_BY_PROFILES = frozenset({"GPUFARM_PROFILE_PAGES_URL"})
# The price cache: an S3 object in Lambda, a file of the local host's own locally (gpufarm_sandbox.localhost.host).
PRICE_CACHE_ENV = "GPUFARM_PRICE_CACHE"
SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)


class _NoValue:
    """AWS::NoValue: the property (here, the variable) is left out."""


NO_VALUE = _NoValue()


@dataclass(frozen=True)
class Urls:
    """Where things live on the local host."""

    base: str

    def function(self, dir_name: str) -> str:
        """A function's Function URL (with the trailing slash Lambda's URLs have)."""
        return f"{self.base}/fn/{dir_name}/"

    def queue(self, logical_id: str) -> str:
        """A queue's URL; messages are POSTed to `<url>/messages`."""
        return f"{self.base}/_local/queues/{logical_id}"

    @property
    def invoke(self) -> str:
        """Async invokes: POST `<url>/<FunctionName>`."""
        return f"{self.base}/_local/invoke"


class Resolver:
    """Evaluates CloudFormation intrinsics against local values (functions, queues, parameters, pseudo params)."""

    def __init__(self, template: Template, urls: Urls, parameters: Mapping[str, str]) -> None:
        self.template = template
        self.urls = urls
        self.parameters = dict(parameters)
        self.pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT_ID,
            "AWS::StackName": STACK_NAME,
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT_ID}:stack/{STACK_NAME}/local",
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }
        self.unresolved: set[str] = set()

    # -- references --------------------------------------------------------------------------------------------------

    def ref(self, name: str) -> Any:
        """`!Ref name`: parameter value, pseudo parameter, or the local identity of a resource."""
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        resource = self.template.resources.get(name)
        if resource is None:
            self.unresolved.add(name)
            return name
        if resource["Type"] == QUEUE_TYPE:
            return self.urls.queue(name)
        if resource["Type"] == "AWS::S3::Bucket":
            # A bucket's Ref is its name, which S3 wants lowercase: CloudFormation derives one from the stack and the
            # logical id. Locally moto serves it when the run needs S3 (localhost.profiles), else nothing does.
            return f"gpufarm-local-{name.lower()}"[:63]
        # Functions are invoked by logical id locally (the local invoke URL accepts it); other resources likewise.
        return name

    def get_att(self, name: str, attribute: str) -> Any:
        """`!GetAtt name.attribute` for the attributes a local run can answer."""
        if name.endswith("Url") and name[:-3] in self.template.functions and attribute == "FunctionUrl":
            return self.urls.function(self.template.functions[name[:-3]].dir_name)
        resource = self.template.resources.get(name)
        if resource is not None and resource["Type"] == QUEUE_TYPE:
            if attribute == "QueueName":
                return self.queue_name(name)
            # Locally the queue URL is what a client can use, whether the template asked for Arn or QueueUrl.
            return self.urls.queue(name)
        if resource is not None and resource["Type"] == FUNCTION_TYPE and attribute == "Arn":
            return f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{name}"
        self.unresolved.add(f"{name}.{attribute}")
        return f"{name}.{attribute}"

    def queue_name(self, logical_id: str) -> str:
        """The queue's name: its QueueName resolved, else the logical id (+ .fifo for FIFO queues)."""
        spec = self.template.queues[logical_id]
        if spec.name is not None:
            value = self.resolve(spec.name)
            if isinstance(value, str) and value:
                return value
        return logical_id + (".fifo" if spec.fifo else "")

    # -- evaluation ----------------------------------------------------------------------------------------------------

    def condition(self, name: str) -> bool:
        """A named condition of the template."""
        if name not in self.template.conditions:
            self.unresolved.add(f"Condition {name}")
            return False
        return bool(self.resolve(self.template.conditions[name]))

    def resolve(self, value: Any) -> Any:
        """Evaluate intrinsics recursively; unknown ones resolve to their name and are reported once."""
        if isinstance(value, list):
            return [v for v in (self.resolve(item) for item in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            handler = _INTRINSICS.get(key)
            if handler is not None:
                return handler(self, arg)
            if key.startswith("Fn::"):
                self.unresolved.add(key)
                return key
        return {k: v for k, v in ((k, self.resolve(v)) for k, v in value.items()) if v is not NO_VALUE}

    def sub(self, arg: Any) -> str:
        """`!Sub`: `${Name}`, `${Resource.Attr}` and `${!Literal}`, with an optional variable map."""
        template, variables = (arg[0], self.resolve(arg[1])) if isinstance(arg, list) else (arg, {})

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                resource, _, attribute = name.partition(".")
                return str(self.get_att(resource, attribute))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", replace, str(template))


def _if(resolver: Resolver, arg: Any) -> Any:
    name, when_true, when_false = arg
    return resolver.resolve(when_true if resolver.condition(name) else when_false)


def _join(resolver: Resolver, arg: Any) -> str:
    separator, items = arg
    return str(separator).join(str(i) for i in resolver.resolve(items))


def _select(resolver: Resolver, arg: Any) -> Any:
    index, items = arg
    return resolver.resolve(items)[int(resolver.resolve(index))]


def _split(resolver: Resolver, arg: Any) -> list[str]:
    separator, text = arg
    return str(resolver.resolve(text)).split(str(separator))


def _get_att(resolver: Resolver, arg: Any) -> Any:
    name, attribute = arg
    return resolver.get_att(str(name), str(resolver.resolve(attribute)))


_INTRINSICS: dict[str, Any] = {
    "Ref": lambda r, a: r.ref(str(a)),
    "Condition": lambda r, a: r.condition(str(a)),
    "Fn::GetAtt": _get_att,
    "Fn::Sub": lambda r, a: r.sub(a),
    "Fn::If": _if,
    "Fn::Join": _join,
    "Fn::Select": _select,
    "Fn::Split": _split,
    "Fn::Equals": lambda r, a: r.resolve(a[0]) == r.resolve(a[1]),
    "Fn::Not": lambda r, a: not r.resolve(a[0]),
    "Fn::And": lambda r, a: all(r.resolve(x) for x in a),
    "Fn::Or": lambda r, a: any(r.resolve(x) for x in a),
    "Fn::ToJsonString": lambda r, a: json.dumps(r.resolve(a), separators=(",", ":")),
}


def local_parameters(template: Template, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Parameter values for a local run: overrides, then LOCAL_PARAMETERS, then the template's Default."""
    values: dict[str, str] = {}
    for name, spec in template.parameters.items():
        default = spec.get("Default")
        values[name] = "" if default is None else str(default)
        if name in LOCAL_PARAMETERS:
            values[name] = LOCAL_PARAMETERS[name]
    for name, value in (overrides or {}).items():
        values[name] = str(value)
    return values


def _as_env(value: Any) -> str | None:
    if value is NO_VALUE or value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def function_environment(resolver: Resolver, variables: Mapping[str, Any]) -> dict[str, str]:
    """One function's Environment.Variables resolved to strings (NoValue and locally dropped ones left out)."""
    out: dict[str, str] = {}
    for name, raw in variables.items():
        if name in DROPPED_LOCALLY or name in SET_BY_PROFILES:
            continue
        value = _as_env(resolver.resolve(raw))
        if value is not None and value != "":
            out[name] = value
    return out


def sandbox_environment(sandbox: Sandbox, urls: Urls, root: Path) -> dict[str, str]:
    """Variables that point gpufarm's clients at the sandbox and the local host."""
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN

    env = {
        "GPUFARM_DATADOG_HOST": urls.base,
        "GPUFARM_SLACK_API_URL": f"{urls.base}/slack/api/",
        "DD_API_KEY": _pick(sandbox.dd_api_keys, DEFAULT_DD_API_KEY),
        "DD_APP_KEY": _pick(sandbox.dd_app_keys, DEFAULT_DD_APP_KEY),
        "SLACK_BOT_TOKEN": _pick(sandbox.slack_tokens, DEFAULT_SLACK_TOKEN),
        "SLACK_SIGNING_SECRET": sandbox.slack_signing_secret,
        "GPUFARM_WEBHOOK_SECRET": LOCAL_WEBHOOK_SECRET,
        "GPUFARM_UPLOAD_TOKEN_SECRET": LOCAL_UPLOAD_TOKEN_SECRET,
        "GPUFARM_LOCAL_INVOKE_URL": urls.invoke,
        "GPUFARM_PUBLIC_URL": urls.base,
        "GPUFARM_SANDBOX_URL": urls.base,
        "GPUFARM_INCIDENT_WEBHOOK_URL": urls.function("incident_webhook"),
        "GPUFARM_IDLE_WEBHOOK_URL": urls.function("idle_alert"),
        # What `gpufarm doctor` checks the ingress's Function URL with.
        "GPUFARM_SLACK_INGRESS_URL": urls.function("slack_ingress"),
    }
    example = root / "config" / "farm.example.yaml"
    if example.is_file():
        # The local stand-in for the SSM farm parameter.
        env["GPUFARM_FARM_CONFIG"] = str(example)
    return env


def _pick(allowed: frozenset[str], preferred: str) -> str:
    return preferred if preferred in allowed else sorted(allowed)[0]


def build_environment(
    template: Template,
    sandbox: Sandbox,
    urls: Urls,
    root: Path,
    parameters: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The union of every function's resolved variables plus the sandbox pointers (which win).

    All functions share one process, so they share os.environ; a variable two functions set differently keeps
    the first value and is logged.
    """
    resolver = Resolver(template, urls, local_parameters(template, parameters))
    env: dict[str, str] = {}
    for spec in template.functions.values():
        for name, value in function_environment(resolver, spec.environment).items():
            if name in env and env[name] != value:
                log.warning(
                    "%s differs between functions (%s keeps %r); functions share os.environ locally",
                    name,
                    spec.logical_id,
                    env[name] if not SECRET_NAMES.search(name) else "***",
                )
                continue
            env.setdefault(name, value)
    if resolver.unresolved:
        log.warning("template references the local host cannot resolve: %s", ", ".join(sorted(resolver.unresolved)))
    env.update(sandbox_environment(sandbox, urls, root))
    return env


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with secret-looking values masked (for printing)."""
    return {k: ("***" if SECRET_NAMES.search(k) else v) for k, v in env.items()}
