"""Each function may read only the secret keys its code uses, and only what it needs of the profile bucket
(docs/security.md, "Threat model", "What each function may read").

The deployment's secret keys are one Secrets Manager secret each (`<SecretsName>/<key>`), so IAM bounds what a
function can read whatever its code does: a function's role is granted GetSecretValue on exactly the keys its
GPUFARM_SECRET_KEYS names (and their Parameter Store references, the path the runtime reads them by), and those are
exactly the keys its handler's code can reach (tests/secret_uses.py). The public profile pages function, the one a
stranger's link reaches, may read the link keys and `profiles/*` objects, and nothing else of either; no function
may write `profiles/*` unless its code stores runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from secret_uses import function_reach

from gpufarm.config import SECRET_KEYS
from gpufarm_sandbox.localhost.template import load_yaml

ROOT = Path(__file__).resolve().parents[2]
SECRET_ARN = re.compile(
    r"^arn:\$\{AWS::Partition\}:secretsmanager:\$\{AWS::Region\}:\$\{AWS::AccountId\}:secret:\$\{SecretsName\}/([a-z_]+)-\?{6}$"
)
REFERENCE_ARN = re.compile(
    r"^arn:\$\{AWS::Partition\}:ssm:\$\{AWS::Region\}:\$\{AWS::AccountId\}:"
    r"parameter/aws/reference/secretsmanager/\$\{SecretsName\}/([a-z_]+)$"
)
PAGES = "ProfilePagesFunction"
LINK_KEYS = {"profile_link_secret", "profile_link_secret_previous"}
# What stores a run in the profile bucket (gpufarm.adapters.profile_store).
REFRESHES_PRICES = ("gpufarm.core.sync.prices", "refresh_prices")
PRICE_CACHE_WRITE = ("s3:PutObject", "${ProfileBucket.Arn}/rates/*")
PRICE_CACHE_LIST = ("s3:ListBucket", "${ProfileBucket.Arn}")
STORES_RUNS = ("gpufarm.adapters.profile_store", "S3ProfileStore.put_run")
# The code that signs researchers' PUT URLs for incoming/ (the upload function): its role is what the URLs may do.
TAKES_UPLOADS = ("gpufarm.adapters.profile_store", "S3ProfileStore.presign_put")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml((ROOT / "template.yaml").read_text())
    return loaded


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == "AWS::Serverless::Function"}


def _statements(template: dict[str, Any], props: dict[str, Any]) -> list[dict[str, Any]]:
    """Every statement the function's role gets: its inline ones and its managed policies' (a conditional statement
    with its granting branch)."""
    out: list[dict[str, Any]] = []
    for policy in props.get("Policies", []):
        if "Ref" in policy:
            document = template["Resources"][policy["Ref"]]["Properties"]["PolicyDocument"]
            out += document["Statement"]
        else:
            assert "Statement" in policy, f"{next(iter(policy))}: a SAM policy template grants more than it shows"
            out += policy["Statement"]
    return [s["Fn::If"][1] if "Fn::If" in s else s for s in out]


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _text(resource: Any) -> str:
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        return str(resource["Fn::Sub"])
    if isinstance(resource, dict) and "Ref" in resource:
        return "${" + str(resource["Ref"]) + "}"
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        return "${" + ".".join(resource["Fn::GetAtt"]) + "}"
    return str(resource)


def _grants(template: dict[str, Any], props: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (action, _text(resource))
        for statement in _statements(template, props)
        if statement["Effect"] == "Allow"
        for action in _listed(statement["Action"])
        for resource in _listed(statement["Resource"])
    }


def _secret_keys_granted(grants: set[tuple[str, str]]) -> tuple[set[str], set[str]]:
    """The keys the role may read (GetSecretValue on `<SecretsName>/<key>`) and may ask Parameter Store for."""
    secrets = {m[1] for a, r in grants if a == "secretsmanager:GetSecretValue" and (m := SECRET_ARN.match(r))}
    references = {m[1] for a, r in grants if a == "ssm:GetParameters" and (m := REFERENCE_ARN.match(r))}
    return secrets, references


def _function_dir(props: dict[str, Any]) -> str:
    return str(props["CodeUri"]).removeprefix("functions/")


def test_each_function_declares_exactly_the_keys_its_code_reads(template: dict[str, Any]) -> None:
    functions = _functions(template)
    assert len(functions) >= 7
    for logical_id, props in functions.items():
        declared = props["Environment"]["Variables"]["GPUFARM_SECRET_KEYS"].split(",")
        assert len(declared) == len(set(declared)), logical_id
        assert set(declared) <= set(SECRET_KEYS), logical_id
        keys, _ = function_reach(_function_dir(props))
        assert set(declared) == keys, f"{logical_id} declares {sorted(declared)}; its code reads {sorted(keys)}"


def test_each_role_may_read_exactly_its_declared_keys(template: dict[str, Any]) -> None:
    for logical_id, props in _functions(template).items():
        declared = set(props["Environment"]["Variables"]["GPUFARM_SECRET_KEYS"].split(","))
        grants = _grants(template, props)
        secrets, references = _secret_keys_granted(grants)
        assert secrets == declared, logical_id
        assert references == declared, logical_id
        # Nothing else of Secrets Manager or Parameter Store: no wildcard, no whole prefix, no other secret but the
        # Datadog extension's own API key (a plain-text secret of the operator's, read by the extension).
        others = {
            (action, resource)
            for action, resource in grants
            if action.startswith(("secretsmanager:", "ssm:"))
            and not SECRET_ARN.match(resource)
            and not REFERENCE_ARN.match(resource)
        }
        assert others == {
            ("secretsmanager:GetSecretValue", "${DatadogApiKeySecretArn}"),
            (
                "ssm:GetParameters",
                "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/${FarmConfigParameter}",
            ),
        }, logical_id


def test_the_whole_prefix_is_granted_to_no_one(template: dict[str, Any]) -> None:
    """No statement anywhere in the template names the secrets by a pattern wider than one key."""
    text = (ROOT / "template.yaml").read_text()
    assert not re.search(r"\$\{SecretsName\}(-\*|/\*|\*|\")", text)


def test_the_public_pages_function_reads_only_the_link_keys_and_stored_runs(template: dict[str, Any]) -> None:
    props = _functions(template)[PAGES]
    grants = _grants(template, props)
    secrets, _ = _secret_keys_granted(grants)
    assert secrets == LINK_KEYS
    s3 = {(action, resource) for action, resource in grants if action.startswith("s3:")}
    assert s3 == {("s3:GetObject", "${ProfileBucket.Arn}/profiles/*")}
    assert {a for a, _ in grants} == {"s3:GetObject", "secretsmanager:GetSecretValue", "ssm:GetParameters"}


def test_no_function_writes_profiles_unless_its_code_stores_runs(template: dict[str, Any]) -> None:
    for logical_id, props in _functions(template).items():
        writes = {
            (action, resource)
            for action, resource in _grants(template, props)
            if action.startswith("s3:") and action != "s3:GetObject"
        }
        _, reached = function_reach(_function_dir(props))
        # The cached list prices under rates/ (and the bucket's listing, so a cache not yet written reads as
        # missing): only for the code that refreshes them, never a run's place.
        prices = {w for w in writes if w in (PRICE_CACHE_WRITE, PRICE_CACHE_LIST)}
        assert not prices or REFRESHES_PRICES in reached, f"{logical_id} may write the price cache but never does"
        writes -= prices
        if STORES_RUNS not in reached:
            assert writes == set(), f"{logical_id} may write the profile bucket but its code stores no run"
        else:
            allowed = {"${ProfileBucket.Arn}/profiles/*"}
            if TAKES_UPLOADS in reached:
                allowed.add("${ProfileBucket.Arn}/incoming/*")
            assert {r for _, r in writes} <= allowed, logical_id


def test_the_security_docs_say_what_each_function_may_read(template: dict[str, Any]) -> None:
    text = (ROOT / "docs/security.md").read_text()
    section = text.split("### What each function may read", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(\w+Function)` \| (.+) \|$", section, re.MULTILINE)
    documented = {name: set(re.findall(r"`(\w+)`", keys)) for name, keys in rows}
    declared = {
        logical_id: set(props["Environment"]["Variables"]["GPUFARM_SECRET_KEYS"].split(","))
        for logical_id, props in _functions(template).items()
    }
    assert documented == declared
