"""`gpufarm profile upload` and the capture helper, on the runtime's collaborators with S3 under moto."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from click.testing import CliRunner
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics
from moto import mock_aws

from gpufarm.cli import cli
from gpufarm.cli.capture import gpufarm_trace_handler
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases import profile_runs
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"
ALICE, STRANGER = "U0000000001", "U0000000009"
BUCKET = "gpufarm-profiles-cli"


class Lease:
    def __init__(self, svc: GpuFarm, incidents: FakeIncidents, ir: int, s3: Any) -> None:
        self.svc, self.incidents, self.ir, self.s3 = svc, incidents, ir, s3

    def runs(self) -> list[profile_runs.Run]:
        return profile_runs.runs(Allocation.from_record(self.incidents.by_ir(self.ir)).history)

    def objects(self) -> int:
        return int(self.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0))


@pytest.fixture
def lease(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lease]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUFARM_PROFILE_BUCKET": BUCKET,
        "GPUFARM_PROFILE_PAGES_URL": "http://127.0.0.1:9/pages",
        "GPUFARM_PROFILE_LINK_SECRET": "cli-test-secret",
        "GPUFARM_USER": ALICE,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GPUFARM_IR", raising=False)
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    farm = parse_farm(FARM_YAML)
    svc = GpuFarm(
        incidents=incidents, hosts=FakeHosts(), chat=FakeChat(), clock=clock, farm=farm, metrics=FakeMetrics()
    )
    values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm"}
    alloc, _ = svc.create_request(build_request(values, farm, requester=ALICE, channel=None, request_id="r-000001"))
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        rt.override(service=svc, farm=farm)
        try:
            yield Lease(svc, incidents, alloc.ir, s3)
        finally:
            rt.reset()


def test_upload_prints_the_link_and_records_the_run(lease: Lease) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "profile",
            "upload",
            str(FIXTURES / "cpu_mlp.json.gz"),
            "--ir",
            f"IR-{lease.ir}",
            "--name",
            "run-7",
            "--batch-size",
            "32",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"IR-{lease.ir} run-7: 5 steps" in result.output and "recorded" in result.output
    assert "http://127.0.0.1:9/pages/profiles/ir-" in result.output
    assert [r.run for r in lease.runs()] == ["run-7"] and lease.objects() == 3  # trace, page, team's newest


def test_the_ir_defaults_to_gpufarm_ir(lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_IR", f"IR-{lease.ir}")
    result = CliRunner().invoke(cli, ["profile", "upload", str(FIXTURES / "cpu_mlp.json")])
    assert result.exit_code == 0, result.output
    assert [r.run for r in lease.runs()] == ["cpu_mlp"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ir", "IR-x"], "is not an IR"),
        (["--ir", "IR-999"], "IR-999"),
        (["--user", STRANGER], "requester or members"),
        (["--user", "alice"], "not a Slack user id"),
    ],
)
def test_bad_arguments_exit_2_and_store_nothing(lease: Lease, args: list[str], message: str) -> None:
    base = ["profile", "upload", str(FIXTURES / "cpu_mlp.json")]
    if "--ir" not in args:
        base += ["--ir", f"IR-{lease.ir}"]
    result = CliRunner().invoke(cli, base + args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "nothing was stored" in result.output
    assert lease.runs() == [] and lease.objects() == 0


def test_a_file_that_is_not_a_trace_exits_2(lease: Lease, tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": "world"}')
    result = CliRunner().invoke(cli, ["profile", "upload", str(notes), "--ir", f"IR-{lease.ir}"])
    assert result.exit_code == 2 and "no traceEvents" in result.output
    assert lease.runs() == [] and lease.objects() == 0


def test_the_capture_helper_writes_and_uploads_each_trace(lease: Lease, tmp_path: Path) -> None:
    class Profiler:
        """What on_trace_ready hands the handler: torch's profile object (its export and step number)."""

        step_num = 6

        def export_chrome_trace(self, path: str) -> None:
            shutil.copy(FIXTURES / "cpu_mlp.json.gz", path)

    handler = gpufarm_trace_handler(f"IR-{lease.ir}", name="train", directory=tmp_path, batch_size=32)
    handler(Profiler())
    assert (tmp_path / "train-6.json.gz").exists()
    assert [r.run for r in lease.runs()] == ["train-6"]


def test_the_capture_helper_needs_a_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFARM_IR", raising=False)
    with pytest.raises(ValueError, match="name the lease"):
        gpufarm_trace_handler()
