"""The sandbox's Datadog quirk modes: each one, alone, changes exactly what it says, and a sandbox without it keeps
Datadog's usual behaviour. Both sandboxes are driven the same way, through the real datadog-api-client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.v1.api.hosts_api import HostsApi
from datadog_api_client.v1.api.tags_api import TagsApi
from datadog_api_client.v1.api.webhooks_integration_api import WebhooksIntegrationApi
from datadog_api_client.v1.model.host_tags import HostTags
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from helpers import VALID_VALUES, Receiver, call, http

from gpufarm.config import Settings
from gpufarm.setup.plan import desired_fields
from gpufarm.setup.webhooks import CUSTOM_HEADERS, INCIDENT_PAYLOAD, SECRET_VARIABLE, TOKEN_HEADER
from gpufarm_sandbox.cli import sandbox as sandbox_command
from gpufarm_sandbox.demo import runner
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.runner import QUIRKS_ENV
from gpufarm_sandbox.demo.runner import demo as demo_command
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.quirks import (
    FACETS_400,
    FACETS_IGNORED,
    FIELDS_AS_STRING,
    NO_FIELD_TRIGGER,
    NO_HEADER_VARS,
    NO_LIST_WILDCARD,
    QUIRKS,
    TAG_SOURCE_USER,
    parse_quirks,
)
from gpufarm_sandbox.emulator.server import ServerThread
from gpufarm_sandbox.localhost.cli import local as local_command

pytestmark = pytest.mark.contract

SECRET = "quirk-secret-0b1c2d3e4f"
TYPE_NAME = "GPU allocation"
# gpufarm's single-valued fields the tests set that are text boxes, not dropdowns.
TEXTBOXES = frozenset({"requester"})


@dataclass
class Running:
    """A sandbox served on loopback, with the real client's incident, webhook, host and tag APIs aimed at it."""

    sandbox: Sandbox
    url: str
    incidents: IncidentsApi
    hooks: WebhooksIntegrationApi
    hosts: HostsApi
    tags: TagsApi


Start = Callable[[str], Running]


@pytest.fixture(scope="module")
def start() -> Iterator[Start]:
    """`start(quirks)`: the module's sandbox playing those quirks (one server each, made once), freshly reset."""
    made: dict[str, tuple[ServerThread, ApiClient, Running]] = {}

    def running(quirks: str) -> Running:
        if quirks not in made:
            app = Sandbox(quirks=quirks)
            server = ServerThread(app).start()
            app.base_url = server.url
            client = ApiClient(_configuration(server.url))
            apis = Running(
                app, server.url, IncidentsApi(client), WebhooksIntegrationApi(client), HostsApi(client), TagsApi(client)
            )
            made[quirks] = (server, client, apis)
        apis = made[quirks][2]
        apis.sandbox.reset()
        return apis

    yield running
    for server, client, apis in made.values():
        apis.sandbox.webhooks.drain(10)
        client.close()
        server.stop()


def _configuration(url: str) -> Configuration:
    cfg = Configuration(host=url, check_return_type=True)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    for name in list(cfg.unstable_operations.values):
        if "incident" in name:
            cfg.unstable_operations[name.split(".", 1)[1]] = True
    return cfg


# -- what `gpufarm datadog apply` makes, through the client ----------------------------------------------------


def define_type(run: Running) -> str:
    """gpufarm's incident type with its schema (plus `accrued_months`, a list field gpufarm may add); its id."""
    made = run.incidents.create_incident_type(
        body={"data": {"type": "incident_types", "attributes": {"name": TYPE_NAME, "description": "GPU leases"}}}
    )
    type_id = str(made.data.id)
    relationship = {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}}
    attributes = [a for _, a in desired_fields(VALID_VALUES) if a is not None]
    attributes.append({"name": "accrued_months", "display_name": "Accrued months", "type": 4})
    for attrs in attributes:
        run.incidents.create_incident_user_defined_field(
            body={"data": {"type": "user_defined_field", "attributes": attrs, "relationships": relationship}}
        )
    return type_id


def define_webhook(run: Running, type_id: str, target: str, *, renotify_on: list[str]) -> None:
    """The secret variable, gpufarm's incident webhook (its payload and token header) and its two rules."""
    run.hooks.create_webhooks_integration_custom_variable(
        body={"name": SECRET_VARIABLE, "value": SECRET, "is_secret": True}
    )
    headers = json.dumps({**json.loads(CUSTOM_HEADERS), "X-Gpufarm-Ir": "$INCIDENT_PUBLIC_ID"})
    run.hooks.create_webhooks_integration_custom_variable(
        body={"name": "HOOK_PATH", "value": "hook", "is_secret": False}
    )
    # A custom variable in the URL and a built-in one in a header, beside the secret one gpufarm sends.
    run.hooks.create_webhooks_integration(
        body={
            "name": "gpufarm-incidents",
            "url": f"{target}/$HOOK_PATH",
            "payload": INCIDENT_PAYLOAD,
            "custom_headers": headers,
        }
    )
    relationship = {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}}
    for trigger, renotify in (("incident_created_trigger", []), ("incident_modified_trigger", renotify_on)):
        attributes = {
            "conditions": [{"field": "state", "values": ["active", "stable", "resolved"]}],
            "handles": ["@webhook-gpufarm-incidents"],
            "trigger": trigger,
            "enabled": True,
            "renotify_on": renotify,
        }
        run.incidents.create_incident_notification_rule(
            body={
                "data": {
                    "type": "incident_notification_rules",
                    "attributes": attributes,
                    "relationships": relationship,
                }
            }
        )


def new_incident(run: Running, type_id: str, title: str, **fields: str | list[str]) -> str:
    """An incident of gpufarm's type with these fields (a list is a textarray); its id."""
    values = {name: {"type": _kind(name, value), "value": value} for name, value in fields.items()}
    body = {
        "data": {
            "type": "incidents",
            "attributes": {
                "title": title,
                "customer_impacted": False,
                "incident_type_uuid": type_id,
                "fields": values,
            },
        }
    }
    return str(run.incidents.create_incident(body=body).data.id)


def _kind(name: str, value: str | list[str]) -> str:
    if isinstance(value, list):
        return "textarray"
    return "textbox" if name in TEXTBOXES else "dropdown"


def patch(run: Running, incident_id: str, **fields: str) -> None:
    """Set dropdown fields (state and severity included)."""
    values = {name: {"type": "dropdown", "value": value} for name, value in fields.items()}
    body = {"data": {"id": incident_id, "type": "incidents", "attributes": {"fields": values}}}
    run.incidents.update_incident(incident_id=incident_id, body=body)


def search(run: Running, query: str) -> tuple[int, Any]:
    """(status, titles found sorted) for a 200, (status, the decoded error body) otherwise."""
    status, raw, _ = call(run.incidents, "search_incidents", query=query, page_size=100)
    if status != 200:
        return status, json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    return status, sorted(i["data"]["attributes"]["title"] for i in raw["data"]["attributes"]["incidents"])


@contextmanager
def receiving() -> Iterator[tuple[Receiver, str]]:
    """A webhook target on loopback recording every call, and its URL."""
    app = Receiver()
    with ServerThread(app) as server:
        yield app, server.url


def deliveries(run: Running, target: Receiver) -> list[dict[str, Any]]:
    """Every call the sandbox made to target once its deliveries are done: headers, body and event."""
    assert run.sandbox.webhooks.drain(10)
    return [{"path": c.path, "headers": c.headers, "body": c.body} for c in target.calls]


# -- 1. no-field-trigger -----------------------------------------------------------------------------------------


def fired_events(run: Running) -> list[tuple[str, str, str]]:
    """Create an incident, then change phase, state and severity in turn: (event, state, phase) of each webhook."""
    with receiving() as (target, url):
        type_id = define_type(run)
        # renotify_on names phase only: on Datadog as documented, state and severity changes stay quiet.
        define_webhook(run, type_id, url, renotify_on=["phase"])
        incident = new_incident(run, type_id, "req", phase="requested")
        patch(run, incident, phase="allocated")
        patch(run, incident, state="stable")
        patch(run, incident, severity="SEV-2")
        patch(run, incident, phase="allocated")  # no change at all: never a webhook
        calls = deliveries(run, target)
    return [
        (c["body"]["event_type"], c["body"]["incident_status"], c["body"]["incident_fields"]["phase"]) for c in calls
    ]


def test_no_field_trigger_fires_on_state_or_severity_only(start: Start) -> None:
    assert fired_events(start("")) == [
        ("incident_created", "active", "requested"),
        ("incident_modified", "active", "allocated"),
    ]
    assert fired_events(start(NO_FIELD_TRIGGER)) == [
        ("incident_created", "active", "requested"),
        ("incident_modified", "stable", "allocated"),
        ("incident_modified", "stable", "allocated"),  # the severity change
    ]


# -- 2. fields-as-string, 3. no-header-vars -------------------------------------------------------------------


def first_delivery(run: Running) -> dict[str, Any]:
    """The webhook call gpufarm's payload and headers make for a new incident."""
    with receiving() as (target, url):
        type_id = define_type(run)
        define_webhook(run, type_id, url, renotify_on=["state", "phase"])
        new_incident(run, type_id, 'GPU "urgent"', phase="requested", team="nlp", hosts=["gpu-node-01"])
        (delivered,) = deliveries(run, target)
    return delivered


def test_fields_as_string_sends_the_fields_as_a_json_string(start: Start) -> None:
    plain = first_delivery(start(""))["body"]
    quirked = first_delivery(start(FIELDS_AS_STRING))["body"]
    assert isinstance(plain["incident_fields"], dict)
    assert plain["incident_fields"]["phase"] == "requested" and plain["incident_fields"]["hosts"] == ["gpu-node-01"]
    # Still valid JSON (the receiver decoded it); the value is the object's JSON text.
    assert isinstance(quirked["incident_fields"], str)
    assert json.loads(quirked["incident_fields"]) == plain["incident_fields"]
    assert {k: v for k, v in quirked.items() if k not in ("incident_fields", "date", "incident_uuid")} == {
        k: v for k, v in plain.items() if k not in ("incident_fields", "date", "incident_uuid")
    }


def test_no_header_vars_sends_the_headers_as_written(start: Start) -> None:
    plain = first_delivery(start(""))
    quirked_run = start(NO_HEADER_VARS)
    quirked = first_delivery(quirked_run)
    assert plain["headers"][TOKEN_HEADER] == SECRET and plain["headers"]["X-Gpufarm-Ir"] == "1"
    assert quirked["headers"][TOKEN_HEADER] == f"${SECRET_VARIABLE}"
    assert quirked["headers"]["X-Gpufarm-Ir"] == "$INCIDENT_PUBLIC_ID"
    # The payload and the URL are still rendered.
    assert quirked["path"] == plain["path"] == "/hook"
    assert quirked["body"]["incident_title"] == 'GPU "urgent"' and quirked["body"]["incident_public_id"] == "1"
    logged = quirked_run.sandbox.webhooks.deliveries[-1]
    assert logged["headers"][TOKEN_HEADER] == f"${SECRET_VARIABLE}" and SECRET not in json.dumps(logged)


# -- 4. facets-400, 5. facets-ignored, 7. no-list-wildcard ----------------------------------------------------


def farm(run: Running) -> None:
    """Three leases of gpufarm's type: one allocated on onprem-hpc, one requested on cloud, one ended."""
    type_id = define_type(run)
    new_incident(run, type_id, "hpc", phase="allocated", team="nlp", environment="onprem-hpc", requester="U1")
    new_incident(
        run,
        type_id,
        "cloud",
        phase="requested",
        team="vision",
        environment="cloud",
        gpu_hours_by_month=["2026-12=3.5"],
        accrued_months=["2026-12"],
    )
    ended = new_incident(run, type_id, "ended", phase="reclaimed", team="nlp", environment="cloud")
    patch(run, ended, state="resolved")


CUSTOM_FACETS = (
    "environment:cloud",
    "team:nlp",
    "phase:requested",
    "requester:U1",
    "gpu_hours_by_month:(2026-12=*)",
    "accrued_months:2026-12",
    f'incident_type:"{TYPE_NAME}"',
    "state:(active OR stable) AND team:nlp",
)


def test_facets_400_refuses_custom_field_and_type_facets(start: Start) -> None:
    plain, quirked = start(""), start(FACETS_400)
    for run in (plain, quirked):
        farm(run)
    for query in CUSTOM_FACETS:
        assert search(plain, query)[0] == 200, query
        status, body = search(quirked, query)
        assert status == 400 and isinstance(body["errors"], list) and body["errors"], query
    for query in ("state:(active OR stable)", "severity:UNKNOWN", "-state:resolved", "state:resolved cloud"):
        assert search(quirked, query) == search(plain, query), query
    assert search(quirked, "state:(active OR stable)") == (200, ["cloud", "hpc"])


def test_facets_ignored_matches_everything_on_those_facets(start: Start) -> None:
    plain, quirked = start(""), start(FACETS_IGNORED)
    for run in (plain, quirked):
        farm(run)
    assert search(plain, "team:vision") == (200, ["cloud"])
    assert search(quirked, "team:vision") == (200, ["cloud", "ended", "hpc"])
    assert search(plain, "-environment:cloud") == (200, ["hpc"])
    assert search(quirked, "-environment:cloud") == (200, ["cloud", "ended", "hpc"])
    assert search(plain, f'state:active AND incident_type:"{TYPE_NAME}" AND phase:allocated') == (200, ["hpc"])
    assert search(quirked, f'state:active AND incident_type:"{TYPE_NAME}" AND phase:allocated') == (
        200,
        ["cloud", "hpc"],
    )
    assert search(quirked, "team:nlp OR state:resolved") == (200, ["ended"])
    # state and severity still filter.
    assert search(quirked, "state:resolved") == search(plain, "state:resolved") == (200, ["ended"])
    assert search(quirked, "severity:SEV-1") == search(plain, "severity:SEV-1") == (200, [])


def test_no_list_wildcard_matches_nothing_in_list_fields(start: Start) -> None:
    plain, quirked = start(""), start(NO_LIST_WILDCARD)
    for run in (plain, quirked):
        farm(run)
    assert search(plain, "gpu_hours_by_month:(2026-12=* OR 2026-11=*)") == (200, ["cloud"])
    assert search(quirked, "gpu_hours_by_month:(2026-12=* OR 2026-11=*)") == (200, [])
    assert search(quirked, "state:resolved OR accrued_months:2026*") == (200, ["ended"])
    # Plain values still match list fields, and wildcards still match single-valued fields.
    for query in ('gpu_hours_by_month:"2026-12=3.5"', "accrued_months:2026-12", "phase:req*", "environment:onprem*"):
        assert search(quirked, query) == search(plain, query), query
        assert search(quirked, query)[1], query


# -- 6. tag-source-User ----------------------------------------------------------------------------------------


def tag_sources(run: Running) -> tuple[dict[str, list[str]], list[str]]:
    """Tag a host through the tags API with source `user`: the host list's tags_by_source, and the tags API's read."""
    run.tags.create_host_tags(host_name="gpu-node-01", body=HostTags(tags=["ir:ir-1", "team:nlp"]), source="user")
    listed = run.hosts.list_hosts(filter="gpu-node-01")
    (host,) = listed.host_list
    read = run.tags.get_host_tags(host_name="gpu-node-01", source="user")
    return dict(host.tags_by_source), list(read.tags)


def test_tag_source_user_capitalises_the_host_lists_source(start: Start) -> None:
    assert tag_sources(start("")) == ({"user": ["ir:ir-1", "team:nlp"]}, ["ir:ir-1", "team:nlp"])
    assert tag_sources(start(TAG_SOURCE_USER)) == ({"User": ["ir:ir-1", "team:nlp"]}, ["ir:ir-1", "team:nlp"])


# -- the setting itself ----------------------------------------------------------------------------------------


def test_parse_quirks_all_names_and_refusals() -> None:
    assert parse_quirks("all") == frozenset(QUIRKS) and len(QUIRKS) == 7
    assert parse_quirks("facets-400, tag-source-user,") == {FACETS_400, TAG_SOURCE_USER}
    assert parse_quirks("") == parse_quirks(None) == parse_quirks([]) == frozenset()
    with pytest.raises(ValueError, match="unknown Datadog quirk 'facets-500'") as refused:
        parse_quirks("facets-400,facets-500")
    assert all(name in str(refused.value) for name in QUIRKS)
    with pytest.raises(ValueError, match="unknown Datadog quirk"):
        Sandbox(quirks=["nope"])


def test_state_reports_the_quirks_played(start: Start) -> None:
    run = start(f"{TAG_SOURCE_USER},{FACETS_400}")
    assert http(f"{run.url}/_sandbox/state")[1]["quirks"] == [FACETS_400, TAG_SOURCE_USER]
    assert http(f"{start('').url}/_sandbox/state")[1]["quirks"] == []


@pytest.mark.parametrize("command", [sandbox_command, local_command, demo_command])
def test_commands_refuse_an_unknown_quirk(command: Any) -> None:
    result = CliRunner().invoke(command, ["--datadog-quirks", "facets-ignored,bogus"])
    assert result.exit_code == 2
    assert "unknown Datadog quirk 'bogus'" in result.output and FACETS_400 in result.output
    assert "--datadog-quirks" in CliRunner().invoke(command, ["--help"]).output


def test_demo_reads_its_quirks_from_the_environment() -> None:
    result = CliRunner().invoke(demo_command, [], env={QUIRKS_ENV: "bogus"})
    assert result.exit_code == 2 and "unknown Datadog quirk 'bogus'" in result.output


def test_demo_takes_the_flag_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[frozenset[str]] = []

    def fake_run_demo(*, quirks: frozenset[str]) -> DemoContext:
        asked.append(quirks)
        return DemoContext(sandbox=Sandbox(), base_url="", settings=Settings(), checks=1)

    monkeypatch.setattr(runner, "run_demo", fake_run_demo)
    cli = CliRunner()
    assert cli.invoke(demo_command, [], env={QUIRKS_ENV: "facets-ignored"}).exit_code == 0
    assert cli.invoke(demo_command, ["--datadog-quirks", "all"], env={QUIRKS_ENV: "facets-ignored"}).exit_code == 0
    assert cli.invoke(demo_command, [], env={QUIRKS_ENV: ""}).exit_code == 0
    assert asked == [{FACETS_IGNORED}, frozenset(QUIRKS), frozenset()]
