"""Simulated GPU nodes: the real agent on fake NVML, one per host, pushing to a Datadog URL (the sandbox).

    farm = start_simulated_farm(12, sandbox_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, clock=sandbox.clock.now)
    farm.assign("gpu-slc-002", 1300, gpus=["0/0", "0/1"])   # IR-1300 on two MIG slices
    farm.step_all()                                         # one synchronous cycle on every node
    farm.stop()

Nodes are spread over the three pools of config/farm.example.yaml, so the lifecycle can allocate them: a cloud pool
(cloud-aws, 8 x H100), an HPC pool (onprem-hpc, 8 x H100) and a slicing pool (shared-slices, 2 x A100 each in MIG
7 x 1g.10gb), with workload profiles busy, idle, idle-held
and unattributed. An assignment plays the part kubelet's pod-resources plays on a Kubernetes node (the device
belongs to the IR) and restarts the device's processes with GPUFARM_IR set, as a researcher's job would be.
Time comes from `clock` (the sandbox's virtual clock), so fake samples and point timestamps follow it.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufarm.core.kernel.ir import ir_tag_value, parse_ir
from gpufarm_node.agent import Agent, CycleReport
from gpufarm_node.attribution import DeviceOwner, StaticOwners
from gpufarm_node.collect import CollectOptions
from gpufarm_node.datadog import DatadogTarget, api_client, tags_api
from gpufarm_node.fake_nvml import FakeHost, FakeNvml
from gpufarm_node.fakenode import fake_node
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.registration import HostRegistrar
from gpufarm_node.sender import DatadogSender, SeriesIntake
from gpufarm_node.topology import (
    ProcessSpec,
    TopologyError,
    container_id,
    device_memory_mib,
    parse_device,
    topology_from_dict,
    workload_profiles,
)

log = logging.getLogger("gpufarm_sandbox.simfarm")

PROFILES = ("busy", "idle", "idle-held", "unattributed")
MAX_NODES = 2000


@dataclass(frozen=True)
class HostSpec:
    """One simulated host: where it sits in the farm, its GPUs, and its starting workload profile."""

    hostname: str
    environment: str
    cluster: str
    model: str
    gpus: int
    mig_profile: str | None = None
    mig_count: int = 0
    profile: str = "idle"


@dataclass(frozen=True)
class Pool:
    """A kind of simulated node."""

    prefix: str
    environment: str
    cluster: str
    model: str
    gpus: int
    mig_profile: str | None = None
    mig_count: int = 0

    def host(self, number: int, profile: str) -> HostSpec:
        """The pool's `number`th host."""
        return HostSpec(
            f"{self.prefix}-{number:03d}",
            self.environment,
            self.cluster,
            self.model,
            self.gpus,
            self.mig_profile,
            self.mig_count,
            profile,
        )


POOLS = (
    Pool("gpu-aws", "cloud-aws", "aws-use1", "H100", 8),
    Pool("gpu-hpc", "onprem-hpc", "hpc-a", "H100", 8),
    Pool("gpu-slc", "shared-slices", "k8s-shared", "A100", 2, "1g.10gb", 7),
)


class SimulatedStops:
    """How a simulated host's agent stops a squatter (gpufarm_node.squatter_stops): a real process the simulation
    put on a device (`SimulatedFarm.squat`) gets the signal; any other pid is the fake's alone and only ends there,
    so a stop never reaches a process of the machine the simulation runs on."""

    def __init__(self) -> None:
        self.fake: FakeNvml | None = None
        self.real: set[int] = set()
        self.signalled: list[int] = []

    def __call__(self, pid: int, sig: int) -> None:
        if pid in self.real:
            os.kill(pid, sig)
        self.signalled.append(pid)
        if self.fake is not None:
            self.fake.end_process(pid)


@dataclass
class SimulatedNode:
    """One simulated host: its fake GPUs and host files, and the real agent reading them."""

    spec: HostSpec
    fake: FakeNvml
    host: FakeHost
    owners: StaticOwners
    agent: Agent
    rng: random.Random
    # (gpu, mig slot) -> IR tag value
    assignments: dict[tuple[int, int | None], str] = field(default_factory=dict)
    profiles: dict[tuple[int, int | None], str] = field(default_factory=dict)
    stops: SimulatedStops = field(default_factory=SimulatedStops)
    _next_pid: int = 10_000

    @property
    def hostname(self) -> str:
        """The host name it reports as."""
        return self.spec.hostname

    @property
    def environment(self) -> str:
        """The node's environment tag value."""
        return self.spec.environment

    def devices(self) -> list[tuple[int, int | None]]:
        """(gpu, slot) of every schedulable device: whole GPUs, or the slices of MIG GPUs."""
        out: list[tuple[int, int | None]] = []
        for gpu in self.fake.topology.gpus:
            if gpu.mig is None:
                out.append((gpu.index, None))
            else:
                out.extend((gpu.index, slot) for slot in range(len(gpu.mig)))
        return out

    def device_uuid(self, device: tuple[int, int | None]) -> str:
        """NVML UUID of a device."""
        gpu = self.fake.gpu_spec(device[0])
        return gpu.uuid if device[1] is None else gpu.mig_uuids[device[1]]

    def resolve(self, gpus: Sequence[int | str] | None) -> list[tuple[int, int | None]]:
        """Devices named by GPU index (a MIG GPU means all its slices) or `gpu/slot`; None means all."""
        if gpus is None:
            return self.devices()
        out: list[tuple[int, int | None]] = []
        specs = self.fake.topology.gpus
        for item in gpus:
            try:
                gpu, slot = parse_device(item, f"{self.hostname} device", specs)
            except TopologyError as exc:
                raise ValueError(str(exc)) from exc
            if slot is None and specs[gpu].mig is not None:
                out.extend((gpu, s) for s in range(len(specs[gpu].mig or ())))
            else:
                out.append((gpu, slot))
        return out

    def restart(self, device: tuple[int, int | None]) -> None:
        """Replace the device's processes with what its profile and assignment call for."""
        gpu_index, slot = device
        fake = self.fake
        for proc in fake.alive():
            if (proc.gpu, proc.mig) == device:
                fake.end_process(proc.pid)
        profile = self.profiles.get(device, self.spec.profile)
        if profile == "idle":
            return
        workload = "idle-held" if profile == "idle-held" else "busy"
        memory, sm = workload_profiles(workload, device_memory_mib(fake.gpu_spec(gpu_index), slot))
        if sm.kind == "square":
            sm = replace(sm, phase=self.rng.uniform(0, sm.period))
        ir = self.assignments.get(device)
        env = {"GPUFARM_IR": ir.upper()} if ir and profile != "unattributed" else {}
        self._next_pid += 1
        fake.add_process(
            ProcessSpec(
                pid=self._next_pid,
                gpu=gpu_index,
                mig=slot,
                memory_mib=memory,
                sm=sm,
                start=fake.now(),
                env=env,
                # One container per job (IR) on the host, as a researcher's container would hold its GPUs.
                docker=container_id(f"{self.hostname}/{ir or 'unattributed'}"),
            )
        )


class SimulatedFarm:
    """A set of simulated nodes; cycles run in a background thread and/or synchronously through `step_all`."""

    def __init__(
        self, nodes: list[SimulatedNode], *, interval: float, workdir: Path, cleanup: bool, client: Any = None
    ) -> None:
        self.nodes = nodes
        self._client = client
        self.interval = interval
        self._by_host = {n.hostname: n for n in nodes}
        self._workdir = workdir
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # datadog-api-client keeps 4 connections per host; more workers would only churn connections.
        self._pool = ThreadPoolExecutor(max_workers=min(4, max(1, len(nodes))), thread_name_prefix="simnode")

    def node(self, hostname: str) -> SimulatedNode:
        """A node by host name."""
        try:
            return self._by_host[hostname]
        except KeyError:
            raise ValueError(f"no simulated host {hostname!r}") from None

    @property
    def hosts(self) -> list[str]:
        """Host names, in creation order."""
        return [n.hostname for n in self.nodes]

    def assign(self, hostname: str, ir: int | str, gpus: Sequence[int | str] | None = None) -> list[str]:
        """Give devices (default: the whole host) to an IR; returns the device UUIDs assigned."""
        node = self.node(hostname)
        value = ir_tag_value(parse_ir(str(ir)) if isinstance(ir, str) else ir)
        with self._lock:
            devices = node.resolve(gpus)
            for device in devices:
                node.assignments[device] = value
                node.owners.set(node.device_uuid(device), DeviceOwner(ir=value))
                node.restart(device)
        return [node.device_uuid(d) for d in devices]

    def release(self, hostname: str, gpus: Sequence[int | str] | None = None) -> None:
        """Take devices (default: all) away from their IRs."""
        node = self.node(hostname)
        with self._lock:
            for device in node.resolve(gpus):
                node.assignments.pop(device, None)
                node.owners.set(node.device_uuid(device), None)
                node.restart(device)

    def set_profile(self, hostname: str, profile: str, gpus: Sequence[int | str] | None = None) -> None:
        """Change the workload on devices (default: all): busy, idle, idle-held or unattributed."""
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}")
        node = self.node(hostname)
        with self._lock:
            for device in node.resolve(gpus):
                node.profiles[device] = profile
                node.restart(device)

    def squat(self, hostname: str, device: int | str, pid: int, claims: str | None = None) -> str:
        """Put a real process (`pid`, started by the caller) on a device as a busy job claiming `claims` (an IR, or
        none); the agent finds it a squatter where that is not the device's lease, and a stop gpufarm publishes
        for it reaches the real process. Returns the device's UUID."""
        node = self.node(hostname)
        with self._lock:
            (gpu_index, slot) = node.resolve([device])[0]
            fake = node.fake
            memory, sm = workload_profiles("busy", device_memory_mib(fake.gpu_spec(gpu_index), slot))
            env = {"GPUFARM_IR": claims} if claims else {}
            fake.add_process(
                ProcessSpec(pid=pid, gpu=gpu_index, mig=slot, memory_mib=memory, sm=sm, start=fake.now(), env=env)
            )
            node.stops.real.add(pid)
        return node.device_uuid((gpu_index, slot))

    def step_all(self, now: float | None = None) -> list[CycleReport]:
        """One synchronous cycle on every node (each flushes to Datadog); `now` defaults to each node's clock."""
        with self._lock:
            return list(self._pool.map(lambda n: n.agent.cycle(now), self.nodes))

    def start(self) -> SimulatedFarm:
        """Cycle every `interval` real seconds in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="simfarm", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step_all()
            except Exception:
                # The simulation keeps going when one step fails (a sandbox restart, a fault being injected).
                log.exception("simulated farm step failed")

    def stop(self) -> None:
        """Stop cycling, close every agent and remove the fake host files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval))
        self._pool.shutdown(wait=True)
        for node in self.nodes:
            try:
                node.agent.close()
            except Exception:  # closing the rest matters more than one failure
                log.exception("closing %s failed", node.hostname)
        if self._client is not None:
            self._client.close()
        if self._cleanup:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> SimulatedFarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulated_farm(
    n: int,
    datadog_url: str,
    api_key: str,
    app_key: str,
    *,
    interval: float = 15.0,
    clock: Callable[[], float] | None = None,
    seed: int = 0,
    background: bool = True,
    register: bool = True,
    per_process: bool = False,
    workdir: str | Path | None = None,
) -> SimulatedFarm:
    """Start `n` nodes spread over the cloud, HPC and slicing pools and the four workload profiles."""
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"n must be between 1 and {MAX_NODES}")
    specs = []
    for i in range(n):
        pool = POOLS[i % len(POOLS)]
        # 3 pools x 4 profiles: every combination appears once in any 12 consecutive nodes.
        specs.append(pool.host(i + 1, PROFILES[(i + seed) % len(PROFILES)]))
    return simulate_hosts(
        specs,
        datadog_url,
        api_key,
        app_key,
        interval=interval,
        clock=clock,
        seed=seed,
        background=background,
        register=register,
        per_process=per_process,
        workdir=workdir,
    )


def simulate_hosts(
    hosts: Sequence[HostSpec],
    datadog_url: str,
    api_key: str,
    app_key: str,
    *,
    interval: float = 15.0,
    clock: Callable[[], float] | None = None,
    seed: int = 0,
    background: bool = True,
    register: bool = True,
    per_process: bool = False,
    workdir: str | Path | None = None,
) -> SimulatedFarm:
    """Simulate exactly these hosts (e.g. the ones an allocation stage tagged)."""
    if not 1 <= len(hosts) <= MAX_NODES:
        raise ValueError(f"between 1 and {MAX_NODES} hosts")
    if len({h.hostname for h in hosts}) != len(hosts):
        raise ValueError("host names must be unique")
    for spec in hosts:
        if spec.profile not in PROFILES:
            raise ValueError(f"{spec.hostname}: profile must be one of {', '.join(PROFILES)}")
    if not datadog_url.startswith(("http://", "https://")):
        raise ValueError("datadog_url must be an http(s) URL")
    if interval <= 0:
        raise ValueError("interval must be positive")
    clock = clock or time.time
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpufarm-simfarm-"))
    # One client (one connection pool) for all nodes; few retries so a failing sandbox does not stall steps.
    client = api_client(DatadogTarget(datadog_url.rstrip("/"), api_key, app_key), read_timeout=10.0, max_retries=1)
    rng = random.Random(seed)  # noqa: S311 - simulated workloads, not secrets
    nodes: list[SimulatedNode] = []
    try:
        for spec in hosts:
            node_rng = random.Random(rng.random())  # noqa: S311
            nodes.append(
                _make_node(
                    spec,
                    client=client,
                    root=root,
                    clock=clock,
                    rng=node_rng,
                    register=register,
                    per_process=per_process,
                )
            )
    except Exception:
        for node in nodes:
            node.agent.close()
        client.close()
        shutil.rmtree(root, ignore_errors=True)
        raise
    farm = SimulatedFarm(nodes, interval=interval, workdir=root, cleanup=workdir is None, client=client)
    return farm.start() if background else farm


def _make_node(
    spec: HostSpec,
    *,
    client: Any,
    root: Path,
    clock: Callable[[], float],
    rng: random.Random,
    register: bool,
    per_process: bool,
) -> SimulatedNode:
    gpu: dict[str, Any] = {"model": spec.model, "count": spec.gpus}
    if spec.mig_profile:
        gpu["mig"] = {"profile": spec.mig_profile, "count": spec.mig_count}
    try:
        topology = topology_from_dict({"name": spec.hostname, "gpus": [gpu]}, seed=spec.hostname)
    except TopologyError as exc:
        raise ValueError(f"{spec.hostname}: {exc}") from exc
    owners = StaticOwners()
    registrar = host_tags = None
    if register:
        registrar = HostRegistrar(tags_api(client), spec.hostname, spec.environment, spec.cluster)
        # As on a real node: the host's tags read every cycle, so an allocator's gpu_assign tag is seen next cycle.
        host_tags = HostTagWatch.from_client(client, spec.hostname)
    stops = SimulatedStops()
    built = fake_node(
        topology,
        root / spec.hostname,
        DatadogSender(SeriesIntake(client), spec.hostname, clock=clock),
        hostname=spec.hostname,
        environment=spec.environment,
        cluster=spec.cluster,
        clock=clock,
        options=CollectOptions(per_process=per_process),
        owners=owners,
        registrar=registrar,
        host_tags=host_tags,
        squatter_kill=stops,
    )
    stops.fake = built.fake
    node = SimulatedNode(spec, built.fake, built.host, owners, built.agent, rng, stops=stops)
    for device in node.devices():
        node.restart(device)
    built.agent.start()
    return node


def local_nodes_hook(
    n: int, *, interval: float = 15.0, seed: int = 0, per_process: bool = False
) -> Callable[[Any], Callable[[], None]]:
    """A `gpufarm local` hook: `n` background nodes on the local sandbox, following its clock; returns their stop.

    For `gpufarm local --nodes N`: `hooks.append(local_nodes_hook(N))` (the env needs `.url` and `.sandbox`).
    """
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"--nodes must be between 1 and {MAX_NODES}")

    def hook(env: Any) -> Callable[[], None]:
        from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY

        farm = start_simulated_farm(
            n,
            env.url,
            DEFAULT_DD_API_KEY,
            DEFAULT_DD_APP_KEY,
            interval=interval,
            clock=env.sandbox.clock.now,
            seed=seed,
            per_process=per_process,
        )
        log.info("%d simulated GPU nodes: %s", n, ", ".join(farm.hosts))
        return farm.stop

    return hook
