"""`gpufarm report --outlook`: unmet demand over the period and free capacity four weeks ahead, read from the
incidents and the host list, in every format; a team or project filter is exit 2."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from fakes import FARM_YAML, FakeClock, FakeHosts, FakeIncidents

from gpufarm.cli.report import report
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.model import isoformat
from gpufarm.handlers import runtime as rt

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, tzinfo=UTC)


@pytest.fixture
def farm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIncidents]:
    for name in ("DD_API_KEY", "DD_APP_KEY", "GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    clock = FakeClock(NOW)
    store = FakeIncidents(clock)
    hosts = FakeHosts()
    for name in ("node-1", "node-2"):
        hosts.seed(name, "H100", 8, "hpc")
    common = {f.TEAM: "nlp", f.PROJECT: "llm", f.ENVIRONMENT: "hpc", f.GPU_MODEL: "H100", f.GPU_COUNT: "8"}
    store.create(
        "live",
        {**common, f.STATE: "stable", f.PHASE: "allocated", f.EXPIRES_AT: isoformat(NOW + timedelta(days=9))},
    )
    store.create(
        "waiting",
        {
            **common,
            f.STATE: "active",
            f.PHASE: "waiting",
            f.WAITING_SINCE: isoformat(NOW - timedelta(hours=5)),
            f.HISTORY: [f"{isoformat(NOW - timedelta(hours=5))} gpufarm waiting: 1 of 1 [queued-capacity]"],
        },
    )
    rt.override(farm=parse_farm(FARM_YAML), clock=clock, incidents=store, hosts=hosts)
    yield store
    rt.reset()


def test_the_outlook_as_json(farm: FakeIncidents) -> None:
    done = CliRunner().invoke(report, ["--outlook", "--since", "7d", "--format", "json"])
    assert done.exit_code == 0, done.output
    document = json.loads(done.output)
    [hpc] = document["unmet_demand"]
    assert hpc["environment"] == "hpc" and hpc["waiting_gpu_hours"] == pytest.approx(40.0)
    assert hpc["waited_because"] == {"queued-capacity": 1}
    pools = {(p["environment"], p["gpu_model"]): p for p in document["capacity"]}
    weeks = pools[("hpc", "H100")]["weeks"]
    assert pools[("hpc", "H100")]["capacity_gpus"] == 16
    assert [w["free_gpus"] for w in weeks] == [8, 8, 16, 16] and [w["leased_gpus"] for w in weeks] == [8, 8, 0, 0]
    assert pools[("cloud", "A100")]["capacity_gpus"] == 0


def test_the_outlook_in_the_other_formats(farm: FakeIncidents) -> None:
    table = CliRunner().invoke(report, ["--outlook"])
    assert table.exit_code == 0 and "free capacity ahead" in table.output and "hpc H100:" in table.output
    rows = list(csv.DictReader(io.StringIO(CliRunner().invoke(report, ["--outlook", "--format", "csv"]).output)))
    assert {r["section"] for r in rows} == {"demand", "capacity"}
    assert next(r["free_gpus"] for r in rows if r["environment"] == "hpc" and r["section"] == "capacity") == "8"
    page = CliRunner().invoke(report, ["--outlook", "--format", "html"]).output
    assert page.startswith("<!doctype html>") and "Free capacity, four weeks ahead" in page and "<script" not in page


@pytest.mark.parametrize("args", [["--team", "nlp"], ["--project", "llm"], ["--since", "0d"]])
def test_a_filter_or_bad_period_is_exit_2(farm: FakeIncidents, args: list[str]) -> None:
    done = CliRunner().invoke(report, ["--outlook", *args])
    assert done.exit_code == 2 and "nothing was written" in done.output
