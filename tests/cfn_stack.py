"""template.yaml as a stack, offline: the SAM transform, `sam package`'s uploads, then moto's CloudFormation.

What the check proves and what moto cannot create: docs/deploy.md, "What the local stack check covers". Nothing here
needs Docker, the network or an AWS account: samtranslator runs in-process on its bundled managed-policy map, and
every AWS call goes to moto.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from botocore.exceptions import WaiterError
from moto.cloudformation import parsing
from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
from samtranslator.translator.transform import transform

from gpufarm_sandbox.localhost.template import load_yaml

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
STACK = "gpufarm"
ARTIFACT_BUCKET = "gpufarm-sam-artifacts"
_PACKAGED = ("CodeUri", "ContentUri")  # the local paths `sam package` uploads and rewrites
# moto's words for a resource type its CloudFormation has no model for (moto/cloudformation/parsing.py).
_UNSUPPORTED_WARNING = re.compile(r"Tried to parse (\S+) but it's not supported")
_SUB_NAME = re.compile(r"\$\{([^!}][^}]*)\}")
NO_VALUE = object()  # what `!Ref AWS::NoValue` resolves to: the property or list item is left out


class OfflinePolicies(ManagedPolicyLoader):
    """samtranslator's managed-policy source without IAM: SAM reads AWS managed policy names from the map it bundles
    (samtranslator.internal.managed_policies) and asks this loader only for a name that map lacks."""

    def __init__(self) -> None:  # no IAM client: nothing here may reach AWS
        pass

    def load(self) -> dict[str, str]:
        """Fail: the template names a managed policy that is neither an AWS managed one nor an ARN."""
        raise AssertionError("template.yaml names a managed policy SAM cannot resolve without IAM")


@dataclass(frozen=True)
class Artifact:
    """One zip `sam package` would upload: where it went and the digest Lambda reports for it."""

    key: str
    sha256: str  # base64, as Lambda's CodeSha256


def package(template: dict[str, Any], root: Path, put: Callable[[str, bytes], None]) -> dict[str, Artifact]:
    """Zip every local CodeUri / ContentUri folder, upload it with `put(key, body)` and rewrite the URI to
    s3://ARTIFACT_BUCKET/<md5>, as `sam package` does; the artifacts by logical id."""
    artifacts: dict[str, Artifact] = {}
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        for name in _PACKAGED:
            uri = properties.get(name)
            if not isinstance(uri, str) or uri.startswith("s3://"):
                continue
            body = _zip_folder(root / uri)
            key = hashlib.md5(body, usedforsecurity=False).hexdigest()
            put(key, body)
            properties[name] = f"s3://{ARTIFACT_BUCKET}/{key}"
            artifacts[logical_id] = Artifact(key, base64.b64encode(hashlib.sha256(body).digest()).decode())
    return artifacts


def _zip_folder(folder: Path) -> bytes:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is named by template.yaml but is not a folder")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and not path.parent.name.endswith(".egg-info"):
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


def load_template(path: Path) -> dict[str, Any]:
    """template.yaml as data, intrinsic functions in their long form."""
    data = load_yaml(path.read_text())
    assert isinstance(data, dict)
    return data


def sam_transform(template: dict[str, Any], parameters: dict[str, str]) -> dict[str, Any]:
    """The CloudFormation template the AWS::Serverless-2016-10-31 transform makes of a packaged SAM template."""
    return transform(template, dict(parameters), OfflinePolicies())


def unsupported(template: dict[str, Any]) -> dict[str, str]:
    """The resources (logical id -> type) moto's CloudFormation has no model for: it skips each with a warning."""
    modelled = parsing.get_model_map()
    return {
        logical_id: resource["Type"]
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] not in modelled
        and resource["Type"] not in parsing.NULL_MODELS
        and not resource["Type"].startswith("Custom::")
    }


def references(node: Any) -> Iterator[str]:
    """Every logical name a piece of template refers to (Ref, Fn::GetAtt, Fn::Sub, DependsOn)."""
    if isinstance(node, list):
        for item in node:
            yield from references(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                yield value
            elif key == "Fn::GetAtt":
                yield value[0] if isinstance(value, list) else value.split(".")[0]
            elif key == "Fn::Sub":
                text, names = (value, {}) if isinstance(value, str) else value
                yield from (name.split(".")[0] for name in _SUB_NAME.findall(text))
                yield from references(names)
            elif key == "DependsOn":
                yield from [value] if isinstance(value, str) else value
            else:
                yield from references(value)


STAND_IN = "https://{target}.{attribute}.unresolved.invalid/"


def stand_in_environment(template: dict[str, Any], missing: set[str]) -> dict[tuple[str, str], str]:
    """Replace, in place, each function environment variable that reads an attribute of a resource moto skips
    (`!GetAtt ProfilePagesFunctionUrl.FunctionUrl`) by a stand-in URL naming it, so the function is still created
    and checked; returns (function, variable) -> "Resource.Attribute" for each one replaced."""
    replaced: dict[tuple[str, str], str] = {}
    for logical_id, resource in template["Resources"].items():
        variables = ((resource.get("Properties") or {}).get("Environment") or {}).get("Variables") or {}
        for name, value in variables.items():
            target = value.get("Fn::GetAtt") if isinstance(value, dict) else None
            if isinstance(target, str):
                target = target.split(".", 1)
            if isinstance(target, list) and len(target) == 2 and target[0] in missing:
                variables[name] = STAND_IN.format(target=target[0], attribute=target[1])
                replaced[(logical_id, name)] = f"{target[0]}.{target[1]}"
    return replaced


def dependents(template: dict[str, Any], missing: set[str]) -> tuple[set[str], set[str]]:
    """The resources and outputs that refer, directly or through each other, to a resource in `missing`.

    moto cannot build them: a Ref to a resource it skipped resolves to nothing, so a required property disappears
    (a Lambda permission without FunctionName) or an output's Fn::GetAtt finds no model and moto fails outright.
    """
    left_out: set[str] = set()
    while True:
        gone = missing | left_out
        more = {
            logical_id
            for logical_id, resource in template["Resources"].items()
            if logical_id not in gone and gone.intersection(references(resource))
        }
        if not more:
            break
        left_out |= more
    outputs = {name for name, output in template.get("Outputs", {}).items() if gone.intersection(references(output))}
    return left_out, outputs


def without(template: dict[str, Any], resources: set[str], outputs: set[str]) -> dict[str, Any]:
    """A copy of the template less those resources and outputs."""
    kept = dict(template)
    kept["Resources"] = {k: v for k, v in template["Resources"].items() if k not in resources}
    kept["Outputs"] = {k: v for k, v in template.get("Outputs", {}).items() if k not in outputs}
    return kept


def _is_no_value(node: Any, resources_map: Any) -> bool:
    if node == {"Ref": "AWS::NoValue"}:
        return True
    if isinstance(node, dict) and list(node) == ["Fn::If"]:
        condition, when_true, when_false = node["Fn::If"]
        chosen = when_true if resources_map.lazy_condition_map[condition] else when_false
        return _is_no_value(chosen, resources_map)
    return False


@contextmanager
def no_value_leaves_lists() -> Iterator[None]:
    """CloudFormation drops a list item that resolves to AWS::NoValue (`!If [cond, x, !Ref AWS::NoValue]`); moto 5.2
    keeps it as None, so the conditional statement of FunctionConfigReadPolicy fails as MalformedPolicyDocument.
    Drop such items, by moto's own condition values, before moto reads the list."""
    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, list):
            resource_json = [item for item in resource_json if not _is_no_value(item, resources_map)]
        return original(resource_json, resources_map)

    with mock.patch.object(parsing, "clean_json", clean_json):
        yield


@dataclass
class Created:
    """What create_stack left: the stack's description, its resources and the types moto said it skipped."""

    stack: dict[str, Any]
    resources: list[dict[str, Any]]
    skipped_types: list[str]


def create_stack(cloudformation: Any, template: dict[str, Any], parameters: dict[str, str]) -> Created:
    """Create the stack in moto, wait for its outcome and record the resource types moto warned it skipped."""
    # moto warns of each skipped type whenever it reads the template again (the waiter, the descriptions) too.
    with warnings.catch_warnings(record=True) as caught, no_value_leaves_lists():
        warnings.simplefilter("always")
        cloudformation.create_stack(
            StackName=STACK,
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
        )
        # A failed creation stops the waiter; the status and its reason are the caller's to assert.
        with suppress(WaiterError):
            cloudformation.get_waiter("stack_create_complete").wait(
                StackName=STACK, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
            )
        stack = cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]
        resources = cloudformation.describe_stack_resources(StackName=STACK)["StackResources"]
    skipped = {m.group(1) for w in caught if (m := _UNSUPPORTED_WARNING.search(str(w.message)))}
    return Created(stack=stack, resources=resources, skipped_types=sorted(skipped))


class Resolver:
    """Resolves the intrinsic functions of the transformed template the way CloudFormation would, from the
    parameters and what the mocked services hold: the side of each comparison that the template states."""

    def __init__(
        self,
        template: dict[str, Any],
        parameters: dict[str, str],
        ref: Callable[[str], str],
        attribute: Callable[[str, str], str],
    ) -> None:
        self._parameters = {
            name: str(parameters.get(name, spec.get("Default", ""))) for name, spec in template["Parameters"].items()
        }
        self._pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::StackName": STACK,
        }
        self._conditions = template.get("Conditions", {})
        self._ref = ref
        self._attribute = attribute

    def value(self, node: Any) -> Any:
        """The node with every Ref, Fn::GetAtt, Fn::Sub and Fn::If resolved; AWS::NoValue items left out."""
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, argument), *_ = node.items()
            if key == "Ref":
                return self._reference(argument)
            if key == "Fn::GetAtt":
                return self._attribute(*(argument if isinstance(argument, list) else argument.split(".", 1)))
            if key == "Fn::Sub":
                return self._sub(argument)
            if key == "Fn::If":
                return self.value(argument[1] if self.condition(argument[0]) else argument[2])
            if key.startswith("Fn::"):
                raise ValueError(f"{key} is not resolved here: teach Resolver.value to")
        return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE}

    def condition(self, node: Any) -> bool:
        """A condition's truth: a name from Conditions, or Fn::Equals / Fn::Not / Fn::And / Fn::Or."""
        if isinstance(node, str):
            return self.condition(self._conditions[node])
        (key, argument), *_ = node.items()
        if key == "Fn::Equals":
            return bool(self.value(argument[0]) == self.value(argument[1]))
        if key == "Fn::Not":
            return not self.condition(argument[0])
        if key == "Fn::And":
            return all(self.condition(item) for item in argument)
        if key == "Fn::Or":
            return any(self.condition(item) for item in argument)
        if key == "Condition":
            return self.condition(argument)
        raise ValueError(f"not a condition: {node!r}")

    def _reference(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self._pseudo:
            return self._pseudo[name]
        if name in self._parameters:
            return self._parameters[name]
        return self._ref(name)

    def _sub(self, argument: Any) -> str:
        text, names = (argument, {}) if isinstance(argument, str) else argument

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in names:
                return str(self.value(names[name]))
            if "." in name:
                return str(self._attribute(*name.split(".", 1)))
            return str(self._reference(name))

        return _SUB_NAME.sub(one, text).replace("${!", "${")
