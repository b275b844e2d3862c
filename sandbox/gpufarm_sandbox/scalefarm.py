"""A farm of any size on the sandbox, and gpufarm's paths through it measured one function invocation at a time.

Hosts are seeded through `POST /_sandbox/hosts` (8 GPUs each, with the tags their agents register) and leases as
gpufarm makes them: incidents of gpufarm's type carrying an allocation's fields (phase allocated, hosts, GPUs per
host, expiry), created through the incident API, with the `ir:` / `project:` / `team:` tags on their hosts. The
functions' collaborators are built as in Lambda (gpufarm.handlers.runtime from the environment: the real Datadog
and Slack clients); only the SQS queue is a list, and each message queued is then run as its own invocation of
the queue consumer (incident_webhook.process_message), one at a time, as one FIFO group runs them. Every
invocation is measured: wall time, CPU, peak RSS (VmHWM after /proc/self/clear_refs) and the sandbox's request
counter (`/_sandbox/requests`: reads, writes, metric posts, Slack calls; the writes told apart as host-tag writes
and incident writes by gpufarm_sandbox.emulator.counter.kind).

benchmarks/scale.py runs it at 2,000 / 300 and 20,000 / 3,000 (hosts / live leases) and prints the figures;
tests/integration/test_scale_paths.py runs it small and checks that reads do not grow with unrelated leases.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import GpuRequest, encode_host_gpus, isoformat
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.emulator import counter
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN

TEAMS = 30
GPUS_PER_HOST = 8
OPERATORS_GROUP = "S0000000001"
OPERATORS_CHANNEL = "C0000000001"
OPERATOR = "U0000000900"
HOST_SEED_CHUNK = 2000


@dataclass(frozen=True)
class PoolShare:
    """One (pool, model) of the farm and its share of the hosts and of the leases."""

    environment: str
    kind: str
    model: str
    hosts: float
    leases: float
    clusters: tuple[str, ...]


POOLS: tuple[PoolShare, ...] = (
    PoolShare("onprem-hpc", "dedicated", "H100", 0.50, 0.50, ("hpc-a", "hpc-b")),
    PoolShare("cloud-aws", "dedicated", "H100", 0.15, 0.15, ("aws-use1",)),
    PoolShare("cloud-aws", "dedicated", "A100", 0.15, 0.15, ("aws-usw2",)),
    PoolShare("shared-slices", "shared", "A100", 0.10, 0.10, ("k8s-shared",)),
    PoolShare("shared-slices", "shared", "L4", 0.10, 0.10, ("k8s-shared",)),
)
# More collaborators every fresh runtime gets (benchmarks/scale.py: the inventory sources on simulated clouds).
OVERRIDES: dict[str, Any] = {}
# Timeouts (s) of the functions each invocation runs in, as template.yaml sets them.
TIMEOUT_S = {"worker": 60, "consumer": 60, "sync": 120}
# Where each scheduled sync's cProfile statistics go (`<path>-<n>.prof`), or None (benchmarks/scale.py --profile):
# the per-function totals at two sizes say which part of the sync grows faster than the farm.
PROFILE_DIR: Path | None = None


def team(i: int) -> str:
    """The i-th team of the farm."""
    return f"team{i:02d}"


def user(i: int) -> str:
    """The Slack user id of the i-th team's researcher."""
    return f"U{i:010d}"


def farm_yaml() -> str:
    """The farm configuration: three pools as in config/farm.example.yaml, TEAMS teams with room in every pool."""
    envs: dict[str, tuple[str, list[str], list[str]]] = {}
    for p in POOLS:
        kind, models, clusters = envs.setdefault(p.environment, (p.kind, [], []))
        models.append(p.model)
        clusters += [c for c in p.clusters if c not in clusters]
    lines = [f"operators_usergroup: {OPERATORS_GROUP}", f"operators_channel: {OPERATORS_CHANNEL}", "gpu_models:"]
    lines += [f"  {m}: {{description: {m}, memory_gb: 80}}" for m in ("H100", "A100", "L4")]
    lines.append("environments:")
    for env, (kind, models, clusters) in envs.items():
        lines += [f"  {env}:", f"    kind: {kind}", f"    gpu_models: [{', '.join(models)}]"]
        lines.append(f"    clusters: [{', '.join(clusters)}]")
    lines.append("teams:")
    for t in range(TEAMS):
        lines += [f"  {team(t)}:", "    max_days: 30", "    quotas:"]
        for env, (_, models, _) in envs.items():
            lines.append(f"      {env}:")
            lines += [f"        {m}: {{gpus: 2048, hard_limit: 4096}}" for m in models]
    lines += ["idle: {grace_minutes: 60, kinds: {low_utilization: {threshold_percent: 5, window_minutes: 60}}}"]
    lines += ["defaults: {duration_days: 7, extend_days: 7}"]
    return "\n".join(lines) + "\n"


def environment(url: str, farm_file: Path) -> dict[str, str]:
    """The variables that point gpufarm's runtime at the sandbox (as `gpufarm local` sets them)."""
    return {
        "GPUFARM_DATADOG_HOST": url,
        "GPUFARM_SLACK_API_URL": f"{url}/slack/api/",
        "DD_API_KEY": DEFAULT_DD_API_KEY,
        "DD_APP_KEY": DEFAULT_DD_APP_KEY,
        "SLACK_BOT_TOKEN": DEFAULT_SLACK_TOKEN,
        "GPUFARM_WEBHOOK_SECRET": "gpufarm-scale-webhook-secret",
        "GPUFARM_FARM_CONFIG": str(farm_file),
        "GPUFARM_WORKER_FUNCTION": "SlackWorkerFunction",
    }


# -- the sandbox over plain JSON --------------------------------------------------------------------------------


class Api:
    """Plain JSON over one keep-alive connection per thread (seeding and the request counter, never measured)."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.url = url.rstrip("/")
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._local = threading.local()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request; (status, parsed body)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            self._local.conn = conn
        headers = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        raw = answer.read()
        return answer.status, json.loads(raw) if raw.strip() else None

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        """One request that must succeed."""
        status, answer = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {str(answer)[:300]}")
        return answer

    def counts(self) -> dict[str, int]:
        """The sandbox's request counter, per endpoint."""
        return dict(self.ok("GET", "/_sandbox/requests")["by_endpoint"])


# -- the farm ---------------------------------------------------------------------------------------------------


@dataclass
class Lease:
    """One live allocation to seed: its request, its hosts and GPUs per host, and (once created) its IR."""

    request: GpuRequest
    host_gpus: dict[str, int]
    ir: int = 0
    # Minutes since its GPU-hours last accrued (gpufarm.core.accounting.gpu_hours): a quarter of the leases 65, due at
    # an hourly cadence as at a 15-minute sync in steady state, the rest 10-20, not due for the next 40 minutes.
    accrued_minutes_ago: int = 10

    def tags(self) -> list[str]:
        """The tags gpufarm puts on the lease's hosts."""
        r = self.request
        return [f"ir:ir-{self.ir}", normalize_tag(f"project:{r.project}"), normalize_tag(f"team:{r.team}")]

    def fields(self, now: datetime) -> dict[str, object]:
        """The incident fields of an allocated lease."""
        values = self.request.to_fields(Phase.ALLOCATED, now)
        values |= {
            f.STATE: State.STABLE.value,
            f.APPROVED_BY: "policy",
            f.HOSTS: sorted(self.host_gpus),
            f.HOST_GPUS: encode_host_gpus(self.host_gpus),
            f.EXPIRES_AT: isoformat(now + timedelta(days=self.request.duration_days)),
            f.ALLOCATED_AT: isoformat(now - timedelta(hours=2)),
            f.GPU_HOURS_UNTIL: isoformat(now - timedelta(minutes=self.accrued_minutes_ago)),
        }
        return values


@dataclass
class Layout:
    """Hosts (name → registration tags) and leases of one farm, and the hosts no lease holds per pool and model."""

    hosts: dict[str, list[str]] = field(default_factory=dict)
    leases: list[Lease] = field(default_factory=list)
    free: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def layout(n_hosts: int, n_leases: int, *, pools: tuple[PoolShare, ...] = POOLS, prefix: str = "") -> Layout:
    """Hosts split over the pools by their shares; leases of 8 or 16 GPUs (dedicated) or 1-4 slices (shared)."""
    out = Layout()
    k = 0
    weights = sum(p.hosts for p in pools), sum(p.leases for p in pools)
    for p in pools:
        names = [
            f"{prefix}{p.environment}-{p.model.lower()}-{i:05d}" for i in range(int(n_hosts * p.hosts / weights[0]))
        ]
        for i, name in enumerate(names):
            out.hosts[name] = registration_tags(p.model, GPUS_PER_HOST, p.environment, p.clusters[i % len(p.clusters)])
        cursor = 0
        for _ in range(int(n_leases * p.leases / weights[1])):
            size = 1 + k % 2 if p.kind == "dedicated" else 1
            taken = names[cursor : cursor + size]
            cursor += size
            units = GPUS_PER_HOST if p.kind == "dedicated" else 1 + k % 4
            request = GpuRequest(
                team=team(k % TEAMS),
                project=f"{prefix}proj-{k:05d}",
                gpu_model=p.model,
                gpu_count=units * len(taken),
                environment=p.environment,
                duration_days=14,
                requester=user(k % TEAMS),
                request_id=f"seed-{prefix}{k:06d}-lease",
            )
            accrued = 65 if k % 4 == 0 else 5 + 5 * (k % 4)
            out.leases.append(Lease(request, dict.fromkeys(taken, units), accrued_minutes_ago=accrued))
            k += 1
        out.free[(p.environment, p.model)] = names[cursor:]
    return out


def prepare(api: Api) -> None:
    """A reset sandbox with the Slack workspace and `gpufarm datadog apply` done (webhooks aimed at a 404)."""
    from gpufarm.adapters.datadog_admin import DatadogAdmin
    from gpufarm.config import Settings
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.setup.apply import apply_setup
    from gpufarm.setup.plan import SetupSpec

    api.ok("POST", "/_sandbox/reset", {})
    users = [{"id": user(t), "name": f"user{t}", "real_name": f"User {t}"} for t in range(TEAMS)]
    users.append({"id": OPERATOR, "name": "operator", "real_name": "GPU operator"})
    api.ok("POST", "/_sandbox/slack/users", {"users": users})
    api.ok("POST", "/_sandbox/slack/channels", {"channels": [{"id": OPERATORS_CHANNEL, "name": "gpu-ops"}]})
    group = {"id": OPERATORS_GROUP, "handle": "gpu-operators", "name": "GPU operators", "users": [OPERATOR]}
    api.ok("POST", "/_sandbox/slack/usergroups", {"usergroups": [group]})
    # Datadog's notifications are not what is measured: their webhook answers 404 and is not retried.
    spec = SetupSpec(
        incident_webhook_url=f"{api.url}/_scale/none/incident",
        idle_webhook_url=f"{api.url}/_scale/none/idle",
        valid_values=parse_farm(farm_yaml()).valid_values(),
        has_secret=True,
    )
    settings = Settings()
    admin = DatadogAdmin(settings)
    try:
        apply_setup(admin, spec, secret=settings.webhook_secret)
    finally:
        admin.close()


def seed(api: Api, plan: Layout, *, threads: int = 4) -> None:
    """Create the plan's leases (incidents as gpufarm makes them), then its hosts with the leases' tags."""
    from gpufarm.config import Settings

    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type)
    now = datetime.now(UTC)

    def create(lease: Lease) -> None:
        attributes = {
            "title": lease.request.title(),
            "customer_impacted": False,
            "fields": f.encode_fields(lease.fields(now)),
            "incident_type_uuid": type_id,
        }
        answer = api.ok("POST", "/api/v2/incidents", {"data": {"type": "incidents", "attributes": attributes}})
        lease.ir = int(answer["data"]["attributes"]["public_id"])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, plan.leases))
    held = {host: lease for lease in plan.leases for host in lease.host_gpus}
    names = sorted(plan.hosts)
    for start in range(0, len(names), HOST_SEED_CHUNK):
        body = []
        for name in names[start : start + HOST_SEED_CHUNK]:
            lease = held.get(name)
            tags = [*plan.hosts[name], *(lease.tags() if lease else [])]
            body.append({"name": name, "tags": {"user": tags}, "reporting": True})
        api.ok("POST", "/_sandbox/hosts", {"hosts": body})


def settle(api: Api) -> None:
    """Wait until the sandbox has no webhook delivery queued (Datadog's notifications of earlier writes)."""
    for _ in range(30):
        if api.ok("POST", "/_sandbox/webhooks/drain", {"timeout": 60})["drained"]:
            return
    raise RuntimeError("the sandbox's webhook deliveries did not drain")


@dataclass(frozen=True)
class Drift:
    """What `drift` changed: hosts whose tags changed, and the leases among them whose hosts lost their tags."""

    hosts: int
    leases: int


def drift(api: Api, plan: Layout, share: float = 0.01) -> Drift:
    """Change the `user` tags of a share of the hosts behind gpufarm's back; returns how many hosts and leases.

    Half are dedicated hosts of a lease that lost the lease's tags; half are free hosts carrying the tags of an
    incident that never was. Each host needs exactly one host-tag write to repair, and each lease that lost a host's
    tags one incident write (the "repaired" entry of its history, gpufarm.core.kernel.history), whatever its hosts.
    """
    n = max(2, int(len(plan.hosts) * share))
    held = [host for lease in plan.leases if lease.request.environment != "shared-slices" for host in lease.host_gpus]
    free = [h for hosts in plan.free.values() for h in hosts]
    lost = held[:: max(1, len(held) // (n // 2))][: n // 2]
    stray = free[:: max(1, len(free) // (n - n // 2))][: n - n // 2]
    for host in lost:
        api.ok("PUT", f"/api/v1/tags/hosts/{host}?source=user", {"host": host, "tags": plan.hosts[host]})
    for host in stray:
        tags = [*plan.hosts[host], "ir:ir-999999", "team:ghost"]
        api.ok("PUT", f"/api/v1/tags/hosts/{host}?source=user", {"host": host, "tags": tags})
    holder = {host: lease.ir for lease in plan.leases for host in lease.host_gpus}
    return Drift(hosts=len(lost) + len(stray), leases=len({holder[host] for host in lost}))


# -- invocations ------------------------------------------------------------------------------------------------


@dataclass
class Invocation:
    """One function invocation and what it cost."""

    name: str
    function: str
    wall_s: float
    cpu_s: float
    rss_mb: float
    reads: int
    writes: int
    metrics: int
    slack: int
    # The writes, told apart: hosts' `user` tags, incidents (fields, history), anything else (none expected).
    host_writes: int = 0
    incident_writes: int = 0
    other_writes: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)

    @property
    def timeout_share(self) -> float:
        """Wall time as a share of the function's timeout."""
        return self.wall_s / TIMEOUT_S[self.function]


@dataclass
class FarmPath:
    """A path through the farm: the invocations it took, one after another."""

    name: str
    calls: list[Invocation] = field(default_factory=list)
    note: str = ""
    # What the path should have cost, where the farm knows (the drifted sync: host_writes, incident_writes).
    expected: dict[str, int] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        """Wall time of every invocation together."""
        return sum(c.wall_s for c in self.calls)

    def total(self, attr: str) -> int:
        """A count summed over the invocations (reads, writes, host_writes, incident_writes, metrics, slack)."""
        return sum(int(getattr(c, attr)) for c in self.calls)


class ListQueue:
    """The allocation queue as a list, in send order (one FIFO group at a time is all the paths need)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send(self, body: Mapping[str, Any], *, group: str, dedup_id: str) -> None:
        """Enqueue (deduplication is SQS's job and not measured here)."""
        self.messages.append(dict(body))


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    # Linux: writing 5 resets the peak resident set size to the current one.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _label(body: Mapping[str, Any]) -> str:
    if "command" in body:
        return f"command {body['command']['op']}"
    if "pool" in body:
        shard = f" {body['shard'] + 1}/{body['shards']}" if "shard" in body else ""
        return f"repair {body['pool']}{shard}"
    return f"incident {body.get('reason', '')}"


class Runner:
    """Runs invocations against the sandbox with the runtime's own collaborators, measuring each one."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.queue = ListQueue()

    def fresh(self) -> None:
        """A new container: the runtime built again from the environment, the queue a list."""
        from gpufarm.handlers import runtime

        runtime.reset()
        runtime.override(queue=self.queue, **OVERRIDES)
        self.queue.messages.clear()

    def invoke(self, path: FarmPath, name: str, function: str, run: Callable[[], Any]) -> Any:
        """One invocation, measured (after the sandbox has delivered the webhooks earlier writes set off)."""
        settle(self.api)
        gc.collect()
        self.api.ok("DELETE", "/_sandbox/requests")
        _reset_peak_rss()
        profiler = None
        if PROFILE_DIR is not None and function == "sync":
            import cProfile

            profiler = cProfile.Profile()
        wall, cpu = time.perf_counter(), time.process_time()
        result = profiler.runcall(run) if profiler is not None else run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profiler is not None and PROFILE_DIR is not None:
            PROFILE_DIR.mkdir(parents=True, exist_ok=True)
            profiler.dump_stats(PROFILE_DIR / f"{path.name}-{len(path.calls) + 1}.prof")
        rss = _peak_rss_mb()
        counts = self.api.counts()
        kinds = dict.fromkeys(counter.KINDS, 0)
        for endpoint, n in counts.items():
            kinds[counter.kind(endpoint)] += n
        kinds["writes"] = kinds["host_writes"] + kinds["incident_writes"] + kinds["other_writes"]
        path.calls.append(Invocation(name, function, wall, cpu, rss, **kinds, by_endpoint=counts))
        return result

    def consume(self, path: FarmPath, body: Mapping[str, Any]) -> Any:
        """One queue message through the queue consumer, as its own invocation."""
        from gpufarm.handlers import incident_webhook
        from gpufarm.handlers import runtime as rt

        text = json.dumps(body)
        return self.invoke(path, _label(body), "consumer", lambda: incident_webhook.process_message(rt.current(), text))

    def drain(self, path: FarmPath) -> None:
        """Every queued message, in order, each as its own consumer invocation."""
        while self.queue.messages:
            self.consume(path, self.queue.messages.pop(0))

    def worker(self, path: FarmPath, name: str, job: dict[str, Any]) -> Any:
        """One Slack worker invocation."""
        from gpufarm.handlers import slack_worker

        return self.invoke(path, name, "worker", lambda: slack_worker.handle(job))


def find_incident(api: Api, request_id: str) -> tuple[int, str]:
    """The IR and UUID of the newest incident carrying a request id (read outside any measured invocation)."""
    query = urllib.parse.quote("state:(active OR stable OR resolved)")
    answer = api.ok("GET", f"/api/v2/incidents/search?query={query}&sort=-created&page[size]=20")
    for item in answer["data"]["attributes"]["incidents"]:
        data = item["data"]
        value = ((data["attributes"].get("fields") or {}).get("request_id") or {}).get("value")
        if value == request_id:
            return int(data["attributes"]["public_id"]), str(data["id"])
    raise RuntimeError(f"no incident carries request id {request_id}")


def _sync(runner: Runner, path: FarmPath, accruals: FarmPath) -> None:
    """The scheduled sync, then every repair it queued; its accrue commands are measured apart, in `accruals`."""
    from gpufarm.handlers import quota_sync

    runner.invoke(path, "scheduled sync", "sync", lambda: quota_sync.handle({"job": "quota_sync"}))
    # The leases whose GPU-hours are due: writes of their own (gpufarm.core.accounting.gpu_hours), not the repairs'.
    queued = list(runner.queue.messages)
    runner.queue.messages[:] = [m for m in queued if _label(m) != "command accrue"]
    runner.drain(path)
    for body in queued:
        if _label(body) == "command accrue":
            runner.consume(accruals, body)
    accruals.note = f"{len(accruals.calls)} leases due"


def measure(api: Api, plan: Layout, *, tag: str = "0001") -> dict[str, FarmPath]:
    """request → IR, approval → hosts tagged, release → untagged, sync (no change), sync (1 % drift)."""
    from gpufarm.core.chat.command_text import parse_command

    runner = Runner(api)
    keys = ("request", "approval", "release", "sync", "drift", "accrual", "drift accrual")
    paths = {key: FarmPath(key) for key in keys}

    # request → IR: the worker (the policy's up-front check, the request queued) and what it queued.
    runner.fresh()
    req = GpuRequest(
        team=team(1),
        project=f"scale-{tag}",
        gpu_model="H100",
        gpu_count=16,
        environment="onprem-hpc",
        duration_days=7,
        requester=user(1),
        request_id=f"scale-request-{tag}",
    )
    runner.worker(
        paths["request"],
        "worker request",
        {"kind": "request", "user": req.requester, "request": req.model_dump(mode="json")},
    )
    runner.drain(paths["request"])
    ir, incident_id = find_incident(api, req.request_id)
    paths["request"].note = f"IR-{ir}"

    # approval → hosts tagged: Datadog's webhook queued the approved incident; the consumer allocates.
    runner.fresh()
    runner.consume(paths["approval"], {"incident_id": incident_id, "reason": "stable/approved"})

    # release → untagged: the worker queues the release, the consumer resolves it, the webhook's message reclaims.
    runner.fresh()
    command = parse_command(f"release IR-{ir} now").to_payload()
    runner.worker(paths["release"], "worker release", {"kind": "command", "user": req.requester, "command": command})
    runner.drain(paths["release"])
    runner.consume(paths["release"], {"incident_id": incident_id, "reason": "resolved/reclaiming"})

    # One sync with nothing to change: the scheduled function, then every repair it queued.
    runner.fresh()
    _sync(runner, paths["sync"], paths["accrual"])

    # One sync after 1 % of the hosts drifted (and the accruals the first sync left over past ledger.max_accruals).
    changed = drift(api, plan)
    runner.fresh()
    _sync(runner, paths["drift"], paths["drift accrual"])
    paths["drift"].note = f"{changed.hosts} hosts changed, {changed.leases} leases lost a host's tags"
    paths["drift"].expected = {"host_writes": changed.hosts, "incident_writes": changed.leases}
    return paths
