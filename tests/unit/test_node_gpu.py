"""On a host with an NVIDIA driver: the real NVML source, and its series against spec/metrics.yaml.

Opt-in (`-m gpu` selects it); skipped where NVML cannot be initialised, which is every CI machine.
"""

from __future__ import annotations

import time

import pynvml
import pytest
from test_node_spec import _problems

from gpufarm_node.attribution import Attributor
from gpufarm_node.collect import CollectOptions, SeriesBuilder
from gpufarm_node.nvml.source import NvmlSource
from gpufarm_node.series_tags import identity_tags


def _has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _has_nvml(), reason="no NVIDIA driver on this host")]


def test_the_real_source_reads_every_gpu_and_its_series_follow_the_spec() -> None:
    source = NvmlSource(interval=2.0, xid_mode="poll")
    source.start()
    try:
        source.snapshot()
        time.sleep(1.2)  # GPM needs two samples more than 100 ms apart
        snap = source.snapshot()
    finally:
        source.close()
    assert snap.gpus and all(g.healthy for g in snap.gpus)
    for gpu in snap.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.name
        assert gpu.mig_enabled or (gpu.memory is not None and gpu.memory.total > 0)
    attributor = Attributor()
    attributor.begin_cycle()
    workloads = {p.pid: attributor.workload(p.pid) for g in snap.gpus for p in g.processes}
    series = SeriesBuilder(identity_tags("gpu-smoke", "local"), CollectOptions(per_process=True)).build(
        snap, workloads, {}
    )
    problems = sorted({p for s in series for p in _problems(s)})
    assert problems == [], "\n".join(problems[:20])
