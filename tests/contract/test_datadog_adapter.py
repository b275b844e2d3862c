"""The Datadog adapters against the sandbox through the real datadog-api-client: the runtime gateway (incidents of
gpufarm's type, hosts, tags, metrics; idempotent create under injected faults; errors mapped with no secrets) and
the setup-time admin adapter (incident types, webhooks, monitors, dashboards)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers import VALID_VALUES, define_gpufarm_type

from gpufarm.adapters import datadog as dd
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract


def _post(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def _faults(sandbox_url: str, **spec: Any) -> None:
    _post(f"{sandbox_url}/_sandbox/faults", spec)


def _injected(sandbox_url: str) -> int:
    with urllib.request.urlopen(f"{sandbox_url}/_sandbox/faults", timeout=10) as response:
        return int(json.loads(response.read())["injected"])


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    """A gateway whose own create retries back off for milliseconds, not seconds."""
    gw = DatadogGateway(settings, create_backoff_s=0.05)
    yield gw
    gw.close()


@pytest.fixture
def admin(settings: Settings) -> Iterator[DatadogAdmin]:
    """The setup-time adapter."""
    adm = DatadogAdmin(settings)
    yield adm
    adm.close()


@pytest.fixture
def fields_defined(admin: DatadogAdmin, settings: Settings) -> str:
    """gpufarm's incident type with its fields (the sandbox refuses unknown fields, as Datadog does); its id."""
    return define_gpufarm_type(admin, settings.incident_type, VALID_VALUES)


def _request_fields(request_id: str | None = "req-0001", **overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        f.STATE: "active",
        f.PHASE: "requested",
        f.TEAM: "nlp",
        f.PROJECT: "llm-ko",
        f.GPU_MODEL: "H100",
        f.GPU_COUNT: "8",
        f.ENVIRONMENT: "onprem-hpc",
        f.REQUESTER: "U0000000001",
        f.REQUEST_ID: request_id,
    }
    values.update(overrides)
    return values


def _incident_count(sandbox: Sandbox) -> int:
    state = sandbox.incidents.dump()
    incidents = state.get("incidents", state)
    return len(incidents)


# -- incidents ---------------------------------------------------------------------------------------------------


def test_create_get_update_and_find_by_number(gateway: DatadogGateway, fields_defined: str) -> None:
    created = gateway.create(
        "GPU request: nlp/llm-ko 8xH100 (onprem-hpc)",
        _request_fields(),
        notification_handles=["@webhook-gpufarm-incidents"],
        initial_note="Requested from Slack by <@U0000000001>",
    )
    assert created.public_id >= 1
    assert created.state == "active"
    assert created.fields[f.GPU_MODEL] == "H100"
    assert created.fields["slug"] == f"IR-{created.public_id}"

    fetched = gateway.get(created.id)
    assert fetched.id == created.id
    assert fetched.fields[f.REQUEST_ID] == "req-0001"

    updated = gateway.update(
        created.id, {f.STATE: "stable", f.PHASE: "allocated", f.HOSTS: ["gpu-node-01", "gpu-node-02"]}
    )
    assert updated.state == "stable"
    assert updated.fields[f.HOSTS] == ["gpu-node-01", "gpu-node-02"]
    assert updated.fields[f.TEAM] == "nlp"  # untouched fields stay

    assert gateway.get_by_ir(created.public_id).id == created.id
    gateway.update(created.id, {f.STATE: "resolved", f.PHASE: "reclaimed", f.RECLAIM_REASON: "released"})
    resolved = gateway.get_by_ir(created.public_id)
    assert resolved.state == "resolved"
    assert resolved.resolved is not None
    with pytest.raises(NotFound, match="IR-999"):
        gateway.get_by_ir(999)


def test_search_walks_every_page(settings: Settings, fields_defined: str) -> None:
    gw = DatadogGateway(settings, search_page_size=10)
    created = [gw.create(f"GPU request {i:02d}", _request_fields(None)).id for i in range(25)]
    ids = set(created)
    # Resolve the oldest, so the newest live incident is still the last one created.
    gw.update(created[0], {f.STATE: "resolved"})
    found = [r.id for r in gw.search(IncidentQuery.where({State.ACTIVE, State.RESOLVED}))]
    assert sorted(found) == sorted(ids)  # three pages (10, 10, 5), nothing twice
    assert len({r.id for r in gw.search(IncidentQuery.where({State.ACTIVE}))}) == 24
    newest = next(gw.search(IncidentQuery.where({State.ACTIVE}), newest_first=True))
    assert newest.title == "GPU request 24"
    gw.close()


def test_create_with_a_known_request_id_returns_the_first_incident(
    gateway: DatadogGateway, fields_defined: str, sandbox: Sandbox
) -> None:
    first = gateway.create("GPU request", _request_fields("req-dup-1"))
    second = gateway.create("GPU request", _request_fields("req-dup-1"))
    assert second.id == first.id
    assert gateway.find_by_request_id("req-dup-1") == first
    assert gateway.find_by_request_id("req-unknown") is None
    assert _incident_count(sandbox) == 1


def test_create_survives_5xx_on_the_create_path_with_exactly_one_incident(
    dd_env: str, fields_defined: str, sandbox: Sandbox, sandbox_url: str
) -> None:
    # Default settings: three retries of our own, each after re-checking the request_id.
    gw = DatadogGateway(Settings(), create_backoff_s=0.05)
    _faults(sandbox_url, rate=1.0, statuses=[503], paths="^/api/v2/incidents$", max_faults=2)
    record = gw.create("GPU request", _request_fields("req-fault-1"))
    gw.close()
    assert _injected(sandbox_url) == 2
    assert _incident_count(sandbox) == 1
    assert record.fields[f.REQUEST_ID] == "req-fault-1"


@pytest.mark.parametrize("attempts", [1, 3])
def test_create_whose_answer_is_lost_after_datadog_created_it_is_not_repeated(
    attempts: int, settings: Settings, fields_defined: str, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case the client's own POST retry gets wrong: the server created it, then the answer failed.
    With a single attempt the re-check after the failure still finds it."""
    from datadog_api_client.exceptions import ServiceException

    gw = DatadogGateway(settings, create_attempts=attempts, create_backoff_s=0.01)
    api = gw._incidents_no_retry
    real_create = api.create_incident
    calls = []

    def create_then_fail(**kwargs: Any) -> Any:
        calls.append(kwargs)
        real_create(**kwargs)
        raise ServiceException(status=502, reason="Bad Gateway")

    monkeypatch.setattr(api, "create_incident", create_then_fail)
    record = gw.create("GPU request", _request_fields("req-lost-1"))
    gw.close()
    assert len(calls) == 1
    assert _incident_count(sandbox) == 1
    assert record.fields[f.REQUEST_ID] == "req-lost-1"


def test_create_that_times_out_while_datadog_creates_it_is_not_repeated(
    dd_env: str, fields_defined: str, sandbox: Sandbox, sandbox_url: str
) -> None:
    gw = DatadogGateway(Settings(max_retries=1, http_timeout=0.2), create_backoff_s=0.6)
    try:
        # Every create waits 0.5 s before the sandbox handles it: the client gives up at 0.2 s, the
        # incident appears at 0.5 s, and the re-check at ~0.8 s finds it.
        _faults(sandbox_url, rate=0.0, paths="^/api/v2/incidents$", latency_ms=500)
        record = gw.create("GPU request", _request_fields("req-slow-1"))
    finally:
        gw.close()
    assert _incident_count(sandbox) == 1
    assert record.fields[f.REQUEST_ID] == "req-slow-1"


def test_create_without_request_id_is_not_retried_after_a_5xx(
    gateway: DatadogGateway, fields_defined: str, sandbox_url: str
) -> None:
    _faults(sandbox_url, rate=1.0, statuses=[503], paths="^/api/v2/incidents$", max_faults=1)
    with pytest.raises(UpstreamError, match="503"):
        gateway.create("GPU request", _request_fields(None))
    assert _injected(sandbox_url) == 1


def test_create_retries_a_429_without_request_id(
    gateway: DatadogGateway, fields_defined: str, sandbox: Sandbox, sandbox_url: str
) -> None:
    """A 429 means Datadog refused before acting, so sending it again cannot duplicate."""
    _faults(sandbox_url, rate=1.0, statuses=[429], paths="^/api/v2/incidents$", max_faults=1)
    gateway.create("GPU request", _request_fields(None))
    assert _incident_count(sandbox) == 1


def test_reads_give_up_after_bounded_retries(gateway: DatadogGateway, sandbox_url: str) -> None:
    _faults(sandbox_url, rate=1.0, statuses=[500], paths="^/api/v2/incidents/")
    started = time.monotonic()
    with pytest.raises(UpstreamError, match="Datadog get incident failed"):
        gateway.get("00000000-0000-0000-0000-000000000001")
    assert _injected(sandbox_url) == 2  # one try + settings.max_retries (1)
    assert time.monotonic() - started < 3


def test_errors_are_domain_errors(gateway: DatadogGateway, fields_defined: str) -> None:
    with pytest.raises(NotFound):
        gateway.get("00000000-0000-0000-0000-000000000001")
    with pytest.raises(ValidationFailed) as unknown:
        gateway.create("GPU request", {"no_such_field": "x"})
    assert unknown.value.field == "no_such_field"
    with pytest.raises(ValidationFailed, match="title"):
        gateway.create("   ", _request_fields())
    # A dropdown value the field does not offer: Datadog's own 400, its message kept.
    with pytest.raises(ValidationFailed, match="Datadog create incident failed: HTTP 400"):
        gateway.create("GPU request", _request_fields("req-bad-model", gpu_model="Z9000"))


def test_wrong_keys_never_show_in_errors(sandbox_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_DATADOG_HOST", sandbox_url)
    monkeypatch.setenv("DD_API_KEY", "wrong-api-key-value")
    monkeypatch.setenv("DD_APP_KEY", "wrong-app-key-value")
    gw = DatadogGateway(Settings(max_retries=0))
    with pytest.raises(UpstreamError) as denied:
        gw.get_tags("gpu-node-01")
    text = str(denied.value)
    assert "403" in text
    assert "keys" in text
    assert "wrong-api-key-value" not in text
    assert "wrong-app-key-value" not in text


def test_missing_api_key_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DD_API_KEY", "GPUFARM_DATADOG_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationFailed, match="DD_API_KEY"):
        DatadogGateway(Settings())


def test_unstable_operation_warnings_are_silenced(gateway: DatadogGateway, settings: Settings) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gw = DatadogGateway(settings)
        with pytest.raises(NotFound):
            gw.get("00000000-0000-0000-0000-000000000002")
        with pytest.raises(NotFound):
            gw.get("00000000-0000-0000-0000-000000000003")
        gw.close()
    assert not [w for w in caught if "unstable" in str(w.message).lower()]


def test_using_the_gateway_never_imports_the_aggregate_models(dd_env: str) -> None:
    """The aggregate `datadog_api_client.v2.models` costs ~1.3 s and 93 MB: every call path avoids it."""
    code = """
import sys
from datetime import UTC, datetime, timedelta
from gpufarm.config import SecretStr
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.setup.apply import apply_setup
from gpufarm.setup.plan import SetupSpec
from gpufarm.adapters.datadog_admin import DatadogAdmin
gw = DatadogGateway(Settings(max_retries=0))
adm = DatadogAdmin(Settings(max_retries=0))
values = {"team": ["nlp"], "gpu_model": ["H100"], "environment": ["hpc"]}
apply_setup(adm, SetupSpec("http://127.0.0.1:9/a", "http://127.0.0.1:9/b", values, has_secret=True),
            secret=SecretStr("s"))
rec = gw.create("t", {"state": "active", "team": "nlp", "request_id": "req-imports"})
gw.update(rec.id, {"phase": "approved"}); gw.get_by_ir(rec.public_id); gw.find_by_request_id("none")
now = datetime.now(UTC)
list(gw.list_hosts()); gw.add_tags("h1", ["a:b"]); gw.get_tags("h1"); gw.replace_tags("h1", [])
gw.submit([MetricSeries("gpufarm.gpu.utilization", (MetricPoint(int(now.timestamp()), 1.0),), host="h1")])
gw.scalar("avg:gpufarm.gpu.utilization{*} by {host}", now - timedelta(minutes=5), now)
adm.list_monitors(); adm.list_dashboards()
print("datadog_api_client.v2.models" in sys.modules, "datadog_api_client.v1.models" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]


# -- hosts and tags -----------------------------------------------------------------------------------------------


def test_list_hosts_pages_through_more_than_a_thousand(gateway: DatadogGateway, sandbox_url: str) -> None:
    hosts = [
        {"name": f"gpu-node-{i:04d}", "tags": {"user": ["gpufarm:managed", f"cluster:c{i % 3}"]}} for i in range(1500)
    ]
    _post(f"{sandbox_url}/_sandbox/hosts", {"hosts": hosts})
    listed = list(gateway.list_hosts())
    assert len(listed) == 1500
    assert len({h.name for h in listed}) == 1500
    one = next(h for h in listed if h.name == "gpu-node-0004")
    assert "cluster:c1" in one.tags
    assert one.tags_by_source["user"] == ("gpufarm:managed", "cluster:c1")
    assert one.last_reported is not None
    assert {h.name for h in gateway.list_hosts("cluster:c2")} == {f"gpu-node-{i:04d}" for i in range(2, 1500, 3)}


def test_tags_append_replace_and_clear(gateway: DatadogGateway, sandbox_url: str) -> None:
    _post(f"{sandbox_url}/_sandbox/hosts", {"hosts": [{"name": "gpu-node-01", "tags": {"user": ["gpufarm:managed"]}}]})
    assert gateway.get_tags("gpu-node-01") == ["gpufarm:managed"]
    gateway.add_tags("gpu-node-01", ["ir:ir-7", "project:llm-ko"])
    assert gateway.get_tags("gpu-node-01") == ["gpufarm:managed", "ir:ir-7", "project:llm-ko"]
    gateway.replace_tags("gpu-node-01", ["gpufarm:managed"])
    assert gateway.get_tags("gpu-node-01") == ["gpufarm:managed"]
    assert gateway.replace_tags("gpu-node-01", []) == []
    assert gateway.get_tags("gpu-node-01") == []
    assert gateway.get_tags("never-seen-host") == []
    with pytest.raises(ValidationFailed):
        gateway.add_tags("bad host/name", ["a:b"])


# -- metrics ----------------------------------------------------------------------------------------------------------


def test_submit_then_query_by_ir(gateway: DatadogGateway, sandbox_url: str) -> None:
    _post(
        f"{sandbox_url}/_sandbox/hosts",
        {
            "hosts": [
                {"name": "gpu-a", "tags": {"user": ["ir:ir-1"]}},
                {"name": "gpu-b", "tags": {"user": ["ir:ir-1"]}},
                {"name": "gpu-c", "tags": {"user": ["ir:ir-2"]}},
            ]
        },
    )
    now = int(time.time())
    values = {"gpu-a": 80.0, "gpu-b": 60.0, "gpu-c": 3.0}
    gateway.submit(
        [
            MetricSeries(
                "gpufarm.gpu.utilization",
                tuple(MetricPoint(now - 60 * k, v) for k in range(5)),
                tags=("gpu:0",),
                host=host,
                unit="percent",
            )
            for host, v in values.items()
        ]
    )
    start = datetime.fromtimestamp(now - 600, UTC)
    results = gateway.scalar("avg:gpufarm.gpu.utilization{*} by {ir}", start, start + timedelta(minutes=11))
    by_group = {r.group_tags: r.value for r in results}
    assert by_group == {("ir:ir-1",): pytest.approx(70.0), ("ir:ir-2",): pytest.approx(3.0)}
    with pytest.raises(ValidationFailed, match="end"):
        gateway.scalar("avg:x{*}", start, start)


def test_large_submissions_are_split_under_the_payload_limit(
    gateway: DatadogGateway, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lower limit makes a modest submission need several payloads without building megabytes.
    monkeypatch.setattr(dd, "MAX_COMPRESSED_BYTES", 4_000)
    monkeypatch.setattr(dd, "MAX_RAW_BATCH_BYTES", 60_000)
    sizes: list[int] = []
    real = gateway._metrics_plain.submit_metrics

    def counting(**kwargs: Any) -> Any:
        sizes.append(dd._compressed_size(kwargs["body"]["series"]))
        return real(**kwargs)

    monkeypatch.setattr(gateway._metrics_plain, "submit_metrics", counting)
    now = int(time.time())
    series = [
        MetricSeries(
            "gpufarm.gpu.utilization",
            tuple(MetricPoint(now - k, float((h * 7919 + k) % 101)) for k in range(60)),
            host=f"gpu-{h:03d}",
            tags=(f"gpu:{h % 8}",),
        )
        for h in range(40)
    ]
    gateway.submit(series)
    assert len(sizes) > 1
    assert max(sizes) < 4_000
    start = datetime.fromtimestamp(now - 120, UTC)
    counts = gateway.scalar("count:gpufarm.gpu.utilization{*}", start, start + timedelta(minutes=3), aggregator="sum")
    assert sum(r.value or 0 for r in counts) == pytest.approx(40 * 60)


def test_submit_rejects_bad_series_before_sending(gateway: DatadogGateway) -> None:
    now = int(time.time())
    with pytest.raises(ValidationFailed, match="type"):
        gateway.submit([MetricSeries("gpufarm.x", (MetricPoint(now, 1.0),), type=7)])
    with pytest.raises(ValidationFailed, match="non-finite"):
        gateway.submit([MetricSeries("gpufarm.x", (MetricPoint(now, float("nan")),))])
    with pytest.raises(ValidationFailed, match="no points"):
        gateway.submit([MetricSeries("gpufarm.x", ())])


# -- webhooks and custom variables -------------------------------------------------------------------------------------


def test_webhook_and_secret_variable_round_trip(admin: DatadogAdmin) -> None:
    assert admin.get_webhook("gpufarm-incidents") is None
    spec = {
        "name": "gpufarm-incidents",
        "url": "http://127.0.0.1:9/fn/incident_webhook/",
        "payload": '{"id": "$INCIDENT_UUID"}',
        "custom_headers": '{"X-Gpufarm-Token": "$GPUFARM_WEBHOOK_SECRET"}',
        "encode_as": "json",
    }
    created = admin.create_webhook(spec)
    assert created["url"] == spec["url"]
    updated = admin.update_webhook("gpufarm-incidents", {"url": "http://127.0.0.1:9/other/"})
    assert updated["url"] == "http://127.0.0.1:9/other/"
    assert admin.get_webhook("gpufarm-incidents")["payload"] == spec["payload"]  # type: ignore[index]

    made = admin.create_custom_variable("GPUFARM_WEBHOOK_SECRET", "s3cret-value", is_secret=True)
    assert made == {"name": "GPUFARM_WEBHOOK_SECRET", "is_secret": True}
    read = admin.get_custom_variable("GPUFARM_WEBHOOK_SECRET")
    assert read is not None
    assert "s3cret-value" not in json.dumps(read)
    admin.update_custom_variable("GPUFARM_WEBHOOK_SECRET", "rotated-value", is_secret=True)
    assert admin.get_custom_variable("MISSING_VARIABLE") is None


# -- monitors and dashboards -------------------------------------------------------------------------------------------

IDLE_MONITOR = {
    "name": "[gpufarm] idle GPU allocation {{ir.name}}",
    "type": "query alert",
    "query": "avg(last_1h):avg:gpufarm.gpu.utilization{gpufarm:managed} by {ir} < 5",
    "message": "{{#is_alert}}{{ir.name}} idle @webhook-gpufarm-idle{{/is_alert}}",
    "tags": ["service:gpufarm"],
    "options": {"thresholds": {"critical": 5.0, "warning": 10.0}, "notify_no_data": False, "notify_by": ["ir"]},
}


def test_monitor_validate_create_update_and_list(admin: DatadogAdmin) -> None:
    admin.validate_monitor(IDLE_MONITOR)
    wrong = {**IDLE_MONITOR, "options": {"thresholds": {"critical": 5.0, "warning": 1.0}}}
    with pytest.raises(ValidationFailed, match="Datadog validate monitor failed: HTTP 400"):
        admin.validate_monitor(wrong)

    created = admin.create_monitor(IDLE_MONITOR)
    assert isinstance(created["id"], int)
    assert created["query"] == IDLE_MONITOR["query"]
    updated = admin.update_monitor(created["id"], {"message": "{{ir.name}} idle @webhook-gpufarm-idle"})
    assert updated["message"] == "{{ir.name}} idle @webhook-gpufarm-idle"
    assert [m["id"] for m in admin.list_monitors(name="idle GPU")] == [created["id"]]
    assert admin.list_monitors(name="no such monitor") == []


def test_dashboard_create_update_and_list(admin: DatadogAdmin) -> None:
    board = {
        "title": "gpufarm: GPUs per IR",
        "layout_type": "ordered",
        "widgets": [
            {
                "definition": {
                    "type": "timeseries",
                    "requests": [{"q": "avg:gpufarm.gpu.utilization{$project} by {ir}", "display_type": "line"}],
                }
            }
        ],
        "template_variables": [{"name": "project", "prefix": "project"}],
    }
    created = admin.create_dashboard(board)
    assert created["title"] == board["title"]
    updated = admin.update_dashboard(created["id"], {**board, "title": "gpufarm: GPU usage per IR"})
    assert updated["title"] == "gpufarm: GPU usage per IR"
    assert [d["id"] for d in admin.list_dashboards()] == [created["id"]]
    with pytest.raises(ValidationFailed):
        admin.create_dashboard({"title": "no layout"})


# -- gpufarm's incident type ----------------------------------------------------------------------------------------


def test_the_incident_type_is_looked_up_once_per_gateway(
    settings: Settings, fields_defined: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Slack worker's path pays one type lookup per container, none per request; an explicit id pays none."""
    gw = DatadogGateway(settings, create_backoff_s=0.05)
    lookups: list[object] = []
    real = gw._incidents.list_incident_types
    monkeypatch.setattr(gw._incidents, "list_incident_types", lambda **kw: lookups.append(kw) or real(**kw))
    for n in range(3):
        record = gw.create("GPU request", _request_fields(f"req-once-{n}"))
        gw.update(record.id, {f.PHASE: "approved"})
        gw.get_by_ir(record.public_id)
    assert gw.incident_type_id == fields_defined
    assert len(lookups) == 1
    gw.close()

    pinned = DatadogGateway(settings.replace(incident_type_id=fields_defined))
    monkeypatch.setattr(pinned._incidents, "list_incident_types", lambda **kw: lookups.append(kw) or real(**kw))
    assert pinned.find_by_request_id("req-once-0") is not None
    assert len(lookups) == 1
    pinned.close()
