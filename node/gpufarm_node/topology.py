"""Topology files for the fake NVML: GPUs, MIG layouts, pods, processes with workload profiles, injected faults.

Times (`start`, `end`, `from`, `until`, `at`) are seconds after the fake starts. A topology is plain YAML:

    name: h100x8-mig
    gpus:
      - {model: H100, count: 7}
      - {model: H100, mig: {profile: 1g.10gb, count: 7}}
    pods:
      - {name: trainer-0, namespace: nlp, labels: {gpufarm.io/ir: IR-1201},
         containers: [{name: trainer, devices: ["0", "1"]}]}
    processes:
      - {pid: 4101, gpu: 0, pod: trainer-0, workload: busy}
      - {pid: 4301, gpu: 7, mig: 2, env: {GPUFARM_IR: IR-1300}, workload: idle-held}
    errors:
      - {function: nvmlDeviceGetPowerUsage, gpu: 3, error: NotSupported}
      - {function: "*", gpu: 5, error: GpuIsLost, from: 30, until: 120}
    xid_events:
      - {gpu: 1, xid: 79, at: 20}
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufarm_node.topology_spec import (
    ERROR_NAMES,
    MIG_PROFILE_RE,
    MODELS,
    ContainerSpec,
    ErrorSpec,
    GpuSpec,
    MigSlice,
    PodSpec,
    ProcessSpec,
    Profile,
    Topology,
    TopologyError,
    XidSpec,
    device_memory_mib,
    workload_profiles,
)

# What gpufarm_sandbox and the benchmarks import from here: the loaders, and the specs they build on.
__all__ = [
    "TOPOLOGY_DIR",
    "ProcessSpec",
    "Profile",
    "Topology",
    "TopologyError",
    "container_id",
    "device_memory_mib",
    "load_topology",
    "make_uuid",
    "packaged_topology",
    "parse_device",
    "topology_from_dict",
    "workload_profiles",
]

TOPOLOGY_DIR = Path(__file__).resolve().parent / "topologies"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- loading ---------------------------------------------------------------------------------------------


def load_topology(path: str | Path, *, seed: str = "") -> Topology:
    """Parse a topology YAML file; `seed` makes UUIDs unique per simulated host."""
    import yaml

    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text())
    except OSError as exc:
        raise TopologyError(f"cannot read topology {source}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source} is not valid YAML: {exc}") from exc
    return topology_from_dict(data, seed=seed or source.stem)


def packaged_topology(name: str) -> Path:
    """Path of a sample topology shipped with the package (e.g. `h100x8-mig`)."""
    path = TOPOLOGY_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml")))
        raise TopologyError(f"no packaged topology {name!r} (known: {known})")
    return path


def topology_from_dict(data: Any, *, seed: str = "") -> Topology:
    """Build and validate a topology from parsed YAML/JSON."""
    top = _mapping(data, "topology")
    name = _str(top.get("name", "fake"), "name")
    key = f"{seed}/{name}"
    gpus = _parse_gpus(top.get("gpus"), key)
    pods = tuple(_parse_pod(p, f"pods[{i}]", key, gpus) for i, p in enumerate(_list(top.get("pods", []), "pods")))
    pod_names = [p.name for p in pods]
    if len(set(pod_names)) != len(pod_names):
        raise TopologyError("pods: names must be unique")
    processes = tuple(
        _parse_process(p, f"processes[{i}]", gpus, pods)
        for i, p in enumerate(_list(top.get("processes", []), "processes"))
    )
    _check_pid_overlap(processes)
    errors = tuple(_parse_error(e, f"errors[{i}]", gpus) for i, e in enumerate(_list(top.get("errors", []), "errors")))
    xids = tuple(
        _parse_xid(x, f"xid_events[{i}]", gpus) for i, x in enumerate(_list(top.get("xid_events", []), "xid_events"))
    )
    period = _number(top.get("sample_period", 1.0), "sample_period", low=0.05, high=60.0)
    return Topology(
        name=name,
        gpus=gpus,
        processes=processes,
        pods=pods,
        errors=errors,
        xid_events=xids,
        driver_version=_str(top.get("driver_version", "550.90.07"), "driver_version"),
        sample_period=period,
        library_missing=bool(top.get("library_missing", False)),
    )


def make_uuid(key: str, prefix: str) -> str:
    """A deterministic NVML-style UUID (`GPU-…` / `MIG-…`) derived from `key`."""
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, 'gpufarm-fake/' + key)}"


def container_id(key: str) -> str:
    """A deterministic 64-hex container id."""
    return hashlib.sha256(key.encode()).hexdigest()


def parse_device(value: Any, where: str, gpus: Sequence[GpuSpec]) -> tuple[int, int | None]:
    """`3` or `"3"` is GPU 3; `"7/2"` is MIG slice 2 of GPU 7."""
    text = str(value)
    gpu_text, _, mig_text = text.partition("/")
    if not gpu_text.isdigit() or (mig_text and not mig_text.isdigit()):
        raise TopologyError(f"{where}: device {text!r} must look like 3 or 7/2")
    return _check_device(int(gpu_text), int(mig_text) if mig_text else None, where, gpus)


# -- parsers ---------------------------------------------------------------------------------------------


def _parse_gpus(value: Any, key: str) -> tuple[GpuSpec, ...]:
    entries = _list(value, "gpus")
    if not entries:
        raise TopologyError("gpus: at least one GPU is needed")
    gpus: list[GpuSpec] = []
    for i, raw in enumerate(entries):
        where = f"gpus[{i}]"
        entry = _mapping(raw, where)
        count = _int(entry.get("count", 1), f"{where}.count", low=1, high=64)
        for _ in range(count):
            gpus.append(_parse_gpu(entry, where, len(gpus), key))
    if len(gpus) > 64:
        raise TopologyError("gpus: at most 64 GPUs per node")
    return tuple(gpus)


def _parse_gpu(entry: Mapping[str, Any], where: str, index: int, key: str) -> GpuSpec:
    model = _str(entry.get("model", "H100"), f"{where}.model").upper()
    if model not in MODELS and "name" not in entry:
        raise TopologyError(f"{where}.model: unknown model {model!r}; give `name` and `memory_mib` for other GPUs")
    name, memory, limit, idle, sm_mhz, mem_mhz, gpm = MODELS.get(model, MODELS["H100"])
    gpu_uuid = make_uuid(f"{key}/gpu{index}", "GPU")
    if "uuid" in entry:
        gpu_uuid = _str(entry["uuid"], f"{where}.uuid")
        if not gpu_uuid.startswith("GPU-"):
            raise TopologyError(f"{where}.uuid must start with GPU-")
    mig = None
    mig_uuids: tuple[str, ...] = ()
    if entry.get("mig") is not None:
        mig = _parse_mig(entry["mig"], f"{where}.mig")
        mig_uuids = tuple(make_uuid(f"{key}/gpu{index}/mig{s}", "MIG") for s in range(len(mig)))
    rows = entry.get("remapped_rows", [0, 0, 0, 0])
    rows_list = [_int(v, f"{where}.remapped_rows", low=0, high=1 << 20) for v in _list(rows, f"{where}.remapped_rows")]
    if len(rows_list) != 4:
        raise TopologyError(f"{where}.remapped_rows: give [correctable, uncorrectable, pending, failure]")
    return GpuSpec(
        index=index,
        name=_str(entry.get("name", name), f"{where}.name"),
        uuid=gpu_uuid,
        memory_mib=_int(entry.get("memory_mib", memory), f"{where}.memory_mib", low=1024, high=1 << 22),
        power_limit_w=_number(entry.get("power_limit_w", limit), f"{where}.power_limit_w", low=10, high=5000),
        idle_power_w=_number(entry.get("idle_power_w", idle), f"{where}.idle_power_w", low=1, high=5000),
        max_sm_mhz=_int(entry.get("max_sm_mhz", sm_mhz), f"{where}.max_sm_mhz", low=100, high=10000),
        max_mem_mhz=_int(entry.get("max_mem_mhz", mem_mhz), f"{where}.max_mem_mhz", low=100, high=20000),
        gpm=bool(entry.get("gpm", gpm)),
        mig=mig,
        mig_uuids=mig_uuids,
        ecc_uncorrected=_int(entry.get("ecc_uncorrected", 0), f"{where}.ecc_uncorrected", low=0, high=1 << 30),
        remapped_rows=(rows_list[0], rows_list[1], rows_list[2], rows_list[3]),
    )


def _parse_mig(value: Any, where: str) -> tuple[MigSlice, ...]:
    if isinstance(value, Mapping):
        profile = _str(value.get("profile"), f"{where}.profile")
        count = _int(value.get("count", 1), f"{where}.count", low=1, high=7)
        profiles = [profile] * count
    else:
        profiles = [_str(p, f"{where}[]") for p in _list(value, where)]
    slices: list[MigSlice] = []
    compute_slices = 0
    for i, profile in enumerate(profiles):
        match = MIG_PROFILE_RE.match(profile)
        if not match:
            raise TopologyError(f"{where}: {profile!r} is not a MIG profile like 1g.10gb")
        compute_slices += int(match.group(1))
        slices.append(MigSlice(profile, int(match.group(2)) * 1024, gpu_instance_id=i + 1))
    if not slices or compute_slices > 7:
        raise TopologyError(f"{where}: a GPU has 7 compute slices; this layout uses {compute_slices}")
    return tuple(slices)


def _parse_pod(value: Any, where: str, key: str, gpus: Sequence[GpuSpec]) -> PodSpec:
    entry = _mapping(value, where)
    name = _str(entry.get("name"), f"{where}.name")
    namespace = _str(entry.get("namespace", "default"), f"{where}.namespace")
    uid = str(entry.get("uid") or uuid.uuid5(uuid.NAMESPACE_URL, f"gpufarm-fake/{key}/pod/{namespace}/{name}"))
    if not _UUID.match(uid):
        raise TopologyError(f"{where}.uid must be a lowercase UUID")
    qos = _str(entry.get("qos", "besteffort"), f"{where}.qos")
    if qos not in ("besteffort", "burstable", "guaranteed"):
        raise TopologyError(f"{where}.qos must be besteffort, burstable or guaranteed")
    containers: list[ContainerSpec] = []
    for j, raw in enumerate(_list(entry.get("containers", [{"name": "main"}]), f"{where}.containers")):
        cwhere = f"{where}.containers[{j}]"
        centry = _mapping(raw, cwhere)
        cname = _str(centry.get("name"), f"{cwhere}.name")
        cid = str(centry.get("id") or container_id(f"{key}/{namespace}/{name}/{cname}"))
        if not _HEX64.match(cid):
            raise TopologyError(f"{cwhere}.id must be 64 lowercase hex characters")
        devices = tuple(parse_device(d, cwhere, gpus) for d in _list(centry.get("devices", []), f"{cwhere}.devices"))
        containers.append(ContainerSpec(cname, cid, devices))
    if not containers:
        raise TopologyError(f"{where}.containers: a pod has at least one container")
    return PodSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        qos=qos,
        labels=_str_map(entry.get("labels", {}), f"{where}.labels"),
        annotations=_str_map(entry.get("annotations", {}), f"{where}.annotations"),
        containers=tuple(containers),
    )


def _parse_process(value: Any, where: str, gpus: Sequence[GpuSpec], pods: Sequence[PodSpec]) -> ProcessSpec:
    entry = _mapping(value, where)
    pid = _int(entry.get("pid"), f"{where}.pid", low=2, high=4194304)
    gpu, mig = _check_device(
        _int(entry.get("gpu", 0), f"{where}.gpu", low=0, high=63),
        None if entry.get("mig") is None else _int(entry["mig"], f"{where}.mig", low=0, high=6),
        where,
        gpus,
    )
    memory_default, sm_default = workload_profiles(
        _str(entry.get("workload", "busy"), f"{where}.workload"), device_memory_mib(gpus[gpu], mig)
    )
    memory = _parse_profile(entry["memory_mib"], f"{where}.memory_mib") if "memory_mib" in entry else memory_default
    sm = _parse_profile(entry["sm"], f"{where}.sm") if "sm" in entry else sm_default
    pod, container, docker = _process_owner(entry, where, pods)
    cgroup = _str(entry.get("cgroup", "v2"), f"{where}.cgroup")
    if cgroup not in ("v1", "v2"):
        raise TopologyError(f"{where}.cgroup must be v1 or v2")
    start = _number(entry.get("start", 0), f"{where}.start", low=0, high=1e9)
    end = math.inf if entry.get("end") is None else _number(entry["end"], f"{where}.end", low=0, high=1e9)
    if end <= start:
        raise TopologyError(f"{where}: end must come after start")
    env = _str_map(entry.get("env", {}), f"{where}.env")
    if any(not _ENV_NAME.match(k) for k in env):
        raise TopologyError(f"{where}.env: variable names are letters, digits and _")
    return ProcessSpec(
        pid=pid,
        gpu=gpu,
        mig=mig,
        memory_mib=memory,
        sm=sm,
        start=start,
        end=end,
        env=env,
        pod=pod,
        container=container,
        docker=docker,
        cgroup=cgroup,
        comm=_str(entry.get("comm", "python3"), f"{where}.comm")[:15],
        proc=bool(entry.get("proc", True)),
        memory_unavailable=bool(entry.get("memory_unavailable", False)),
    )


def _process_owner(
    entry: Mapping[str, Any], where: str, pods: Sequence[PodSpec]
) -> tuple[str | None, str | None, str | None]:
    """(pod, container, docker container id) of a process entry: a pod's container, a plain Docker container, or
    neither."""
    pod = entry.get("pod")
    container = entry.get("container")
    if pod is not None:
        pod_spec = next((p for p in pods if p.name == pod), None)
        if pod_spec is None:
            raise TopologyError(f"{where}.pod: no pod named {pod!r}")
        names = [c.name for c in pod_spec.containers]
        container = container or names[0]
        if container not in names:
            raise TopologyError(f"{where}.container: pod {pod!r} has no container {container!r}")
    docker = entry.get("docker")
    if docker is not None:
        docker = container_id(f"{where}/docker") if docker == "auto" else str(docker)
        if not _HEX64.match(docker) or pod is not None:
            raise TopologyError(f"{where}.docker: a 64-hex id (or 'auto'), and not together with pod")
    return pod, container, docker


def _parse_profile(value: Any, where: str) -> Profile:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Profile("constant", value=_number(value, where, low=0, high=1e9))
    entry = _mapping(value, where)
    kind = _str(entry.get("kind"), f"{where}.kind")
    if kind == "constant":
        return Profile(kind, value=_number(entry.get("value"), f"{where}.value", low=0, high=1e9))
    if kind == "square":
        return Profile(
            kind,
            high=_number(entry.get("high"), f"{where}.high", low=0, high=1e9),
            low=_number(entry.get("low", 0), f"{where}.low", low=0, high=1e9),
            period=_number(entry.get("period", 60), f"{where}.period", low=0.1, high=1e7),
            duty=_number(entry.get("duty", 0.5), f"{where}.duty", low=0, high=1),
            phase=_number(entry.get("phase", 0), f"{where}.phase", low=0, high=1e7),
        )
    if kind == "ramp":
        return Profile(
            kind,
            start=_number(entry.get("start", 0), f"{where}.start", low=0, high=1e9),
            end=_number(entry.get("end"), f"{where}.end", low=0, high=1e9),
            duration=_number(entry.get("duration", 60), f"{where}.duration", low=0.1, high=1e7),
        )
    if kind == "steps":
        steps = []
        for j, step in enumerate(_list(entry.get("steps"), f"{where}.steps")):
            pair = _list(step, f"{where}.steps[{j}]")
            if len(pair) != 2:
                raise TopologyError(f"{where}.steps[{j}] must be [seconds, value]")
            steps.append((_number(pair[0], f"{where}.steps[{j}]", 0, 1e9), _number(pair[1], where, 0, 1e9)))
        if not steps or steps != sorted(steps):
            raise TopologyError(f"{where}.steps: a non-empty list sorted by time")
        return Profile(kind, steps=tuple(steps))
    raise TopologyError(f"{where}.kind: {kind!r} is not constant, square, ramp or steps")


def _parse_error(value: Any, where: str, gpus: Sequence[GpuSpec]) -> ErrorSpec:
    entry = _mapping(value, where)
    function = _str(entry.get("function"), f"{where}.function")
    if function != "*" and not function.startswith("nvml"):
        raise TopologyError(f"{where}.function: an NVML function name or '*'")
    error = _str(entry.get("error"), f"{where}.error")
    if error not in ERROR_NAMES:
        raise TopologyError(f"{where}.error: {error!r} is not one of {', '.join(sorted(ERROR_NAMES))}")
    gpu = None
    if entry.get("gpu") is not None:
        gpu = _check_device(_int(entry["gpu"], f"{where}.gpu", low=0, high=63), None, where, gpus)[0]
    start = _number(entry.get("from", 0), f"{where}.from", low=0, high=1e9)
    end = math.inf if entry.get("until") is None else _number(entry["until"], f"{where}.until", low=0, high=1e9)
    return ErrorSpec(function, error, gpu, start, end)


def _parse_xid(value: Any, where: str, gpus: Sequence[GpuSpec]) -> XidSpec:
    entry = _mapping(value, where)
    gpu = _check_device(_int(entry.get("gpu"), f"{where}.gpu", low=0, high=63), None, where, gpus)[0]
    xid = _int(entry.get("xid"), f"{where}.xid", low=1, high=1000)
    return XidSpec(gpu, xid, _number(entry.get("at"), f"{where}.at", low=0, high=1e9))


def _check_device(gpu: int, mig: int | None, where: str, gpus: Sequence[GpuSpec]) -> tuple[int, int | None]:
    if gpu >= len(gpus):
        raise TopologyError(f"{where}: GPU {gpu} does not exist (the node has {len(gpus)})")
    spec = gpus[gpu]
    if mig is not None and (spec.mig is None or mig >= len(spec.mig)):
        raise TopologyError(f"{where}: GPU {gpu} has no MIG slice {mig}")
    if mig is None and spec.mig is not None and where.startswith(("processes", "pods")):
        raise TopologyError(f"{where}: GPU {gpu} is in MIG mode; name a slice (e.g. {gpu}/0)")
    return gpu, mig


def _check_pid_overlap(processes: Sequence[ProcessSpec]) -> None:
    by_pid: dict[int, list[ProcessSpec]] = {}
    for proc in processes:
        by_pid.setdefault(proc.pid, []).append(proc)
    for pid, procs in by_pid.items():
        spans = sorted((p.start, p.end) for p in procs)
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                raise TopologyError(f"processes: pid {pid} is used twice at the same time (reuse needs end <= start)")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TopologyError(f"{where} must be a mapping")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise TopologyError(f"{where} must be a list")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(f"{where} must be a non-empty string")
    return value.strip()


def _str_map(value: Any, where: str) -> dict[str, str]:
    return {str(k): _str(v, f"{where}.{k}") for k, v in _mapping(value, where).items()}


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise TopologyError(f"{where} must be a number in [{low:g}, {high:g}]")
    return float(value)


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TopologyError(f"{where} must be an integer in [{low}, {high}]")
    return value
