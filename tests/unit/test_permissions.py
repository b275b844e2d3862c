"""docs/deploy.md, "What to grant", against the code, both ways: every call the shipped code makes (found by ast,
tests/permissions.py) has its permission, scope or action in the tables, and every grant listed is needed by a
call; the AWS table against template.yaml's statements, the Slack table against slack/manifest.yaml's scopes.
Each check is also run on a wrong input, to show the mistake it exists for is reported."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import permission_tables as pt
import permissions as pm
import pytest
import yaml

from gpufarm_sandbox.localhost.template import load_yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs/deploy.md"
MANIFEST = ROOT / "slack" / "manifest.yaml"
TEMPLATE = ROOT / "template.yaml"
FAKE = "layers/gpufarm/gpufarm/adapters/fake.py"

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return pm.shipped_sources()


@pytest.fixture(scope="module")
def tables() -> dict[str, list[dict[str, str]]]:
    return pt.tables(DEPLOY.read_text())


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return pm.load_json("datadog-operations.json")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_yaml(TEMPLATE.read_text())  # type: ignore[no-any-return]


# -- Datadog -----------------------------------------------------------------------------------------------------


def datadog_problems(
    sources: Mapping[str, str], table: list[dict[str, str]], spec: Mapping[str, Any]
) -> tuple[list[str], set[str]]:
    """What is wrong between the Datadog calls of `sources` and the table, and the permissions they take."""
    calls, problems = pm.datadog_calls(sources)
    operations, unknown = pm.datadog_operations(calls, spec)
    needs: dict[str, pt.Need] = {}
    parts: dict[str, set[str]] = {}
    for key, made in operations.items():
        version, operation_id = key.split(" ")
        needs[operation_id] = pt.datadog_need(spec[version][operation_id])
        parts[operation_id] = {c.part for c in made}
    if len(needs) != len(operations):
        problems.append("an operationId is called in both v1 and v2: the table cannot tell them apart")
    rows = pt.rows(table, "permission", "operations", r"[A-Z]\w+", parts="called by")
    checked, taken = pt.check(needs, rows, "the Datadog table", parts)
    return problems + unknown + checked, taken


def test_the_datadog_table_lists_what_the_calls_need_and_nothing_else(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]], spec: dict[str, Any]
) -> None:
    problems, taken = datadog_problems(sources, tables["Datadog"], spec)
    assert problems == []
    # The finder sees each part: the runtime's incidents, apply's incident settings, the node's series.
    assert {"incident_write", "incident_settings_write", "timeseries_query"} <= taken


def test_the_finder_tells_the_three_parts_apart(sources: dict[str, str], spec: dict[str, Any]) -> None:
    calls, _ = pm.datadog_calls(sources)
    operations, _ = pm.datadog_operations(calls, spec)
    by_part = {
        p: {k.split(" ")[1] for k, made in operations.items() if p in {c.part for c in made}}
        for p in (pm.FUNCTIONS, pm.APPLY, pm.NODE)
    }
    # The node agent only sends series (a raw POST) and keeps its host's tags; apply never touches a lease.
    assert by_part[pm.NODE] == {"SubmitMetrics", "GetHostTags", "CreateHostTags", "UpdateHostTags"}
    assert not by_part[pm.APPLY] & {"CreateIncident", "UpdateIncident", "SearchIncidents"}


def test_the_spec_subset_is_the_operations_called(sources: dict[str, str], spec: dict[str, Any]) -> None:
    calls, _ = pm.datadog_calls(sources)
    operations, _ = pm.datadog_operations(calls, spec)
    assert {f"{v} {i}" for v in ("v1", "v2") for i in spec[v]} == set(operations)


def test_a_call_whose_permission_the_table_lacks_is_reported(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]], spec: dict[str, Any]
) -> None:
    fake = (
        "from gpufarm.adapters import datadog_client as dc\n\n\n"
        "def users(client):\n"
        '    api = dc.build("datadog_api_client.v2.api.users_api", "UsersApi", client)\n'
        "    return api.list_users()\n"
    )
    with_fake = {**sources, FAKE: fake}
    problems, _ = datadog_problems(with_fake, tables["Datadog"], spec)
    assert problems == [
        f"{FAKE}:6: v2:list_users (GET /api/v2/users) is not one operation of tests/fixtures/permissions/"
        "datadog-operations.json: copy it from Datadog's OpenAPI spec (method, path, x-permission, security)"
    ]
    listed = {
        **spec,
        "v2": {
            **spec["v2"],
            "ListUsers": {
                "method": "GET",
                "path": "/api/v2/users",
                "x-permission": {"operator": "OR", "permissions": ["user_access_read"]},
            },
        },
    }
    problems, _ = datadog_problems(with_fake, tables["Datadog"], listed)
    assert problems == ["ListUsers needs one of ['user_access_read']; the Datadog table lists none"]


def test_a_permission_no_call_needs_and_a_wrong_row_are_reported(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]], spec: dict[str, Any]
) -> None:
    table = [dict(row) for row in tables["Datadog"]]
    table.append({"permission": "`logs_read_data`", "operations": "`ListLogs`", "called by": "functions"})
    hosts = next(row for row in table if row["permission"] == "`hosts_read`")
    hosts["called by"] = "functions, node agent"
    problems, _ = datadog_problems(sources, table, spec)
    assert problems == [
        "the Datadog table, hosts_read: the table names ['functions', 'node agent'], the calls are ['functions']",
        "the Datadog table lists logs_read_data, which no call needs",
    ]


def test_alternatives_and_keys_follow_the_spec() -> None:
    assert pt.datadog_need({"x-permission": {"operator": "AND", "permissions": ["a", "b"]}}) == pt.Need(
        all_of=frozenset({"a", "b"})
    )
    assert pt.datadog_need({"x-permission": {"operator": "OR", "permissions": ["a", "b"]}}) == pt.Need(
        any_of=frozenset({"a", "b"})
    )
    assert pt.datadog_need({"security": [{"apiKeyAuth": []}]}).none == "API key only"
    opened = {"x-permission": {"operator": "OPEN", "permissions": []}, "security": [{"apiKeyAuth": []}]}
    assert pt.datadog_need(opened) == pt.Need(none="API key only")
    assert pt.datadog_need({"security": None}).none == "API key and application key"
    both = [pt.Row("a", frozenset({"X"})), pt.Row("b", frozenset({"X"}))]
    problems, _ = pt.check({"X": pt.Need(any_of=frozenset({"a", "b"}))}, both, "T")
    assert problems == ["X needs one of ['a', 'b']; T lists all of ['a', 'b']"]


# -- Slack -------------------------------------------------------------------------------------------------------


def slack_problems(
    sources: Mapping[str, str], table: list[dict[str, str]], manifest: Mapping[str, Any], scopes: Mapping[str, Any]
) -> list[str]:
    """What is wrong between the Slack calls of `sources`, the table and the manifest's bot scopes."""
    calls, problems = pm.slack_calls(sources)
    needs: dict[str, pt.Need] = {}
    for method in sorted({c.name for c in calls}):
        known = scopes["methods"].get(method)
        if known is None:
            problems.append(f"{method}: not in tests/fixtures/permissions/slack-scopes.json (see Slack's reference)")
            continue
        needs[method] = pt.Need(any_of=frozenset(known["scopes"]), none="bot token")
    for command in manifest["features"].get("slash_commands", []):
        needs[command["command"]] = pt.Need(any_of=frozenset(scopes["features"]["slash_commands"]["scopes"]))
    rows = pt.rows(table, "scope", "Web API methods", r"/\S+|[a-z]+(\.[A-Za-z]+)+")
    checked, taken = pt.check(needs, rows, "the Slack table", None)
    declared = set(manifest["oauth_config"]["scopes"]["bot"])
    problems += [f"slack/manifest.yaml asks for {s}, which nothing needs" for s in sorted(declared - taken)]
    problems += [f"slack/manifest.yaml lacks {s}" for s in sorted(taken - declared)]
    return problems + checked


def test_the_slack_table_and_the_manifest_hold_what_the_calls_need(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]]
) -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert slack_problems(sources, tables["Slack"], manifest, pm.load_json("slack-scopes.json")) == []


def test_the_slack_finder_reads_the_clients_methods(sources: dict[str, str]) -> None:
    calls, _ = pm.slack_calls(sources)
    # files_upload_v2 is two Web API calls (slack_sdk's source); the rest go through SlackChat._call's getattr.
    assert {"files.getUploadURLExternal", "files.completeUploadExternal", "chat.postMessage", "views.open"} <= {
        c.name for c in calls
    }


def test_an_unlisted_scope_and_an_unused_manifest_scope_are_reported(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]]
) -> None:
    fake = (
        "from slack_sdk.web.client import WebClient\n\n\n"
        "def pin(token):\n"
        "    return WebClient(token=token).pins_add(channel='C1', timestamp='1')\n"
    )
    manifest = yaml.safe_load(MANIFEST.read_text())
    manifest["oauth_config"]["scopes"]["bot"].append("channels:history")
    scopes = pm.load_json("slack-scopes.json")
    scopes["methods"]["pins.add"] = {"scopes": ["pins:write"]}
    assert slack_problems({**sources, FAKE: fake}, tables["Slack"], manifest, scopes) == [
        "slack/manifest.yaml asks for channels:history, which nothing needs",
        "pins.add needs one of ['pins:write']; the Slack table lists none",
    ]


# -- AWS ---------------------------------------------------------------------------------------------------------


def aws_problems(sources: Mapping[str, str], table: list[dict[str, str]], template: Mapping[str, Any]) -> list[str]:
    """What is wrong between the botocore calls of `sources`, the AWS table and template.yaml's statements."""
    calls, problems = pm.aws_calls(sources)
    by_action = pm.iam_actions(calls, sources, pm.load_json("aws-actions.json"))
    needs: dict[str, set[str]] = {}
    for action, made in by_action.items():
        for call in made:
            needs.setdefault(call.name, set()).add(action)
    rows = pt.rows(table, "IAM action", "calls", r"[a-z0-9-]+\.[a-z_]+")
    checked, _ = pt.check({k: pt.Need(all_of=frozenset(v)) for k, v in needs.items()}, rows, "the AWS table")
    grants, functions, unread = pt.template_grants(template)
    return problems + checked + unread + pt.check_granted_to(rows, grants, functions)


def test_the_aws_table_lists_what_the_calls_need_as_template_yaml_grants_it(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]], template: dict[str, Any]
) -> None:
    assert aws_problems(sources, tables["AWS"], template) == []


def test_the_aws_finder_names_actions_as_iam_does(sources: dict[str, str]) -> None:
    calls, _ = pm.aws_calls(sources)
    actions = pm.iam_actions(calls, sources, pm.load_json("aws-actions.json"))
    # botocore's operation names, not a CamelCase of the method (GetAWS..., not GetAws...); Invoke is renamed.
    assert {"servicequotas:GetAWSDefaultServiceQuota", "lambda:InvokeFunction", "secretsmanager:GetSecretValue"} <= set(
        actions
    )
    assert "lambda:Invoke" not in actions


def test_an_ungranted_call_and_an_unneeded_grant_are_reported(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]], template: dict[str, Any]
) -> None:
    fake = (
        "from gpufarm.adapters.aws import aws_client\n\n\n"
        "def drain(settings, url):\n"
        '    aws_client("sqs", settings).delete_message(QueueUrl=url, ReceiptHandle="h")\n'
    )
    changed = copy.deepcopy(template)
    digest = changed["Resources"]["DailyDigestFunction"]["Properties"]
    digest["Policies"].append({"Statement": [{"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"}]})
    assert aws_problems({**sources, FAKE: fake}, tables["AWS"], changed) == [
        "sqs.delete_message needs sqs:DeleteMessage, which the AWS table does not list",
        "AWS, ec2:DescribeInstances: the table names functions ['QuotaSyncFunction'], template.yaml grants it to "
        "['DailyDigestFunction', 'QuotaSyncFunction']",
    ]


# -- Azure -------------------------------------------------------------------------------------------------------


def test_the_azure_table_lists_the_actions_of_the_compute_calls(
    sources: dict[str, str], tables: dict[str, list[dict[str, str]]]
) -> None:
    calls, problems = pm.azure_calls(sources)
    needs: dict[str, pt.Need] = {}
    for call in calls:
        action = pm.azure_action(*call.name.split("."))
        needs[call.name] = pt.Need(all_of=frozenset({action or f"no action for {call.name}"}))
    checked, _ = pt.check(needs, pt.rows(tables["Azure"], "action", "calls", r"[a-z_]+\.[a-z_]+"), "the Azure table")
    assert problems + checked == []
    assert pm.azure_action("usage", "list") == "Microsoft.Compute/locations/usages/read"
    assert pm.azure_action("virtual_machines", "no_such_call") is None


_SCOPE_LIST = re.compile(r"Its scopes: ((?:`[a-z:_.]+`(?:, |,\s+)?)+)")


def scope_lists(text: str) -> list[list[str]]:
    """Every prose list of the Slack app's scopes (`Its scopes: `a`, `b`...`) in a page."""
    return [re.findall(r"`([^`]+)`", found) for found in _SCOPE_LIST.findall(text)]


def test_the_scope_lists_of_the_readme_and_the_docs_are_the_manifests() -> None:
    declared = yaml.safe_load(MANIFEST.read_text())["oauth_config"]["scopes"]["bot"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = {page.name: lists for page in pages if (lists := scope_lists(page.read_text(encoding="utf-8")))}
    assert found, "no page lists the Slack app's scopes"
    for page, lists in found.items():
        assert all(listed == declared for listed in lists), f"{page} lists {lists}; slack/manifest.yaml has {declared}"
    # A list that drifted is caught: one scope short.
    assert scope_lists("Its scopes: `commands`, `chat:write`") == [["commands", "chat:write"]]
