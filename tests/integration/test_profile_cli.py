"""`gpufarm profile upload` and the capture helper: an upload token and the upload function's URL, nothing else.

The function runs on a loopback port over in-memory Datadog fakes, with S3 as moto's server (tests/upload_service.py).
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from upload_service import ALICE, STRANGER, UploadService, upload_service

from gpufarm.cli import cli, upload_client
from gpufarm.cli.capture import gpufarm_trace_handler

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[UploadService]:
    with upload_service(monkeypatch) as running:
        monkeypatch.setenv("GPUFARM_API_URL", running.url)
        yield running


def _upload(service: UploadService, *args: str, token: str | None = None) -> Any:
    extra = ["--token", token] if token is not None else []
    return CliRunner().invoke(cli, ["profile", "upload", *args, *extra])


def test_upload_prints_the_link_and_records_the_run(service: UploadService) -> None:
    ir = service.lease()
    trace = str(FIXTURES / "cpu_mlp.json.gz")
    result = _upload(
        service, trace, "--ir", f"IR-{ir}", "--name", "run-7", "--batch-size", "32", token=service.token(ir)
    )
    assert result.exit_code == 0, result.output
    assert f"IR-{ir} run-7: 5 steps" in result.output and "recorded" in result.output
    assert f"{'http://127.0.0.1:9/pages'}/profiles/ir-{ir}/run-7-" in result.output
    assert [(r.run, r.actor) for r in service.runs(ir)] == [("run-7", ALICE)]
    # The trace and summary, the team's newest; nothing left under incoming/.
    assert len(service.objects("profiles/")) == 3 and service.objects("incoming/") == []


def test_the_ir_and_the_token_default_to_the_environment(
    service: UploadService, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = service.lease()
    monkeypatch.setenv("GPUFARM_IR", f"IR-{ir}")
    monkeypatch.setenv("GPUFARM_UPLOAD_TOKEN", service.token(ir))
    result = _upload(service, str(FIXTURES / "cpu_mlp.json"))
    assert result.exit_code == 0, result.output
    assert [r.run for r in service.runs(ir)] == ["cpu_mlp"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("bad ir", "is not an IR"),
        ("another lease", "the upload token is not for IR-"),
        ("not on the lease", "requester or members"),
        ("no token", "no upload token"),
        ("not a token", "not an upload token"),
    ],
)
def test_bad_arguments_and_refusals_exit_2_and_store_nothing(service: UploadService, case: str, message: str) -> None:
    ir, other = service.lease(), service.lease()
    token = {
        "another lease": service.token(other),
        "not on the lease": service.token(ir, STRANGER),
        "no token": "",
        "not a token": "hunter2",
    }.get(case, service.token(ir))
    lease = "IR-x" if case == "bad ir" else f"IR-{ir}"
    result = _upload(service, str(FIXTURES / "cpu_mlp.json"), "--ir", lease, token=token)
    assert result.exit_code == 2, result.output
    assert message in result.output and "nothing was stored" in result.output
    assert token not in result.output or not token
    assert service.runs(ir) == [] and service.objects() == []


def test_a_file_that_is_not_a_trace_exits_2(service: UploadService, tmp_path: Path) -> None:
    ir = service.lease()
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": "world"}')
    result = _upload(service, str(notes), "--ir", f"IR-{ir}", token=service.token(ir))
    assert result.exit_code == 2 and "no traceEvents" in result.output
    assert service.runs(ir) == [] and service.objects() == []


def test_a_service_failure_is_retried_within_bounds_then_exits_1(
    service: UploadService, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = service.lease()
    real = urllib.request.urlopen
    calls: list[str] = []
    failures = {"n": 2}

    def flaky(request: Any, timeout: float) -> Any:
        calls.append(f"{request.get_method()} {request.full_url.split('?')[0].rsplit('/', 1)[-1]}")
        if failures["n"] > 0:
            failures["n"] -= 1
            raise urllib.error.HTTPError(request.full_url, 503, "Service Unavailable", {}, None)  # type: ignore[arg-type]
        return real(request, timeout=timeout)

    monkeypatch.setattr(upload_client.urllib.request, "urlopen", flaky)
    monkeypatch.setattr(upload_client.time, "sleep", lambda _: None)
    result = _upload(service, str(FIXTURES / "cpu_mlp.json"), "--ir", f"IR-{ir}", token=service.token(ir))
    assert result.exit_code == 0, result.output
    assert calls[:3] == ["POST begin"] * 3 and [r.run for r in service.runs(ir)] == ["cpu_mlp"]
    failures["n"] = 100
    calls.clear()
    result = _upload(service, str(FIXTURES / "cpu_mlp.json"), "--ir", f"IR-{ir}", token=service.token(ir))
    assert result.exit_code == 1 and "after 4 attempts (HTTP 503)" in result.output
    assert calls == ["POST begin"] * upload_client.MAX_ATTEMPTS


def test_the_put_carries_no_token_and_large_traces_show_progress(
    service: UploadService, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = service.lease()
    token = service.token(ir)
    real = urllib.request.urlopen
    seen: list[tuple[str, dict[str, str]]] = []

    def spy(request: Any, timeout: float) -> Any:
        seen.append((request.get_method(), dict(request.header_items())))
        return real(request, timeout=timeout)

    monkeypatch.setattr(upload_client.urllib.request, "urlopen", spy)
    monkeypatch.setattr("gpufarm.cli.profile.PROGRESS_FROM_BYTES", 1)
    result = _upload(service, str(FIXTURES / "cpu_mlp.json"), "--ir", f"IR-{ir}", token=token)
    assert result.exit_code == 0, result.output
    assert "uploading" in result.output  # the bar, on stderr
    (put,) = [headers for method, headers in seen if method == "PUT"]
    assert not any(k.lower() == "authorization" for k in put) and token not in str(put)
    assert all(headers.get("Authorization") == f"Bearer {token}" for method, headers in seen if method == "POST")


def test_the_capture_helper_writes_and_uploads_each_trace(service: UploadService, tmp_path: Path) -> None:
    ir = service.lease()

    class Profiler:
        """What on_trace_ready hands the handler: torch's profile object (its export and step number)."""

        step_num = 6

        def export_chrome_trace(self, path: str) -> None:
            shutil.copy(FIXTURES / "cpu_mlp.json.gz", path)

    handler = gpufarm_trace_handler(
        f"IR-{ir}", name="train", directory=tmp_path, batch_size=32, token=service.token(ir)
    )
    handler(Profiler())
    assert (tmp_path / "train-6.json.gz").exists()
    assert [r.run for r in service.runs(ir)] == ["train-6"]


def test_the_capture_helper_needs_a_lease_and_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFARM_IR", raising=False)
    monkeypatch.delenv("GPUFARM_UPLOAD_TOKEN", raising=False)
    with pytest.raises(ValueError, match="name the lease"):
        gpufarm_trace_handler()
    with pytest.raises(ValueError, match="upload token"):
        gpufarm_trace_handler("IR-1")
