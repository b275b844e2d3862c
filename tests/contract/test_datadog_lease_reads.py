"""The light lease reads (gpufarm.adapters.datadog_reads) against the incident store they stand beside.

On the sandbox: every lease reads as the store's record decoded by the lifecycle reads it, whatever the query; a
5xx is retried and a 429 waited out by the same policy as the store's, a reset beyond the bound fails fast with the
same error. On a stub answering malformed pages: an incident without an id, attributes or a whole IR number is
skipped and said once, another type's incident is never read, and an answer that is not a search page fails the read.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from datadog_api_client import rest
from fakes import FARM_YAML
from helpers import http

from gpufarm.adapters import datadog_http as dh
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_reads import DatadogLeaseReads
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import LIVE_QUERY, IncidentQuery, live_query

pytestmark = pytest.mark.contract


def _lease(gateway: DatadogGateway, n: int, state: State, **extra: object) -> None:
    fields: dict[str, object] = {
        f.STATE: state.value,
        f.PHASE: "allocated" if state is not State.RESOLVED else "reclaimed",
        f.TEAM: "nlp" if n % 2 else "vision",
        f.PROJECT: f"p{n}",
        f.ENVIRONMENT: "onprem-hpc",
        f.GPU_COUNT: "8",
        f.HOSTS: [f"node-{n}"],
        f.HOST_GPUS: [f"node-{n}=8"],
        f.ALLOCATED_AT: "2026-12-01T00:00:00Z",
        f.GPU_HOURS_HELD: "16.000",
        f.GPU_HOURS_BUSY: "4.5",
        f.GPU_HOURS_BY_MONTH: ["2026-12=16.000"],
        f.GPU_HOURS_MONTHS: ["2026-12"],
        f.HISTORY: [f"2026-12-01T00:00:00Z U0000000001 requested: 8xH100 in hpc ({n})"],
        **extra,
    }
    gateway.create(f"GPU request {n}", fields)


@pytest.fixture
def seeded(settings: Settings, type_id: str) -> Iterator[DatadogGateway]:
    """A store over the sandbox holding 7 leases (live and ended), one with malformed numbers and times."""
    gateway = DatadogGateway(settings, incident_type_id=type_id, search_page_size=3)
    for n in range(6):
        _lease(gateway, n, (State.ACTIVE, State.STABLE, State.RESOLVED)[n % 3])
    _lease(
        gateway,
        6,
        State.STABLE,
        gpu_hours_held="inf",
        allocated_at="yesterday",
        reclaim_reason="idle",
        gpu_hours_idle="-3",
    )
    yield gateway
    gateway.close()


def _reads(settings: Settings, **options: Any) -> DatadogLeaseReads:
    return DatadogLeaseReads(settings, search_page_size=3, **options)


QUERIES = {
    "live": LIVE_QUERY,
    "team": live_query(team="nlp"),
    "ended in december": IncidentQuery.where({State.RESOLVED}, months=["2026-12"]),
    "any": IncidentQuery(),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_each_lease_reads_as_the_store_decodes_it(seeded: DatadogGateway, settings: Settings, name: str) -> None:
    reads = _reads(settings)
    try:
        light = list(reads.lease_facts(QUERIES[name]))
    finally:
        reads.close()
    expected = [LeaseFacts.of(Allocation.from_record(r)) for r in seeded.search(QUERIES[name])]
    assert light == expected and light
    assert reads.skipped == 0


def test_the_type_is_looked_up_by_name_once(seeded: DatadogGateway, settings: Settings, type_id: str) -> None:
    reads = _reads(settings)
    assert reads.incident_type_id == type_id
    assert len(list(reads.lease_facts(LIVE_QUERY))) == 5
    reads.close()


def test_the_client_libraries_retry_statuses_are_the_policys() -> None:
    assert frozenset(rest.RETRY_AFTER_STATUS_CODES) == dh.RETRY_AFTER_STATUS_CODES


def test_a_5xx_is_retried_and_a_429_waited_out(seeded: DatadogGateway, settings: Settings, sandbox_url: str) -> None:
    http(
        f"{sandbox_url}/_sandbox/faults",
        "POST",
        {"rate": 1.0, "statuses": [503], "paths": "^/api/v2/incidents/search", "max_faults": 1},
    )
    reads = _reads(settings)
    assert len(list(reads.lease_facts(QUERIES["any"]))) == 7
    assert http(f"{sandbox_url}/_sandbox/faults")[1]["injected"] == 1
    # Seven pages of one under a budget of two a second need four windows: the reads wait for them, never fail.
    http(f"{sandbox_url}/_sandbox/ratelimits", "POST", {"groups": {"incidents": {"limit": 2, "period": 1}}})
    paced = DatadogLeaseReads(settings, search_page_size=1)
    started = time.monotonic()
    assert len(list(paced.lease_facts(QUERIES["any"]))) == 7
    assert time.monotonic() - started >= 1.0 and paced.rate_limits.waited_s > 0
    paced.close()
    reads.close()


def test_a_reset_beyond_the_bound_fails_fast(seeded: DatadogGateway, settings: Settings, sandbox_url: str) -> None:
    http(f"{sandbox_url}/_sandbox/ratelimits", "POST", {"groups": {"incidents": {"limit": 1, "period": 86_400}}})
    reads = _reads(settings)
    started = time.monotonic()
    with pytest.raises(UpstreamError) as limited:
        list(reads.lease_facts(LIVE_QUERY))
    assert time.monotonic() - started < 1.0
    assert "HTTP 429" in str(limited.value) and "rate limit incidents" in str(limited.value)
    reads.close()


# -- the report's read path stays light -------------------------------------------------------------------------

# What `gpufarm report` must never import (issue 27: each costs the report CPU and memory a plain reader does not
# spend): the client library and what it drags in, the command models, the lease context, the lifecycle's reads,
# governance, the client-backed incident store.
HEAVY = (
    "datadog_api_client",
    "dateutil",
    "multiprocessing",
    "boto3",
    "botocore",
    "gpufarm.adapters.datadog_client",
    "gpufarm.adapters.datadog_incidents",
    "gpufarm.adapters.datadog",
    "gpufarm.core.kernel.serial",
    "gpufarm.core.context",
    "gpufarm.core.governance",
    "gpufarm.core.commands",
    "gpufarm.core.accounting.gpu_hours",
    "gpufarm.core.accounting.budgets",
)
_RUN_AND_LIST = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["gpufarm", "report", "--since", "30d", "--by", sys.argv[1]]
from gpufarm.cli import main
main()
"""


@pytest.mark.parametrize("by", ["team", "ir"])
def test_gpufarm_report_imports_neither_the_client_library_nor_the_command_models(
    seeded: DatadogGateway, dd_env: str, tmp_path: Any, by: str
) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(FARM_YAML)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env |= {k: os.environ[k] for k in ("GPUFARM_DATADOG_HOST", "DD_API_KEY", "DD_APP_KEY")}
    env["GPUFARM_FARM_CONFIG"] = str(farm)
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST, by], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "IR-" in done.stdout or by == "team"
    modules = json.loads(done.stderr.rsplit("MODULES ", 1)[1])
    assert [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)] == []
    assert "gpufarm.adapters.datadog_reads" in modules


# -- malformed answers -------------------------------------------------------------------------------------------

TYPE_ID = "00000000-0000-4000-8000-0000000000aa"


def _incident(ir: object, *, type_id: str = TYPE_ID, **fields: object) -> dict[str, Any]:
    values = {f.STATE: "active", f.TEAM: "nlp", **fields}
    return {
        "data": {
            "id": f"id-{ir}",
            "type": "incidents",
            "attributes": {
                "public_id": ir,
                "state": "active",
                "incident_type_uuid": type_id,
                "fields": {k: {"type": "textbox", "value": v} for k, v in values.items()},
            },
        }
    }


class _Stub(BaseHTTPRequestHandler):
    """Datadog's type list and one search page holding every kind of malformed incident, or a broken page."""

    page: Any = None

    def do_GET(self) -> None:
        if self.path.startswith("/api/v2/incidents/config/types"):
            body: Any = {"data": [{"id": TYPE_ID, "type": "incident_types", "attributes": {"name": "GPU allocation"}}]}
        else:
            body = self.page
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Stub]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("GPUFARM_DATADOG_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("DD_API_KEY", "stub-api-key-0000")
    monkeypatch.setenv("DD_APP_KEY", "stub-app-key-0000")
    yield _Stub
    server.shutdown()
    server.server_close()


def test_malformed_incidents_are_skipped_and_said_once(stub: type[_Stub], caplog: pytest.LogCaptureFixture) -> None:
    stub.page = {
        "data": {
            "attributes": {
                "incidents": [
                    "not an object",
                    {"data": {"type": "incidents"}},
                    {"data": {"id": "no-attributes"}},
                    _incident("12"),
                    _incident(True),
                    _incident(-4),
                    _incident(7, type_id="another-teams-type"),
                    _incident(3, gpu_hours_held="1e999", gpu_count="many", allocated_at="\x1b[2J"),
                    _incident(4, team='=HYPERLINK("x")'),
                ],
                "total": 9,
            }
        }
    }
    caplog.set_level(logging.WARNING, logger="gpufarm.adapters.datadog_reads")
    reads = DatadogLeaseReads(Settings(max_retries=0, http_timeout=5))
    leases = list(reads.lease_facts(IncidentQuery()))
    reads.close()
    assert [(x.ir, x.team) for x in leases] == [(3, "nlp"), (4, '=HYPERLINK("x")')]
    assert (leases[0].hours_held, leases[0].gpu_count, leases[0].allocated_at) == (0.0, 0, None)
    assert reads.skipped == 6
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    "page",
    [None, [], {"data": []}, {"data": {"attributes": {"incidents": "many"}}}],
    ids=["empty", "list", "data", "str"],
)
def test_an_answer_that_is_not_a_search_page_fails_the_read(stub: type[_Stub], page: Any) -> None:
    stub.page = page
    reads = DatadogLeaseReads(Settings(max_retries=0, http_timeout=5))
    with pytest.raises(UpstreamError, match="unexpected shape"):
        list(reads.lease_facts(IncidentQuery()))
    reads.close()
