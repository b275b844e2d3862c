"""The real agent wired to a fake NVML and generated host files: `gpufarm-node --fake`, simulations, benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpufarm_node.agent import Agent
from gpufarm_node.attribution import Attributor, DeviceOwners, PodMetadataFile, PodResourcesOwners, ProcFs
from gpufarm_node.collect import CollectOptions
from gpufarm_node.fake_host import CLK_TCK, FakeHost
from gpufarm_node.fake_nvml import FakeNvml
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.nvml.source import NvmlSource
from gpufarm_node.registration import HostRegistrar
from gpufarm_node.sender import Sender
from gpufarm_node.squatter_stops import ProcessStarts, SquatterStopper
from gpufarm_node.topology_spec import Topology


@dataclass
class FakeNode:
    """A fake GPU host and the agent reading it."""

    fake: FakeNvml
    host: FakeHost
    source: NvmlSource
    attributor: Attributor
    agent: Agent


def fake_node(
    topology: Topology,
    workdir: str | Path,
    sender: Sender,
    *,
    hostname: str,
    environment: str = "default",
    cluster: str = "default",
    clock: Callable[[], float] = time.time,
    options: CollectOptions | None = None,
    owners: DeviceOwners | None = None,
    registrar: HostRegistrar | None = None,
    host_tags: HostTagWatch | None = None,
    xid_mode: Literal["thread", "poll", "off"] = "poll",
    pcie: bool = False,
    interval: float = 15.0,
    flush_interval: float = 0.0,
    event_queue_size: int = 1000,
    reinit_after: float = 60.0,
    squatter_kill: Callable[[int, int], None] | None = None,
) -> FakeNode:
    """Build (not start) an agent on a fake host under `workdir`.

    Device owners default to the topology's pods through a kubelet-like pod-resources listing joined with the
    generated pod list, so the Kubernetes attribution path runs as on a real node. `squatter_kill`: the agent
    carries out the stops of the host's tags (gpufarm_node.squatter_stops) through it, reading the fake /proc.
    """
    fake = FakeNvml(topology, clock=clock)
    host = FakeHost(fake, workdir)
    pods = PodMetadataFile(host.pods_file, check_every=0.0) if topology.pods else None
    if owners is None and topology.pods:
        owners = PodResourcesOwners(host.pod_resources, pods, refresh_every=0.0)
    source = NvmlSource(
        fake,
        clock=clock,
        interval=interval,
        pcie=pcie,
        xid_mode=xid_mode,
        event_queue_size=event_queue_size,
        reinit_after=reinit_after,
    )
    attributor = Attributor(ProcFs(host.proc_root), pods=pods, owners=owners)
    agent = Agent(
        source,
        attributor,
        sender,
        hostname=hostname,
        environment=environment,
        cluster=cluster,
        options=options,
        registrar=registrar,
        clock=clock,
        flush_interval=flush_interval,
        host_tags=host_tags,
        squatter_stops=(
            SquatterStopper(ProcessStarts(str(host.proc_root), ticks=CLK_TCK), kill=squatter_kill)
            if squatter_kill is not None
            else None
        ),
    )
    return FakeNode(fake, host, source, attributor, agent)
