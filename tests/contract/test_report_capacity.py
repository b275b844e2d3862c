"""A report's pool capacity read over the light reader (gpufarm.adapters.datadog_reads): one timeseries query.

On the sandbox: the reader asks and reads the inventory gauge exactly as the gateway does, and `gpufarm report`
shows each pool's capacity and unallocated hours in the table, the CSV and the JSON; a failing query leaves the
report written with capacity not read. On a stub: every malformed answer fails the read with UpstreamError (the
report's note, never 0) and out-of-range values are left out.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import FARM_YAML
from helpers import http

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_reads import DatadogLeaseReads
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.reporting.capacity import CAPACITY_QUERY, TOTAL_METRIC, read_capacity
from gpufarm.reporting.query import Period

pytestmark = pytest.mark.contract


def _seed_gauge(settings: Settings) -> None:
    """16 H100 in hpc over the last ten minutes, 4 A100 in cloud."""
    now = int(time.time())
    gateway = DatadogGateway(settings)
    try:
        for env, model, gpus in (("hpc", "h100", 16.0), ("cloud", "a100", 4.0)):
            points = tuple(MetricPoint(now - s, gpus) for s in range(0, 600, 60))
            tags = (f"environment:{env}", f"gpu_model:{model}")
            gateway.submit([MetricSeries(TOTAL_METRIC, points, tags)])
    finally:
        gateway.close()


def test_the_reader_asks_and_reads_the_gauge_as_the_gateway_does(dd_env: str, settings: Settings) -> None:
    _seed_gauge(settings)
    end = datetime.now(UTC) + timedelta(minutes=1)
    start = end - timedelta(hours=1)
    gateway = DatadogGateway(settings)
    reads = DatadogLeaseReads(settings)
    try:
        light = reads.timeseries(CAPACITY_QUERY, start, end)
        assert light == gateway.timeseries(CAPACITY_QUERY, start, end) and len(light) == 2
        capacity, note = read_capacity(reads, Period(start, end, "the last hour"))
    finally:
        gateway.close()
        reads.close()
    assert capacity == {("hpc", "H100"): 16.0, ("cloud", "A100"): 4.0}
    assert "could not be read" not in note


_MAIN = "import sys; from gpufarm.cli import main; sys.argv = ['gpufarm', *sys.argv[1:]]; main()"


def _report(tmp_path: Path, fmt: str, **extra: str) -> subprocess.CompletedProcess[str]:
    farm = tmp_path / "farm.yaml"
    farm.write_text(FARM_YAML)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env |= {k: os.environ[k] for k in ("GPUFARM_DATADOG_HOST", "DD_API_KEY", "DD_APP_KEY")}
    env |= {"GPUFARM_FARM_CONFIG": str(farm), "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}
    command = [sys.executable, "-c", _MAIN, "report", "--since", "1d", "--format", fmt]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_every_format_of_gpufarm_report_shows_the_pools_capacity(
    dd_env: str, settings: Settings, type_id: str, tmp_path: Path
) -> None:
    _seed_gauge(settings)
    table = _report(tmp_path, "table")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "  hpc H100: 16.0 GPUs, 384.0 h capacity, 0.0 held, 384.0 unallocated" in table.stdout
    assert "  slices L4: 0.0 h held, capacity not read" in table.stdout  # the gauge has no series of it
    rows = {r["team"]: r for r in csv.DictReader(io.StringIO(_report(tmp_path, "csv").stdout))}
    assert (rows["pool:hpc/H100"]["capacity_gpu_hours"], rows["pool:cloud/A100"]["unallocated_gpu_hours"]) == (
        "384.0",
        "96.0",
    )
    pools = json.loads(_report(tmp_path, "json").stdout)["pools"]
    hpc = next(p for p in pools if (p["environment"], p["gpu_model"]) == ("hpc", "H100"))
    assert hpc["gpus"] == 16 and hpc["gpu_hours"]["unallocated"] == 384


def test_a_failing_capacity_query_leaves_the_report_written_with_capacity_not_read(
    dd_env: str, settings: Settings, type_id: str, sandbox_url: str, tmp_path: Path
) -> None:
    _seed_gauge(settings)
    http(f"{sandbox_url}/_sandbox/faults", "POST", {"rate": 1.0, "statuses": [500], "paths": "^/api/v2/query/"})
    table = _report(tmp_path, "table", GPUFARM_MAX_RETRIES="0")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "  hpc H100: 0.0 h held, capacity not read" in table.stdout
    assert "unallocated capacity could not be read" in table.stdout and "HTTP 500" in table.stdout


# -- malformed answers -------------------------------------------------------------------------------------------


class _Stub(BaseHTTPRequestHandler):
    """Datadog's timeseries query answering `answer` (raw bytes, or JSON of any shape)."""

    answer: Any = None

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = self.answer if isinstance(self.answer, bytes) else json.dumps(self.answer).encode()
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


END = datetime(2026, 12, 7, tzinfo=UTC)
PERIOD = Period(END - timedelta(days=1), END, "a day")


@pytest.mark.parametrize(
    "answer",
    [b"not json", [], {"data": []}, {"data": {"attributes": "many"}}],
    ids=["not-json", "list", "data", "attributes"],
)
def test_an_answer_that_is_not_a_timeseries_fails_the_read_and_capacity_is_not_read(
    stub: type[_Stub], answer: Any
) -> None:
    stub.answer = answer
    reads = DatadogLeaseReads(Settings(max_retries=0, http_timeout=5))
    try:
        with pytest.raises(UpstreamError):
            reads.timeseries(CAPACITY_QUERY, PERIOD.start, PERIOD.end)
        capacity, note = read_capacity(reads, PERIOD)
    finally:
        reads.close()
    assert capacity is None and "unallocated capacity could not be read" in note


def test_values_out_of_range_are_left_out_and_a_pool_without_any_is_not_read(stub: type[_Stub]) -> None:
    stamp = int(PERIOD.start.timestamp() * 1000)
    stub.answer = {
        "data": {
            "attributes": {
                "times": [stamp, stamp + 60_000, stamp + 120_000, "soon"],
                "series": [
                    {"group_tags": ["environment:hpc", "gpu_model:h100"]},
                    {"group_tags": ["environment:cloud", "gpu_model:a100"]},
                    "not a series",
                    {"group_tags": ["gpu_model:l4"]},
                ],
                "values": [[8, None, True, 8], [-1, 1e12, "many"], [1], [2]],
            }
        }
    }
    reads = DatadogLeaseReads(Settings(max_retries=0, http_timeout=5))
    try:
        capacity, _ = read_capacity(reads, PERIOD)
    finally:
        reads.close()
    assert capacity == {("hpc", "H100"): 8.0}
