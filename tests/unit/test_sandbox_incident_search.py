"""The sandbox's incident search language and notification firing, in process (no sockets)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from werkzeug.test import Client

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.incidents_search import (
    All,
    AnyOf,
    Not,
    QueryError,
    Term,
    matches,
    parse_query,
    query_facets,
    without_facets,
    without_list_wildcards,
)

HEADERS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("state:active", Term("state", ("active",))),
        ("state:(active OR stable)", Term("state", ("active", "stable"))),
        ("State:active", Term("state", ("active",))),
        ('title:"GPU request"', Term("title", ("GPU request",))),
        ("a:1 AND b:2", All((Term("a", ("1",)), Term("b", ("2",))))),
        ("a:1 b:2", All((Term("a", ("1",)), Term("b", ("2",))))),
        ("a:1 OR b:2 c:3", AnyOf((Term("a", ("1",)), All((Term("b", ("2",)), Term("c", ("3",))))))),
        ("-a:1", Not(Term("a", ("1",)))),
        ("NOT (a:1 OR b:2)", Not(AnyOf((Term("a", ("1",)), Term("b", ("2",)))))),
        ("gpu", Term(None, ("gpu",))),
        ("hosts:ir:ir-1", Term("hosts", ("ir:ir-1",))),
    ],
)
def test_parse(text: str, tree: Any) -> None:
    assert parse_query(text) == tree


@pytest.mark.parametrize(
    "text", ["", "   ", "state:", "state:(active", "(a:1", "a:1)", "AND a:1", "a:(1 AND 2)", 'a:"open', "a:(OR)"]
)
def test_parse_errors(text: str) -> None:
    with pytest.raises(QueryError):
        parse_query(text)


def reader(values: Mapping[str | None, list[str]]) -> Any:
    return lambda facet: values.get(facet, [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("state:(active OR stable)", True),
        ("state:resolved", False),
        ("team:NLP", True),  # values compare without case
        ("hosts:gpu-node-0*", True),
        ("hosts:gpu-node-1*", False),
        ("-team:nlp", False),
        ("team:nlp AND -state:resolved", True),
        ("phase:allocated", False),  # an unset field matches nothing
        ("-phase:allocated", True),
        ("request", True),  # free text searches the title
        ("REQ*LLM", True),
        ("vision", False),
    ],
)
def test_matches(text: str, expected: bool) -> None:
    incident = reader(
        {
            None: ["GPU request llm-ko"],
            "state": ["active"],
            "team": ["nlp"],
            "hosts": ["gpu-node-01", "gpu-node-02"],
        }
    )
    assert matches(parse_query(text), incident) is expected


def test_query_facets() -> None:
    assert query_facets(parse_query("state:active (team:a OR -phase:b) words")) == {"state", "team", "phase"}


@pytest.mark.parametrize(
    ("text", "left"),
    [
        ("state:active AND team:nlp", "state:active"),
        ("state:active -team:nlp", "state:active"),  # a negated term goes with its negation
        ("team:nlp OR state:resolved", "state:resolved"),
        ("NOT (team:a OR phase:b) state:active words", "state:active words"),
        ("(team:a OR phase:b) OR state:active", "state:active"),
        ("state:active (team:a OR -severity:SEV-1)", "state:active -severity:SEV-1"),
    ],
)
def test_without_facets_drops_terms_as_if_absent(text: str, left: str) -> None:
    assert without_facets(parse_query(text), lambda facet: facet in ("team", "phase")) == parse_query(left)


def test_without_facets_leaves_a_query_matching_everything() -> None:
    emptied = without_facets(parse_query("team:nlp -phase:allocated"), lambda facet: True)
    assert emptied == All(())
    assert matches(emptied, reader({})) is True


def test_without_list_wildcards_keeps_plain_values_and_other_fields() -> None:
    query = parse_query("months:(2026-12=* OR 2026-11=4) phase:req* -hosts:gpu-*")
    quirked = without_list_wildcards(query, lambda facet: facet in ("months", "hosts"))
    assert quirked == All((Term("months", ("2026-11=4",)), Term("phase", ("req*",)), Not(Term("hosts", ()))))
    incident = reader({"months": ["2026-12=3"], "phase": ["requested"], "hosts": ["gpu-1"]})
    assert matches(query, incident) is False  # -hosts:gpu-* excludes it
    assert matches(quirked, incident) is False  # months:2026-12=* now matches nothing
    assert matches(quirked, reader({"months": ["2026-11=4"], "phase": ["requested"], "hosts": ["gpu-1"]})) is True


# -- in process: notification firing ---------------------------------------------------------------------------


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> tuple[Sandbox, Client, list[dict[str, Any]]]:
    """A sandbox served in process, its webhooks' fire() replaced by a recorder that checks the lock is free."""
    sandbox = Sandbox()
    fired: list[dict[str, Any]] = []

    def record(name: str, variables: Mapping[str, str], *, origin: str) -> None:
        free: list[bool] = []
        probe = threading.Thread(target=lambda: free.append(sandbox.lock.acquire(timeout=1) and _release(sandbox)))
        probe.start()
        probe.join()
        fired.append({"name": name, "variables": dict(variables), "origin": origin, "lock_free": free == [True]})

    monkeypatch.setattr(sandbox.webhooks, "fire", record)
    return sandbox, Client(sandbox), fired


def _release(sandbox: Sandbox) -> bool:
    sandbox.lock.release()
    return True


def rule(client: Client, trigger: str, **extra: Any) -> None:
    body = {
        "data": {
            "type": "incident_notification_rules",
            "attributes": {
                "conditions": [{"field": "severity", "values": ["SEV-1", "SEV-2"]}],
                "handles": ["@webhook-ops", "@webhook-ops", "@slack-ops"],
                "trigger": trigger,
                "enabled": True,
                **extra,
            },
        }
    }
    assert client.post("/api/v2/incidents/config/notification-rules", json=body, headers=HEADERS).status_code == 201


def create(client: Client, severity: str) -> dict[str, Any]:
    body = {
        "data": {
            "type": "incidents",
            "attributes": {
                "title": "disk full",
                "customer_impacted": False,
                "fields": {"severity": {"type": "dropdown", "value": severity}},
            },
        }
    }
    answer = client.post("/api/v2/incidents", json=body, headers=HEADERS)
    assert answer.status_code == 201
    return dict(answer.json["data"])  # type: ignore[index]


def test_rules_fire_once_per_webhook_outside_the_lock(app: tuple[Sandbox, Client, list[dict[str, Any]]]) -> None:
    sandbox, client, fired = app
    rule(client, "incident_created_trigger")
    create(client, "SEV-3")  # conditions do not match
    incident = create(client, "SEV-1")
    assert [(f["name"], f["origin"], f["lock_free"]) for f in fired] == [("ops", "incident", True)]
    variables = fired[0]["variables"]
    assert variables["INCIDENT_UUID"] == incident["id"]
    assert variables["INCIDENT_PUBLIC_ID"] == "2"
    assert variables["INCIDENT_SEVERITY"] == "SEV-1"
    assert variables["INCIDENT_STATUS"] == "active"
    assert variables["INCIDENT_URL"].endswith("/incidents/2")
    assert variables["EVENT_TYPE"] == "incident_created"
    handles = [n["handle"] for n in sandbox.dump()["incidents"]["notifications"]]
    assert handles == ["@webhook-ops", "@webhook-ops", "@slack-ops"]


def test_modified_rules_without_renotify_fire_on_any_change(app: tuple[Sandbox, Client, list[dict[str, Any]]]) -> None:
    _, client, fired = app
    rule(client, "incident_modified_trigger")
    incident = create(client, "SEV-2")
    path = f"/api/v2/incidents/{incident['id']}"
    body = {"data": {"id": incident["id"], "type": "incidents", "attributes": {"title": "disk still full"}}}
    assert client.patch(path, json=body, headers=HEADERS).status_code == 200
    assert client.patch(path, json=body, headers=HEADERS).status_code == 200  # same title again: no change
    assert [f["variables"]["INCIDENT_TITLE"] for f in fired] == ["disk still full"]
