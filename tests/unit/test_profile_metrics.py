"""Every series a profiler run publishes is declared under `profile_metrics` in spec/metrics.yaml, and used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import spec_check
import yaml

from gpufarm.core.kernel.ports import MetricSeries
from gpufarm.profiling import reader
from gpufarm.profiling.analysis import Figures, Stream, analyse
from gpufarm.profiling.metrics import lease_tags, series, tag_value, valid_run_name

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
DECLARED: dict[str, Any] = SPEC["profile_metrics"]
CPU = ROOT / "tests" / "fixtures" / "profiler" / "cpu_mlp.json"
TAGS = lease_tags(12, "llm-pretrain", "NLP", "run-7")


def _problems(s: MetricSeries) -> list[str]:
    return spec_check.problems(s, "profile_metrics")


def _gpu_figures() -> Figures:
    """Figures as a CUDA trace gives them (the shape Analyser builds), to cover the GPU-only series."""
    lane = Stream("cuda:0/stream 7", 900.0, 0.9, (0.9,) * 120)
    return Figures(
        events=10,
        window_us=1000.0,
        steps=1,
        step_mean_ms=1.0,
        step_p50_ms=1.0,
        step_max_ms=1.0,
        step_times_ms=(1.0,),
        gpu_streams=(lane,),
        cpu_threads=(),
        gpu_time_us=900.0,
        comm_share=0.25,
        top_kernels=(("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 225.0, 3),),
        top_operators=(("aten::mm", 10.0, 1),),
        memory_peak_bytes={"cuda:0": 1 << 30},
        batch_size=8,
        throughput=8000.0,
    )


@pytest.mark.parametrize("source", ["cpu-trace", "gpu-figures"])
def test_every_series_follows_the_spec(source: str) -> None:
    figures = analyse(reader.events(CPU), batch_size=32) if source == "cpu-trace" else _gpu_figures()
    built = series(figures, TAGS, 1_764_600_000)
    assert built
    problems = sorted({p for s in built for p in _problems(s)})
    assert problems == [], "\n".join(problems)


def test_every_declared_metric_is_published() -> None:
    cpu = {s.metric for s in series(analyse(reader.events(CPU), batch_size=32), TAGS, 0)}
    gpu = {s.metric for s in series(_gpu_figures(), TAGS, 0)}
    assert {m for m, spec in DECLARED.items() if not spec.get("gpu_only")} <= cpu
    assert set(DECLARED) <= cpu | gpu
    assert all(name.startswith(SPEC["prefix"] + "profile.") and spec["description"] for name, spec in DECLARED.items())


def test_profile_metrics_are_not_node_metrics() -> None:
    assert not set(DECLARED) & set(SPEC["metrics"])


def test_tag_values_and_run_names() -> None:
    assert tag_value("void at::native::vectorized_elementwise_kernel<4>(int)") == (
        "void_at::native::vectorized_elementwise_kernel_4_int"
    )
    assert tag_value("???") == "unnamed" and len(tag_value("x" * 500)) == 100
    assert TAGS == ("ir:ir-12", "run:run-7", "project:llm-pretrain", "team:nlp")
    assert valid_run_name("run-7") and valid_run_name("2026.12.01_a")
    assert not valid_run_name("Run 7") and not valid_run_name("-x") and not valid_run_name("r" * 64)
