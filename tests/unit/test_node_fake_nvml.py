"""The fake NVML matches pynvml where the agent touches it, and simulates what the topology says."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

from gpufarm_node import nvml
from gpufarm_node.attribution import Attributor, PodMetadataFile, ProcFs, Workload
from gpufarm_node.fake_host import CLK_TCK, FakeHost
from gpufarm_node.fake_nvml import FakeHandle, FakeNvml
from gpufarm_node.nvml.source import USED_FUNCTIONS
from gpufarm_node.topology import topology_from_dict

START = 1_700_000_000.0


def _fake(data: dict, t: list[float] | None = None) -> tuple[FakeNvml, list[float]]:
    now = t if t is not None else [START]
    fake = FakeNvml(topology_from_dict(data, seed="t"), clock=lambda: now[0])
    fake.nvmlInit()
    return fake, now


def test_every_function_the_source_uses_exists_in_pynvml_and_the_fake_with_the_same_signature() -> None:
    for name in USED_FUNCTIONS:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        params = list(fake.parameters.values())[1:]  # drop self
        assert [(p.name, p.kind, p.default) for p in params] == [
            (p.name, p.kind, p.default) for p in real.parameters.values()
        ], name


def test_every_nvml_function_of_the_fake_has_pynvml_s_signature() -> None:
    # Beyond the agent's calls: benchmarks/node.py runs Datadog's nvml check on the fake too.
    names = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    assert {"nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetFanSpeed"} <= set(names)
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        params = list(inspect.signature(getattr(FakeNvml, name)).parameters.values())[1:]
        assert [(p.name, p.kind, p.default) for p in params] == [
            (p.name, p.kind, p.default) for p in real.parameters.values()
        ], name


def test_video_engines_idle_and_the_sxm_boards_have_no_fan() -> None:
    fake, _ = _fake(
        {"gpus": [{"model": "H100", "count": 1}, {"model": "H100", "mig": {"profile": "1g.10gb", "count": 2}}]}
    )
    whole = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetEncoderUtilization(whole) == [0, 167_000]
    assert fake.nvmlDeviceGetDecoderUtilization(whole) == [0, 167_000]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetFanSpeed(whole)
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(1), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # parent GPU only
        fake.nvmlDeviceGetDecoderUtilization(mig)


def test_used_functions_lists_every_pynvml_call_in_the_source() -> None:
    nodes = [node for path in Path(nvml.__file__).parent.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))]
    names = {node.value for node in nodes if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names |= {node.attr for node in nodes if isinstance(node, ast.Attribute)}
    called = {n for n in names if inspect.isfunction(getattr(pynvml, n, None)) and n.startswith("nvml")}
    assert len(called) > 30
    assert called - set(USED_FUNCTIONS) == set()


def test_calls_before_init_raise_the_real_uninitialized_error() -> None:
    fake = FakeNvml(topology_from_dict({"gpus": [{"model": "H100"}]}))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_missing_library_raises_library_not_found() -> None:
    fake = FakeNvml(topology_from_dict({"gpus": [{"model": "H100"}], "library_missing": True}))
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()


def test_samples_follow_the_profile_and_respect_the_last_seen_timestamp() -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100"}],
            "processes": [{"pid": 10, "gpu": 0, "sm": {"kind": "square", "high": 80, "low": 20, "period": 10}}],
        }
    )
    now[0] += 10
    h = fake.nvmlDeviceGetHandleByIndex(0)
    kind, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(START * 1e6))
    assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert isinstance(samples[0], pynvml.c_nvmlSample_t)
    assert [s.sampleValue.uiVal for s in samples] == [80] * 4 + [20] * 5 + [80]
    last = samples[-1].timeStamp
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)


def test_process_utilization_omits_idle_pids_and_raises_not_found_when_nobody_ran() -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100"}],
            "processes": [{"pid": 10, "gpu": 0, "sm": 50}, {"pid": 11, "gpu": 0, "workload": "idle-held"}],
        }
    )
    now[0] += 3
    h = fake.nvmlDeviceGetHandleByIndex(0)
    samples = fake.nvmlDeviceGetProcessUtilization(h, int(START * 1e6))
    assert {s.pid for s in samples} == {10}
    assert all(isinstance(s, pynvml.c_nvmlProcessUtilizationSample_t) and s.smUtil == 50 for s in samples)
    fake.end_process(10)
    now[0] += 3
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(h, samples[-1].timeStamp)


def test_mig_handles_memory_processes_and_unsupported_calls() -> None:
    fake, _ = _fake(
        {
            "gpus": [{"model": "H100", "mig": {"profile": "1g.10gb", "count": 3}}],
            "processes": [{"pid": 10, "gpu": 0, "mig": 1, "memory_mib": 2048, "sm": 40}],
        }
    )
    parent = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetMigMode(parent) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert fake.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    assert fake.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert fake.nvmlDeviceGetName(mig).endswith("MIG 1g.10gb")
    assert fake.nvmlDeviceGetGpuInstanceId(mig) == 2
    memory = fake.nvmlDeviceGetMemoryInfo(mig, pynvml.nvmlMemory_v2)
    assert isinstance(memory, pynvml.c_nvmlMemory_v2_t) and memory.total == 10 << 30 and memory.used == 2048 << 20
    (proc,) = fake.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId) == (10, 2048 << 20, 2)
    assert fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)) == []
    for call in (
        lambda: fake.nvmlDeviceGetUtilizationRates(parent),
        lambda: fake.nvmlDeviceGetProcessUtilization(parent, 0),
        lambda: fake.nvmlDeviceGetPowerUsage(mig),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_gpm_metrics_through_pynvml_s_own_struct() -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100", "mig": {"profile": "1g.10gb", "count": 2}}],
            "processes": [{"pid": 10, "gpu": 0, "mig": 0, "sm": 60}],
        }
    )
    parent = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice == 1
    first, second = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    fake.nvmlGpmMigSampleGet(parent, 1, first)
    now[0] += 5
    fake.nvmlGpmMigSampleGet(parent, 1, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 2
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    request.metrics[1].metricId = 99
    request.sample1, request.sample2 = first, second
    fake.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS and request.metrics[0].value == pytest.approx(60)
    assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.nvmlGpmSampleFree(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlGpmSampleFree(first)


def test_injected_errors_apply_per_function_gpu_and_time_window() -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100", "count": 2}],
            "errors": [
                {"function": "nvmlDeviceGetPowerUsage", "gpu": 0, "error": "NotSupported"},
                {"function": "*", "gpu": 1, "error": "GpuIsLost", "from": 10, "until": 20},
            ],
        }
    )
    h0, h1 = FakeHandle(0), FakeHandle(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetPowerUsage(h0)
    assert fake.nvmlDeviceGetPowerUsage(h1) > 0
    now[0] += 10
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetTemperatureV(h1, pynvml.NVML_TEMPERATURE_GPU)
    assert fake.nvmlDeviceGetTemperatureV(h0, pynvml.NVML_TEMPERATURE_GPU) > 0
    now[0] += 10
    assert fake.nvmlDeviceGetTemperatureV(h1, pynvml.NVML_TEMPERATURE_GPU) > 0


def test_xid_events_are_delivered_once_after_registration_and_time_out_otherwise() -> None:
    fake, now = _fake({"gpus": [{"model": "H100", "count": 2}], "xid_events": [{"gpu": 1, "xid": 79, "at": 5}]})
    events = fake.nvmlEventSetCreate()
    for i in range(2):
        fake.nvmlDeviceRegisterEvents(FakeHandle(i), pynvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)
    now[0] += 5
    data = fake.nvmlEventSetWait(events, 0)
    assert (data.eventData, fake.nvmlDeviceGetUUID(data.device)) == (79, fake.gpu_spec(1).uuid)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)


def test_energy_counter_grows_with_power() -> None:
    fake, now = _fake({"gpus": [{"model": "H100"}], "processes": [{"pid": 10, "gpu": 0, "sm": 100}]})
    h = FakeHandle(0)
    first = fake.nvmlDeviceGetTotalEnergyConsumption(h)
    now[0] += 10
    grown = fake.nvmlDeviceGetTotalEnergyConsumption(h) - first
    assert grown == pytest.approx(fake.nvmlDeviceGetPowerUsage(h) * 10, rel=1e-6)


def test_fake_host_writes_proc_entries_and_follows_pid_reuse(tmp_path: Path) -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100"}],
            "pods": [
                {
                    "name": "p",
                    "namespace": "ns",
                    "labels": {"gpufarm.io/ir": "IR-7"},
                    "containers": [{"name": "c", "devices": ["0"]}],
                }
            ],
            "processes": [
                {"pid": 77, "gpu": 0, "pod": "p", "end": 10, "comm": "a (b) c"},
                {"pid": 77, "gpu": 0, "env": {"GPUFARM_IR": "IR-8"}, "start": 10},
                {"pid": 78, "gpu": 0, "proc": False},
            ],
        }
    )
    host = FakeHost(fake, tmp_path)
    attributor = Attributor(ProcFs(host.proc_root), pods=PodMetadataFile(host.pods_file))
    attributor.begin_cycle()
    assert (attributor.workloads([77])[77] or Workload()).ir == "ir-7"
    attributor.end_cycle()
    stat = (host.proc_root / "77" / "stat").read_text()
    assert stat.startswith("77 (a (b) c) S ")
    assert "cri-containerd-" in (host.proc_root / "77" / "cgroup").read_text()
    assert not (host.proc_root / "78").exists()
    first_start = stat.rpartition(")")[2].split()[19]
    now[0] += 10
    fake.nvmlDeviceGetComputeRunningProcesses(FakeHandle(0))  # the agent's read makes the fake sync /proc
    stat = (host.proc_root / "77" / "stat").read_text()
    assert int(stat.rpartition(")")[2].split()[19]) == int(first_start) + 10 * CLK_TCK
    assert b"GPUFARM_IR=IR-8\0" in (host.proc_root / "77" / "environ").read_bytes()
    # The pid cursor passed 77 again (loadavg), so the attributor reads it afresh instead of trusting its cache.
    assert ProcFs(host.proc_root).last_pid() == 77  # round the pid space from 78, resting on 77
    attributor.begin_cycle()
    assert (attributor.workloads([77])[77] or Workload()).ir == "ir-8"
    attributor.end_cycle()
    assert (host.proc_root / "77" / "cgroup").read_text().startswith("0::/system.slice/slurmstepd.scope")
    assert '"gpufarm.io/ir": "IR-7"' in host.pods_file.read_text()
    (entry,) = host.pod_resources()
    assert entry == ("ns", "p", "c", "nvidia.com/gpu", [fake.gpu_spec(0).uuid])


def test_field_values_answer_each_field_as_its_own_function_and_carry_its_faults() -> None:
    fake, now = _fake(
        {
            "gpus": [{"model": "H100", "count": 2, "ecc_uncorrected": 3, "remapped_rows": [5, 1, 1, 0]}],
            "processes": [{"pid": 10, "gpu": 0, "sm": 100}],
            "errors": [{"function": "nvmlDeviceGetRemappedRows", "gpu": 1, "error": "NotSupported"}],
        }
    )
    fields = [
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        pynvml.NVML_FI_DEV_MEMORY_TEMP,  # not one the fake knows: that field alone fails
    ]
    now[0] += 10
    energy = fake.nvmlDeviceGetTotalEnergyConsumption(FakeHandle(0))
    values = fake.nvmlDeviceGetFieldValues(FakeHandle(0), fields)
    returns = [v.nvmlReturn for v in values]
    assert returns == [pynvml.NVML_SUCCESS] * 6 + [pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert [v.fieldId for v in values] == fields
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert values[0].value.ullVal == energy  # the same counter, read at the same instant
    assert values[1].value.ullVal == 3
    assert [v.value.uiVal for v in values[2:6]] == list(fake.nvmlDeviceGetRemappedRows(FakeHandle(0))) == [5, 1, 1, 0]
    faulty = fake.nvmlDeviceGetFieldValues(FakeHandle(1), fields[:3])
    assert [v.nvmlReturn for v in faulty] == [pynvml.NVML_SUCCESS] * 2 + [pynvml.NVML_ERROR_NOT_SUPPORTED]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetFieldValues(FakeHandle(5), fields)
