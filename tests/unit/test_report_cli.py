"""`gpufarm report` as a command: bad input exits 2 and writes nothing (even without Datadog keys), a report is
written whole to --out, and the formats are the ones the renderers make."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import FARM_YAML, FakeClock, FakeIncidents

from gpufarm.cli.report import report
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.model import isoformat
from gpufarm.handlers import runtime as rt

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, tzinfo=UTC)


@pytest.fixture
def incidents(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIncidents]:
    for name in ("DD_API_KEY", "DD_APP_KEY", "GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    clock = FakeClock(NOW)
    store = FakeIncidents(clock)
    store.create(
        "GPU request: nlp/llm",
        {
            f.STATE: "stable",
            f.PHASE: "allocated",
            f.TEAM: "nlp",
            f.PROJECT: "llm",
            f.ENVIRONMENT: "hpc",
            f.GPU_COUNT: "8",
            f.HOST_GPUS: ["node-1=8"],
            f.HOSTS: ["node-1"],
            f.ALLOCATED_AT: isoformat(datetime(2026, 12, 9, tzinfo=UTC)),
            f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 12, 10, tzinfo=UTC)),
            f.GPU_HOURS_HELD: "192.000",
            f.GPU_HOURS_BUSY: "96.000",
            f.GPU_HOURS_IDLE: "96.000",
            f.GPU_HOURS_BY_MONTH: ["2026-12=192.000"],
        },
    )
    rt.override(farm=parse_farm(FARM_YAML), clock=clock, incidents=store)
    yield store
    rt.reset()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--since", "0d"], "longer than zero"),
        (["--since", "10y"], "at most 366 days"),
        (["--month", "2026-13"], "no month 13"),
        (["--since", "30d", "--month", "2026-11"], "not both"),
        (["--team", "ghost"], "unknown team 'ghost'"),
        (["--project", "ghost"], "unknown project 'ghost'; projects: llm"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    incidents: FakeIncidents, tmp_path: Path, args: list[str], words: str
) -> None:
    out = tmp_path / "r.csv"
    done = CliRunner().invoke(report, [*args, "--format", "csv", "--out", str(out)])
    assert done.exit_code == 2, done.output
    assert words in done.output and "nothing was written" in done.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_bad_range_is_exit_2_before_any_datadog_client_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DD_API_KEY", "DD_APP_KEY"):
        monkeypatch.delenv(name, raising=False)
    rt.override(farm=parse_farm(FARM_YAML), clock=FakeClock(NOW))
    try:
        done = CliRunner().invoke(report, ["--month", "2026-00"])
    finally:
        rt.reset()
    assert done.exit_code == 2 and "no month 00" in done.output


def test_reports_are_written_whole_in_each_format(incidents: FakeIncidents, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = CliRunner().invoke(report, ["--by", "project", "--format", "json", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert f"wrote {out}" in done.output
    document = json.loads(out.read_text())
    assert [r["group"] for r in document["rows"]] == ["llm"] and document["total"]["gpu_hours"]["held"] == 192 + 96
    table = CliRunner().invoke(report, [])
    assert table.exit_code == 0 and "gpufarm report: last 30d" in table.output
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left beside it
    bad_by = CliRunner().invoke(report, ["--by", "planet"])
    assert bad_by.exit_code == 2
