"""The Datadog Agent's GPU check, as the sandbox plays it: `gpu.*` series shaped like the Agent's, for tests and demos
of environments whose `metrics_source` is `datadog-agent` (gpufarm.core.config.farm.MetricsSource).

The Agent's GPU core check (metric prefix `gpu.`) reports per device, tagged with the device tagset (`gpu_uuid`,
`gpu_device`, `gpu_vendor`, `gpu_driver_version`, `gpu_virtualization_mode`, `gpu_architecture`,
`gpu_slicing_mode`, `gpu_type`), and per process while one runs (`pid`). It knows nothing of gpufarm: the lease
reaches its series through the host's tags, which Datadog stamps on every point the host sends (the `ir:` tag
gpufarm writes on allocation, `gpufarm:managed`, `environment`, `team`), exactly as the sandbox's intake does. So
the emitter sends only what the Agent sends, with the host as the series' resource, through the public series
API (`POST /api/v2/series`) with an API key, as the Agent's forwarder does.

`METRICS` declares what is sent and with which tags; tests check that the idle monitors for the `datadog-agent`
source query only these (gpufarm.setup.monitors). Values: `sm_active` is the percent of time the SMs were active;
memory in bytes; a process's series exist only while it runs, as on the Agent (its workload-only metrics).
"""

from __future__ import annotations

import json
import urllib.request
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GAUGE = 3  # the v2 series API's metric type for a gauge
DEVICE_TAGS = (
    "gpu_uuid",
    "gpu_device",
    "gpu_vendor",
    "gpu_driver_version",
    "gpu_virtualization_mode",
    "gpu_architecture",
    "gpu_slicing_mode",
    "gpu_type",
)
PROCESS_TAGS = ("pid",)


@dataclass(frozen=True)
class AgentMetric:
    """One metric of the Agent's GPU check: its unit and the tag keys its series carry."""

    unit: str
    tags: tuple[str, ...]


METRICS: Mapping[str, AgentMetric] = {
    "gpu.sm_active": AgentMetric("percent", DEVICE_TAGS),
    "gpu.memory.limit": AgentMetric("byte", DEVICE_TAGS),
    "gpu.memory.free": AgentMetric("byte", DEVICE_TAGS),
    "gpu.core.limit": AgentMetric("core", DEVICE_TAGS),
    "gpu.device.total": AgentMetric("", DEVICE_TAGS),
    "gpu.process.sm_active": AgentMetric("percent", DEVICE_TAGS + PROCESS_TAGS),
    "gpu.process.memory.usage": AgentMetric("byte", DEVICE_TAGS + PROCESS_TAGS),
}

# What the check reports for the models the example farm offers: (gpu_device, architecture, memory, SM cores).
MODELS: Mapping[str, tuple[str, str, int, int]] = {
    "H100": ("nvidia_h100_80gb_hbm3", "hopper", 80 * 2**30, 16896),
    "A100": ("nvidia_a100_sxm4_80gb", "ampere", 80 * 2**30, 6912),
    "L4": ("nvidia_l4", "ada", 24 * 2**30, 7424),
}
DRIVER_VERSION = "550.54.15"


@dataclass(frozen=True)
class Activity:
    """What one GPU does during a stretch of time: SM activity (percent) and the processes on it (pid, bytes)."""

    sm_active: float = 0.0
    processes: tuple[tuple[int, int], ...] = ()

    @classmethod
    def busy(cls, percent: float = 88.0, pid: int = 4242, memory: int = 60 * 2**30) -> Activity:
        """A training job: one process holding memory and keeping the SMs busy."""
        return cls(percent, ((pid, memory),))

    @classmethod
    def held(cls, pid: int = 4242, memory: int = 60 * 2**30) -> Activity:
        """A process alive and holding memory, its SMs doing nothing."""
        return cls(0.0, ((pid, memory),))


IDLE = Activity()


@dataclass(frozen=True)
class AgentGpu:
    """One device as the check names it."""

    index: int
    uuid: str
    model: str

    @property
    def tags(self) -> tuple[str, ...]:
        """The device tagset, as the check writes it (lowercase values)."""
        device, arch, _, _ = MODELS[self.model]
        return (
            f"gpu_uuid:{self.uuid}",
            f"gpu_device:{device}",
            "gpu_vendor:nvidia",
            f"gpu_driver_version:{DRIVER_VERSION}",
            "gpu_virtualization_mode:none",
            f"gpu_architecture:{arch}",
            "gpu_slicing_mode:none",
            f"gpu_type:{self.model.lower()}",
        )


def device_uuid(host: str, index: int) -> str:
    """A stable, well-formed GPU UUID for a host's device (the check lowercases them: `gpu-xxxxxxxx-...`)."""
    return f"gpu-{zlib.crc32(host.encode()):08x}-0000-4000-8000-{index:012x}"


@dataclass
class AgentGpuCheck:
    """The GPU check of one host's Datadog Agent."""

    host: str
    model: str
    count: int = 8
    gpus: list[AgentGpu] = field(init=False)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"no Agent GPU check profile for model {self.model!r}; known: {', '.join(MODELS)}")
        self.gpus = [AgentGpu(i, device_uuid(self.host, i), self.model) for i in range(self.count)]

    def series(self, activity: Activity | Mapping[int, Activity], stamps: Iterable[int]) -> list[dict[str, Any]]:
        """The v2 series one check run per stamp sends: every device's gauges, each running process's series.

        `activity` is one Activity for every device or one per device index (devices left out are idle).
        """
        times = list(stamps)
        out: list[dict[str, Any]] = []
        for gpu in self.gpus:
            act = activity if isinstance(activity, Activity) else activity.get(gpu.index, IDLE)
            _, _, memory, cores = MODELS[gpu.model]
            used = min(memory, sum(m for _, m in act.processes))
            device = {
                "gpu.sm_active": act.sm_active,
                "gpu.memory.limit": float(memory),
                "gpu.memory.free": float(memory - used),
                "gpu.core.limit": float(cores),
                "gpu.device.total": 1.0,
            }
            out += [self._gauge(name, value, gpu.tags, times) for name, value in device.items()]
            share = act.sm_active / len(act.processes) if act.processes else 0.0
            for pid, bytes_held in act.processes:
                tags = (*gpu.tags, f"pid:{pid}")
                out.append(self._gauge("gpu.process.sm_active", share, tags, times))
                out.append(self._gauge("gpu.process.memory.usage", float(bytes_held), tags, times))
        return out

    def _gauge(self, metric: str, value: float, tags: Sequence[str], stamps: Sequence[int]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "metric": metric,
            "type": GAUGE,
            "points": [{"timestamp": int(t), "value": value} for t in stamps],
            "tags": list(tags),
            "resources": [{"name": self.host, "type": "host"}],
        }
        if METRICS[metric].unit:
            body["unit"] = METRICS[metric].unit
        return body


def push(base_url: str, api_key: str, series: Sequence[Mapping[str, Any]], *, timeout: float = 30) -> None:
    """Send series to the Datadog intake at base_url (the sandbox), as the Agent's forwarder does."""
    request = urllib.request.Request(  # noqa: S310 - the sandbox's own http URL
        base_url.rstrip("/") + "/api/v2/series",
        data=json.dumps({"series": list(series)}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "DD-API-KEY": api_key},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        answer = json.loads(response.read() or b"{}")
    if answer.get("errors"):
        raise RuntimeError(f"the intake refused part of the series: {answer['errors'][:3]}")
