"""NvmlSource over the fake NVML: interval averages, capabilities, lost GPUs, MIG/GPM, XID events."""

from __future__ import annotations

import time
from typing import Any

import pynvml
import pytest

from gpufarm_node.fake_nvml import FakeNvml
from gpufarm_node.model import NodeSnapshot
from gpufarm_node.nvml.errors import NvmlUnavailable
from gpufarm_node.nvml.fields import process_means
from gpufarm_node.nvml.source import NvmlSource
from gpufarm_node.topology import topology_from_dict

START = 1_700_000_000.0


class Clock:
    """A settable clock shared by the fake and the source."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def _source(data: dict[str, Any], **kwargs: Any) -> tuple[NvmlSource, FakeNvml, Clock]:
    clock = Clock()
    fake = FakeNvml(topology_from_dict(data, seed="t"), clock=clock)
    kwargs.setdefault("xid_mode", "poll")
    source = NvmlSource(fake, clock=clock, **kwargs)
    source.start()
    return source, fake, clock


def _after(source: NvmlSource, clock: Clock, seconds: float) -> NodeSnapshot:
    clock.now += seconds
    return source.snapshot()


def test_utilization_is_the_mean_of_the_interval_s_samples_not_one_reading() -> None:
    square = {"kind": "square", "high": 100, "low": 0, "period": 10, "duty": 0.3}
    source, fake, clock = _source({"gpus": [{"model": "H100"}], "processes": [{"pid": 9, "gpu": 0, "sm": square}]})
    snap = _after(source, clock, 9)
    # Ten one-second samples (t=0..9) of a 30 % duty square wave; an instantaneous read says 0 or 100.
    assert snap.gpus[0].utilization == pytest.approx(30.0)
    snap = _after(source, clock, 5)
    assert snap.gpus[0].utilization == pytest.approx(60.0)  # only the 5 new samples: t=10..14 -> 100,100,100,0,0
    assert fake.calls.get("nvmlDeviceGetUtilizationRates", 0) == 0


def test_no_new_sample_falls_back_to_the_instantaneous_rate() -> None:
    source, fake, clock = _source({"gpus": [{"model": "H100"}], "processes": [{"pid": 9, "gpu": 0, "sm": 42}]})
    _after(source, clock, 15)
    snap = _after(source, clock, 0)
    assert snap.gpus[0].utilization == 42.0
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1


def test_unsupported_signals_are_probed_once_and_stay_off_for_that_gpu_only() -> None:
    source, fake, clock = _source(
        {
            "gpus": [{"model": "H100", "count": 2}],
            "errors": [{"function": "nvmlDeviceGetPowerUsage", "gpu": 0, "error": "NotSupported"}],
        }
    )
    for _ in range(3):
        snap = _after(source, clock, 15)
    assert snap.gpus[0].power_w is None and snap.gpus[1].power_w is not None
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 + 3  # GPU 0 once, GPU 1 every cycle
    assert snap.errors == {}


def test_old_drivers_fall_back_to_memory_v1_and_the_legacy_temperature_call() -> None:
    source, fake, clock = _source(
        {
            "gpus": [{"model": "H100"}],
            "errors": [
                {"function": "nvmlDeviceGetMemoryInfo_v2", "error": "FunctionNotFound"},
                {"function": "nvmlDeviceGetTemperatureV", "error": "FunctionNotFound"},
            ],
        }
    )
    snap = _after(source, clock, 15)
    gpu = snap.gpus[0]
    assert gpu.memory is not None and gpu.memory.reserved is None and gpu.memory.total > 0
    assert gpu.temperature_c is not None
    assert fake.calls["nvmlDeviceGetTemperature"] == 1


def test_other_nvml_errors_are_counted_and_the_cycle_goes_on() -> None:
    source, _, clock = _source(
        {"gpus": [{"model": "H100"}], "errors": [{"function": "nvmlDeviceGetClockInfo", "error": "Unknown"}]}
    )
    snap = _after(source, clock, 15)
    assert snap.errors == {"nvmlDeviceGetClockInfo": 2}
    assert snap.gpus[0].clock_sm_mhz is None and snap.gpus[0].power_w is not None
    assert _after(source, clock, 15).errors == {"nvmlDeviceGetClockInfo": 2}  # per cycle, not cumulative


def test_a_lost_gpu_is_unhealthy_the_others_go_on_and_nvml_is_reinitialised_later() -> None:
    source, fake, clock = _source(
        {
            "gpus": [{"model": "H100", "count": 3}],
            "processes": [{"pid": 9, "gpu": 1, "sm": 50}],
            "errors": [{"function": "*", "gpu": 1, "error": "GpuIsLost", "from": 20, "until": 50}],
        },
        reinit_after=60.0,
    )
    assert all(g.healthy for g in _after(source, clock, 15).gpus)
    snap = _after(source, clock, 15)  # t=30: GPU 1 falls off the bus
    assert [g.healthy for g in snap.gpus] == [True, False, True]
    assert snap.gpus[1].utilization is None and snap.gpus[0].temperature_c is not None
    calls = dict(fake.calls)
    snap = _after(source, clock, 30)  # t=60: still before the re-init; the lost handle is not queried
    assert not snap.gpus[1].healthy and fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetMigMode"] - calls["nvmlDeviceGetMigMode"] == 2
    snap = _after(source, clock, 30)  # t=90: re-initialised, the GPU is back
    assert fake.calls["nvmlInit"] == 2 and fake.calls["nvmlShutdown"] == 1
    assert all(g.healthy for g in snap.gpus) and snap.gpus[1].utilization == pytest.approx(50)


def test_process_utilization_not_found_means_zero_and_a_missing_pid_is_zero() -> None:
    source, _, clock = _source(
        {
            "gpus": [{"model": "H100", "count": 2}],
            "processes": [
                {"pid": 9, "gpu": 0, "sm": 50},
                {"pid": 10, "gpu": 1, "sm": 40},
                {"pid": 11, "gpu": 1, "workload": "idle-held"},
            ],
            "errors": [{"function": "nvmlDeviceGetProcessUtilization", "gpu": 0, "error": "NotFound"}],
        }
    )
    snap = _after(source, clock, 15)
    assert [(p.pid, p.sm_util) for p in snap.gpus[0].processes] == [(9, 0.0)]
    assert {p.pid: p.sm_util for p in snap.gpus[1].processes} == {10: 40.0, 11: 0.0}
    assert snap.errors == {}


def test_processes_with_unknown_memory_are_reported_as_none() -> None:
    source, _, clock = _source(
        {"gpus": [{"model": "H100"}], "processes": [{"pid": 9, "gpu": 0, "memory_unavailable": True}]}
    )
    (proc,) = _after(source, clock, 15).gpus[0].processes
    assert proc.used_memory is None


def test_mig_slices_are_read_through_their_handles_with_gpm_from_two_samples() -> None:
    source, _, clock = _source(
        {
            "gpus": [{"model": "H100", "mig": {"profile": "1g.10gb", "count": 7}}],
            "processes": [{"pid": 9, "gpu": 0, "mig": 2, "memory_mib": 3000, "sm": 70}],
        }
    )
    first = _after(source, clock, 15).gpus[0]
    assert first.mig_enabled and len(first.migs) == 7 and first.utilization is None and first.processes == []
    assert all(m.activity is None for m in first.migs)  # one GPM sample so far
    second = _after(source, clock, 15).gpus[0]
    slice2 = second.migs[2]
    assert slice2.profile == "1g.10gb" and slice2.gpu_instance_id == 3 and slice2.uuid.startswith("MIG-")
    assert [(p.pid, p.used_memory, p.sm_util) for p in slice2.processes] == [(9, 3000 << 20, None)]
    assert slice2.activity is not None and slice2.activity["graphics"] == pytest.approx(70)
    assert second.migs[0].activity == {"graphics": 0.0, "sm": 0.0, "sm_occupancy": 0.0, "dram": 0.0}
    assert second.power_w is not None


def test_no_gpm_on_a100_means_no_activity() -> None:
    source, fake, clock = _source({"gpus": [{"model": "A100", "mig": {"profile": "1g.10gb", "count": 7}}]})
    _after(source, clock, 15)
    assert all(m.activity is None for m in _after(source, clock, 15).gpus[0].migs)
    assert "nvmlGpmMigSampleGet" not in fake.calls


def test_xid_events_are_attached_to_their_gpu_and_a_full_queue_counts_drops() -> None:
    source, _, clock = _source(
        {
            "gpus": [{"model": "H100", "count": 2}],
            "xid_events": [
                {"gpu": 1, "xid": 13, "at": 1},
                {"gpu": 1, "xid": 48, "at": 2},
                {"gpu": 0, "xid": 79, "at": 3},
            ],
        },
        event_queue_size=2,
    )
    snap = _after(source, clock, 15)
    assert snap.gpus[1].xids == [13, 48] and snap.gpus[0].xids == []
    assert snap.events_dropped == 1
    assert _after(source, clock, 15).gpus[0].xids == []


def test_the_xid_thread_collects_events_in_the_background() -> None:
    source, _, clock = _source(
        {"gpus": [{"model": "H100"}], "xid_events": [{"gpu": 0, "xid": 31, "at": 1}]},
        xid_mode="thread",
        event_wait_ms=20,
    )
    try:
        clock.now += 2
        deadline = time.monotonic() + 5
        xids: list[int] = []
        while not xids and time.monotonic() < deadline:
            time.sleep(0.02)
            xids = source.snapshot().gpus[0].xids
        assert xids == [31]
    finally:
        source.close()


def test_no_library_is_a_clear_error() -> None:
    fake = FakeNvml(topology_from_dict({"gpus": [{"model": "H100"}], "library_missing": True}))
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1"):
        NvmlSource(fake).start()


def test_the_real_pynvml_without_a_driver_is_a_clear_error() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable):
        NvmlSource().start()


def test_close_frees_gpm_samples_and_shuts_nvml_down() -> None:
    source, fake, clock = _source({"gpus": [{"model": "H100", "mig": {"profile": "1g.10gb", "count": 2}}]})
    _after(source, clock, 15)
    source.close()
    assert fake.calls["nvmlGpmSampleFree"] == 4 and fake.calls["nvmlShutdown"] == 1
    assert fake.calls["nvmlEventSetFree"] == 1


def test_a_process_with_several_contexts_is_one_sample_with_their_memory_summed() -> None:
    data = {"gpus": [{"model": "H100"}], "processes": [{"pid": 9, "gpu": 0, "sm": 40}, {"pid": 10, "gpu": 0}]}
    source, fake, clock = _source(data)
    listed = fake.nvmlDeviceGetComputeRunningProcesses

    def twice(handle: Any) -> list[Any]:
        # NVML lists a process once per context; the second context of pid 9 holds no memory it can report.
        procs = listed(handle)
        first = next(p for p in procs if p.pid == 9)
        extra = pynvml.nvmlFriendlyObject({**vars(first), "usedGpuMemory": 1 << 20})
        unknown = pynvml.nvmlFriendlyObject({**vars(first), "usedGpuMemory": None})
        return [*procs, extra, unknown]

    single = {p.pid: p.used_memory for p in _after(source, clock, 15).gpus[0].processes}
    fake.nvmlDeviceGetComputeRunningProcesses = twice  # type: ignore[method-assign]
    samples = _after(source, clock, 15).gpus[0].processes
    assert [p.pid for p in samples] == [9, 10]
    assert samples[0].used_memory == single[9] + (1 << 20) and samples[1].used_memory == single[10]
    assert samples[0].sm_util == 40.0 and samples[1].sm_util is not None


def test_process_means_average_only_the_samples_newer_than_the_last_read() -> None:
    sample = pynvml.c_nvmlProcessUtilizationSample_t
    fresh = [sample(pid=7, timeStamp=1010, smUtil=30), sample(pid=8, timeStamp=1020, smUtil=5)]
    fresh.append(sample(pid=7, timeStamp=1030, smUtil=61))
    assert process_means(fresh, 1000) == (1030, {7: 45.5, 8: 5.0})
    stale = [sample(pid=7, timeStamp=990, smUtil=100), sample(pid=9, timeStamp=1000, smUtil=100)]
    assert process_means([*stale, *fresh], 1000) == (1030, {7: 45.5, 8: 5.0})
    assert process_means(stale, 1000) == (1000, {})
    assert process_means([], 1000) == (1000, {})


_COUNTERS = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows")


def test_energy_ecc_and_remapped_rows_come_from_one_field_values_call_per_gpu() -> None:
    data = {"gpus": [{"model": "H100", "count": 2, "ecc_uncorrected": 2, "remapped_rows": [4, 1, 0, 1]}]}
    source, fake, clock = _source(data)
    _after(source, clock, 15)
    snap = _after(source, clock, 15)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 4
    assert all(fake.calls.get(name, 0) == 0 for name in _COUNTERS)
    # The same values the single calls give.
    reference, _, ref_clock = _source(
        {**data, "errors": [{"function": "nvmlDeviceGetFieldValues", "error": "FunctionNotFound"}]}
    )
    _after(reference, ref_clock, 15)
    expected = _after(reference, ref_clock, 15)
    for got, want in zip(snap.gpus, expected.gpus, strict=True):
        assert (got.energy_j, got.ecc_uncorrected, got.remapped_rows) == (want.energy_j, 2, (4, 1, 0, 1))
        assert got.energy_j == want.energy_j and got.energy_j is not None


def test_a_driver_without_field_values_reads_each_counter_by_its_own_call() -> None:
    source, fake, clock = _source(
        {
            "gpus": [{"model": "H100"}],
            "errors": [{"function": "nvmlDeviceGetFieldValues", "error": "FunctionNotFound"}],
        }
    )
    for _ in range(3):
        snap = _after(source, clock, 15)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # probed once, then off
    assert [fake.calls[name] for name in _COUNTERS] == [3, 3, 3]
    assert snap.gpus[0].energy_j is not None and snap.gpus[0].remapped_rows == (0, 0, 0, 0)
    assert snap.errors == {}


def test_a_field_that_does_not_answer_is_read_by_its_own_call_which_decides_as_before() -> None:
    source, fake, clock = _source(
        {
            "gpus": [{"model": "H100", "count": 2}],
            "errors": [
                {"function": "nvmlDeviceGetRemappedRows", "gpu": 0, "error": "NotSupported"},
                {"function": "nvmlDeviceGetTotalEccErrors", "gpu": 1, "error": "Unknown"},
            ],
        }
    )
    for _ in range(3):
        snap = _after(source, clock, 15)
    assert snap.gpus[0].remapped_rows is None and snap.gpus[1].remapped_rows == (0, 0, 0, 0)
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 1  # GPU 0's own call said NotSupported once: off
    assert snap.gpus[1].ecc_uncorrected is None and snap.gpus[0].ecc_uncorrected == 0
    assert snap.errors == {"nvmlDeviceGetTotalEccErrors": 1}  # counted each cycle, as the single call always was
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 3


def test_process_means_of_one_sample_per_process_are_those_samples_as_floats() -> None:
    sample = pynvml.c_nvmlProcessUtilizationSample_t
    samples = [sample(pid=7, timeStamp=1010, smUtil=30), sample(pid=8, timeStamp=1020, smUtil=0)]
    stamp, means = process_means(samples, 1000)
    assert (stamp, means) == (1020, {7: 30.0, 8: 0.0})
    assert all(type(v) is float for v in means.values())
