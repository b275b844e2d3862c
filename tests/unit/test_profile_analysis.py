"""Reading and analysing real torch.profiler traces (tests/fixtures/profiler, made by make_traces.py there).

The fixtures are CPU traces of a small MLP trained for 5 steps of 32 samples; bad inputs are made from them
(cut short, gzip cut short, a 2 GB sparse file) or are plainly not traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.profiling import reader
from gpufarm.profiling.analysis import analyse
from gpufarm.profiling.page import render

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"
CPU = FIXTURES / "cpu_mlp.json"
CPU_GZ = FIXTURES / "cpu_mlp.json.gz"


def test_the_cpu_trace_has_its_five_steps_operators_and_memory() -> None:
    figures = analyse(reader.events(CPU), batch_size=32)
    assert figures.steps == 5
    assert figures.step_mean_ms is not None and figures.step_mean_ms > 0
    assert figures.step_max_ms is not None and figures.step_p50_ms is not None
    assert figures.step_max_ms >= figures.step_p50_ms > 0
    names = [name for name, _, _ in figures.top_operators]
    assert "aten::addmm" in names or "aten::linear" in names
    assert figures.cpu_threads and 0 < figures.cpu_threads[0].share <= 1
    assert figures.memory_peak_bytes.get("cpu", 0) > 0
    assert not figures.has_gpu and figures.comm_share is None and figures.top_kernels == ()
    assert figures.throughput == pytest.approx(32 / (figures.step_mean_ms / 1000), rel=1e-3)


def test_gzipped_and_plain_traces_give_the_same_figures() -> None:
    assert analyse(reader.events(CPU_GZ)) == analyse(reader.events(CPU))


def test_no_batch_size_no_throughput() -> None:
    assert analyse(reader.events(CPU)).throughput is None


def _consume(path: Path) -> None:
    for _ in reader.events(path):
        pass


def test_a_truncated_gzip_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(CPU_GZ.read_bytes()[: CPU_GZ.stat().st_size // 2])
    with pytest.raises(ValidationFailed, match="truncated or corrupt gzip"):
        _consume(cut)


def test_a_truncated_json_trace_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "cut.json"
    cut.write_bytes(CPU.read_bytes()[: CPU.stat().st_size // 2])
    with pytest.raises(ValidationFailed, match="not a whole JSON document"):
        _consume(cut)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello, this is a README\n", "not a whole JSON document"),
        (json.dumps({"schemaVersion": 1, "events": []}).encode(), "no traceEvents"),
        (json.dumps({"traceEvents": [1, 2]}).encode(), "other than events"),
        (b"", "empty file"),
    ],
)
def test_what_is_not_a_trace_is_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(ValidationFailed, match=message):
        _consume(path)


def test_a_2_gb_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as handle:  # sparse: no 2 GB written
        handle.truncate(reader.MAX_TRACE_BYTES)
    with pytest.raises(ValidationFailed, match="under 2 GB"):
        reader.check_size(big)
    with pytest.raises(ValidationFailed, match="under 2 GB"):
        _consume(big)


def test_a_gzip_that_inflates_past_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_TRACE_BYTES", CPU.stat().st_size // 2)
    with pytest.raises(ValidationFailed, match="inflates to 2 GB"):
        _consume(CPU_GZ)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationFailed, match="cannot read it"):
        _consume(tmp_path / "nope.json")


def test_the_page_is_self_contained_and_escapes_what_it_shows() -> None:
    figures = analyse(reader.events(CPU), batch_size=32)
    html = render(figures, ir=7, run="<run>", uploaded="2026-12-01T15:00:00Z", trace_name="a&b.json")
    assert html.startswith("<!doctype html>") and "<svg" in html
    assert "&lt;run&gt;" in html and "a&amp;b.json" in html and "<run>" not in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert html.count("<title>step ") == 5
    assert "aten::" in html


def test_a_gzip_roundtrip_of_the_fixture_matches_the_committed_copy() -> None:
    assert gzip.decompress(CPU_GZ.read_bytes()) == CPU.read_bytes()
