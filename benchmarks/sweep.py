"""The one-minute sweep (gpufarm.core.sync.sweep): how fast steps complete with no webhook, and what a sweep costs.

1. Latency on the local function host (start_local with gpufarm's Datadog setup), the sandbox playing Slack users
   (gpufarm_sandbox.demo.lifecycle_stage.LocalFarm): `--requests` requests of 8 H100 on the HPC pool, approved by
   policy (the farm file is config/farm.example.yaml with the team's quota raised so each one is), issued at
   offsets spread evenly over one minute of the sweep's timetable; each released RELEASE_AFTER_S after its request
   (its offset in the minute spread as well). The sandbox clock moves `--step` seconds at a time, the host drained
   between steps, so the schedules of template.yaml fire on it as they would (the sweep every minute); nothing
   calls the sweep directly. Measured in sandbox-clock seconds: request → hosts tagged, release → hosts untagged,
   and the real seconds gpufarm's functions ran. Three farms, each in the same run:
   - webhooks on: a plain sandbox, the anchor;
   - `no-field-trigger`: notification rules fire only on state changes, so an approval (a phase change) and the
     allocation it waits for get no webhook of their own;
   - no webhooks at all: the same, with gpufarm's notification rules disabled, so only the sweep moves a step.
2. A sweep's cost at 2,000 hosts / 300 live leases and 20,000 / 3,000 (`--sizes`), seeded as benchmarks/scale.py
   seeds them (gpufarm_sandbox.scalefarm), plus as many ended (reclaimed) leases as live ones, in two sandbox
   processes: a plain one and one playing `facets-400` (custom-field and incident-type facets refused, so each
   search falls back to its states and is filtered locally; gpufarm.adapters.incident_search). The
   QuotaSyncFunction handler runs `{"job": "sweep"}` with nothing to do (`--runs` times: the first in a fresh
   container, the rest warm), measured as scalefarm measures every invocation: wall, CPU, peak RSS, the sandbox's
   request counter by endpoint. Beside it, the floor: the same search pages fetched with plain HTTP and json.loads.
   Lambda mode: CPU scaled to the vCPU share of the function's MemorySize in template.yaml (1 vCPU at 1,769 MB,
   proportional below, as AWS documents), the time waiting on the sandbox kept as it is.

Run: .venv/bin/python benchmarks/sweep.py [--sizes small,large] [--runs 4] [--requests 20] [--step 1.5]
[--parts latency,cost]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

from gpufarm.core.context.reads import live_query
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.sync.sweep import ENDED_QUERY
from gpufarm_sandbox import scalefarm
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
from gpufarm_sandbox.localhost.template import load_template
from gpufarm_sandbox.process import free_port, start_sandbox
from gpufarm_sandbox.scalefarm import TIMEOUT_S, FarmPath, Invocation

ROOT = Path(__file__).resolve().parent.parent
FUNCTION = "QuotaSyncFunction"
SCHEDULE = "EveryMinute"  # template.yaml: the sweep's schedule on FUNCTION
INTERVAL_S = 60.0
SHARE_GOAL = 0.05  # of the interval, per sweep with nothing to do
LATENCY_GOAL_S = 120.0  # p95, request → tagged and release → untagged, with no webhook
FULL_VCPU_MB = 1769  # AWS Lambda: one full vCPU at 1,769 MB, CPU share proportional to memory below it
LEAST_MB = 128  # Lambda's smallest MemorySize
SIZES = {"tiny": (200, 30), "small": (2_000, 300), "large": (20_000, 3_000)}
KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}

# -- 1. latency with and without webhooks ----------------------------------------------------------------------

RELEASE_AFTER_S = 150.0  # after its request: past the goal, and half a minute off the request's offset
SETTLE_S = 30.0  # the longest one drain of the host may take
RESEARCHER = "U0000000001"  # alice, of team nlp (gpufarm_sandbox.demo.lifecycle_stage)
# Twenty more 8 x H100 hosts on the HPC pool, so every request finds one while the others hold theirs.
EXTRA_HOSTS = tuple((f"hpc-{c}-{i:02d}", "H100", 8, "onprem-hpc", f"hpc-{c}") for c in ("a", "b") for i in range(3, 13))
# (label, Datadog quirks, notification rules on): the anchor first.
ANCHOR = "webhooks on (plain sandbox)"
FARMS = (
    (ANCHOR, "", True),
    ("no-field-trigger", "no-field-trigger", True),
    ("no webhooks at all (no-field-trigger, rules disabled)", "no-field-trigger", False),
)
NLP_HPC_QUOTA = "H100: {gpus: 8, hard_limit: 16}"  # nlp's quota on onprem-hpc, the first of its kind in the file
BENCH_QUOTA = "H100: {gpus: 512, hard_limit: 1024}"


@dataclass
class Lease:
    """One request of the latency run: when it was asked, tagged, released and untagged (sandbox clock)."""

    project: str
    offset_s: float
    asked: float | None = None
    tagged: float | None = None
    host: str = ""
    ir: int = 0
    released: float | None = None
    untagged: float | None = None


@dataclass
class Farm:
    """What one latency farm measured."""

    label: str
    leases: list[Lease]
    work_s: Counter[str] = field(default_factory=Counter)
    invocations: Counter[str] = field(default_factory=Counter)
    sweeps: list[float] = field(default_factory=list)
    webhooks: int = 0
    real_s: float = 0.0
    sandbox_s: float = 0.0


def bench_farm_file(folder: Path) -> Path:
    """config/farm.example.yaml with nlp's HPC quota raised: every request is approved by policy."""
    text = (ROOT / "config" / "farm.example.yaml").read_text()
    if NLP_HPC_QUOTA not in text:
        raise SystemExit(f"config/farm.example.yaml no longer holds {NLP_HPC_QUOTA!r}: update benchmarks/sweep.py")
    path = folder / "farm.yaml"
    path.write_text(text.replace(NLP_HPC_QUOTA, BENCH_QUOTA, 1))
    return path


def disable_notification_rules(url: str) -> int:
    """Turn every incident notification rule off through Datadog's API: no incident webhook is sent any more."""
    rules_path = "/api/v2/incidents/config/notification-rules"
    rules = _json(url, "GET", rules_path)["data"]
    for rule in rules:
        attributes = {k: rule["attributes"][k] for k in ("conditions", "handles", "trigger", "renotify_on")}
        attributes |= {"visibility": rule["attributes"]["visibility"], "enabled": False}
        body = {
            "data": {
                "id": rule["id"],
                "type": "incident_notification_rules",
                "attributes": attributes,
                "relationships": {"incident_type": rule["relationships"]["incident_type"]},
            }
        }
        _json(url, "PUT", f"{rules_path}/{rule['id']}", body)
    return len(rules)


def _json(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {**KEYS, "Content-Type": "application/json"}
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as answer:
        raw = answer.read()
    return json.loads(raw) if raw.strip() else None


def latency_farm(label: str, quirks: str, *, webhooks: bool, n: int, step_s: float, farm_file: Path) -> Farm:
    """One farm: n requests spread over a minute of the sweep's timetable, each released later; the clock stepped."""
    from gpufarm.handlers import runtime
    from gpufarm_sandbox.demo.lifecycle_stage import HOSTS, LocalFarm
    from gpufarm_sandbox.localhost import start_local

    started = time.perf_counter()
    with start_local(port=0, setup=True, quirks=quirks) as local:
        os.environ["GPUFARM_FARM_CONFIG"] = str(farm_file)
        runtime.reset()
        farm = LocalFarm.ready(local)
        try:
            farm.seed_hosts(EXTRA_HOSTS)
            if not webhooks:
                disable_notification_rules(local.url)
            hosts = [h[0] for h in (*HOSTS, *EXTRA_HOSTS) if h[3] == "onprem-hpc"]
            result = Farm(label, [Lease(f"sweep-bench-{i:02d}", INTERVAL_S * i / n) for i in range(n)])
            remove = local.host.listen(lambda entry, event: _count_work(result, entry, event))
            try:
                _step_through(local, farm, result, hosts, step_s)
            finally:
                remove()
            result.real_s = time.perf_counter() - started
        finally:
            farm.close()
            runtime.reset()
    return result


def _count_work(result: Farm, entry: dict[str, Any], event: Any) -> None:
    seconds = float(entry.get("duration_ms", 0.0)) / 1000
    result.work_s[entry["function"]] += seconds
    result.invocations[entry["function"]] += 1
    if entry["function"] == FUNCTION and isinstance(event, dict) and event.get("job") == "sweep":
        result.sweeps.append(seconds)


def _step_through(local: Any, farm: Any, result: Farm, hosts: list[str], step_s: float) -> None:
    """Ask, release and look, one clock step at a time, until every lease is untagged or the time is up."""
    clock = local.sandbox.clock
    trigger = next(
        t for t in local.host.schedules if t.spec.name == SCHEDULE and t.function.spec.logical_id == FUNCTION
    )
    first_tick = float(trigger.next_due)
    deadline = first_tick + INTERVAL_S + RELEASE_AFTER_S + 3 * LATENCY_GOAL_S
    delivered = len(local.sandbox.webhooks.deliveries)
    begun = clock.now()
    while clock.now() < deadline and not all(lease.untagged is not None for lease in result.leases):
        clock.advance(step_s)
        now = clock.now()
        for lease in result.leases:
            if lease.asked is None and now >= first_tick + lease.offset_s:
                lease.asked = clock.now()
                farm.slash(RESEARCHER, f"request 8 H100 project={lease.project} team=nlp env=onprem-hpc days=1")
            elif lease.tagged is not None and lease.released is None and now >= lease.asked + RELEASE_AFTER_S:
                lease.released = clock.now()
                farm.slash(RESEARCHER, f"release IR-{lease.ir} now")
        local.host.drain(timeout=SETTLE_S)
        _look(local.sandbox, result.leases, hosts, clock.now())
    result.webhooks = len(local.sandbox.webhooks.deliveries) - delivered
    result.sandbox_s = clock.now() - begun


def _look(sandbox: Any, leases: list[Lease], hosts: list[str], now: float) -> None:
    """Which leases' hosts carry their tags now (read from the sandbox's host store, no API call)."""
    tags = {host: sandbox.hosts.tags_for(host) for host in hosts}
    for lease in leases:
        if lease.asked is not None and lease.tagged is None:
            held = [h for h, t in tags.items() if f"project:{lease.project}" in t]
            if held:
                lease.tagged, lease.host = now, held[0]
                lease.ir = int(next(t for t in tags[held[0]] if t.startswith("ir:ir-")).removeprefix("ir:ir-"))
        elif lease.released is not None and lease.untagged is None and f"ir:ir-{lease.ir}" not in tags[lease.host]:
            lease.untagged = now


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p95 (nearest rank) and max; NaN for no values."""
    if not values:
        return math.nan, math.nan, math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(0.95 * len(ordered)))
    return statistics.median(ordered), ordered[rank - 1], ordered[-1]


def show_latency(farms: list[Farm], step_s: float) -> None:
    """Both latencies of every farm beside the goal, and the real seconds gpufarm's functions ran."""
    print(f"\n== latency on the local host, sandbox-clock seconds (clock stepped {step_s:g} s, host drained between)")
    for farm in farms:
        n = len(farm.leases)
        asked = [x.tagged - x.asked for x in farm.leases if x.tagged is not None and x.asked is not None]
        freed = [x.untagged - x.released for x in farm.leases if x.untagged is not None and x.released is not None]
        print(
            f"  {farm.label}: {farm.webhooks} webhook deliveries, {len(farm.sweeps)} sweeps; "
            f"{farm.sandbox_s:.0f} s on the sandbox clock in {farm.real_s:.1f} s real"
        )
        for what, values in (("request → hosts tagged", asked), ("release → hosts untagged", freed)):
            p50, p95, top = percentiles(values)
            ok = "ok" if len(values) == n and p95 <= LATENCY_GOAL_S else "MISSED"
            goal = "the anchor" if farm.label == ANCHOR else f"goal p95 ≤ {LATENCY_GOAL_S:g} s: {ok}"
            print(
                f"    {what:<25} p50 {p50:6.1f} s  p95 {p95:6.1f} s  max {top:6.1f} s  ({len(values)} of {n}; {goal})"
            )
        total = sum(farm.work_s.values())
        parts = ", ".join(f"{fn} {s:.2f} s / {farm.invocations[fn]}" for fn, s in farm.work_s.most_common())
        sweep = statistics.mean(farm.sweeps) if farm.sweeps else math.nan
        print(f"    gpufarm's own work: {total:.2f} s real ({total / n:.2f} s a lease): {parts}")
        print(
            f"    one sweep on this farm: {sweep * 1000:.0f} ms mean, {max(farm.sweeps, default=0) * 1000:.0f} ms max"
        )


def latency(n: int, step_s: float) -> list[Farm]:
    """The three farms of FARMS, one after another, each on its own local host."""
    farm_file = bench_farm_file(Path(tempfile.mkdtemp(prefix="gpufarm-sweep-")))
    return [
        latency_farm(label, quirks, webhooks=webhooks, n=n, step_s=step_s, farm_file=farm_file)
        for label, quirks, webhooks in FARMS
    ]


# -- 2. what a sweep costs at the scale of a real farm ---------------------------------------------------------


@dataclass
class Sweeps:
    """One sandbox's sweeps at one size: every run measured, what they found, and the plain reader's fetches."""

    label: str
    path: FarmPath
    queued: int
    found: list[dict[str, Any]]
    floor: list[tuple[float, float, int]]  # CPU s, wall s, pages

    @property
    def warm(self) -> list[Invocation]:
        """The runs after the first, in the container the first one warmed."""
        return self.path.calls[1:]


def seed_ended(api: scalefarm.Api, plan: scalefarm.Layout, *, threads: int = 4) -> int:
    """As many ended leases as live ones (released, hosts freed: phase reclaimed), created after them."""
    from concurrent.futures import ThreadPoolExecutor

    from gpufarm.config import Settings

    ended = scalefarm.layout(len(plan.hosts), len(plan.leases), prefix="ended-")
    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type)
    now = datetime.now(UTC)

    def create(lease: scalefarm.Lease) -> None:
        values = lease.fields(now) | {
            f.STATE: State.RESOLVED.value,
            f.PHASE: Phase.RECLAIMED.value,
            f.RECLAIM_REASON: ReclaimReason.RELEASED.value,
            f.HOSTS: [],
        }
        attributes = {
            "title": lease.request.title(),
            "customer_impacted": False,
            "fields": f.encode_fields(values),
            "incident_type_uuid": type_id,
        }
        api.ok("POST", "/api/v2/incidents", {"data": {"type": "incidents", "attributes": attributes}})

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, ended.leases))
    return len(ended.leases)


def run_sweeps(api: scalefarm.Api, url: str, runs: int) -> Sweeps:
    """The sweep `runs` times (the first in a fresh container), each measured; then the floor as many times."""
    from gpufarm.handlers import quota_sync

    runner = scalefarm.Runner(api)
    runner.fresh()
    path, found, queued = FarmPath("sweep"), [], 0
    for k in range(runs):
        name = "fresh container" if k == 0 else "warm container"
        found.append(runner.invoke(path, name, "sync", lambda: quota_sync.handle({"job": "sweep"})))
        queued += len(runner.queue.messages)
        runner.queue.messages.clear()
    type_id = runner_type_id(api)
    facets = "facets-400" not in api.ok("GET", "/_sandbox/state")["quirks"]
    floor = [fetch_floor(url, type_id, facets=facets) for _ in range(max(1, runs - 1))]
    return Sweeps("", path, queued, found, floor)


def runner_type_id(api: scalefarm.Api) -> str:
    """gpufarm's incident type id on the sandbox (read outside any measured invocation)."""
    from gpufarm.config import Settings

    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    return str(next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type))


def search_pages(type_id: str, *, facets: bool) -> Iterator[tuple[str, bool, int | None]]:
    """The sweep's two searches as gpufarm sends them (gpufarm.adapters.datadog_incidents): query text, newest
    first, the scan bound; with facets refused, the states alone and no incident type (the fallback)."""
    query: IncidentQuery
    for query in (live_query(), ENDED_QUERY):
        text = f"incident_type:{type_id} AND ({query.text()})" if facets else query.text(facets=False)
        yield text, query.scan is not None, query.scan


def fetch_floor(url: str, type_id: str, *, facets: bool) -> tuple[float, float, int]:
    """The sweep's search pages fetched with plain HTTP and decoded by json.loads only: CPU s, wall s, pages."""
    parsed = urllib.parse.urlsplit(url)
    connection = HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=120)
    cpu, wall, pages = time.process_time(), time.perf_counter(), 0
    try:
        for text, newest, scan in search_pages(type_id, facets=facets):
            offset = 0
            while True:
                params = {"query": text, "page[size]": "100", "page[offset]": str(offset)}
                params |= {"sort": "-created"} if newest else {}
                connection.request("GET", "/api/v2/incidents/search?" + urllib.parse.urlencode(params), headers=KEYS)
                attributes = json.loads(connection.getresponse().read())["data"]["attributes"]
                pages += 1
                got = len(attributes["incidents"])
                offset += got
                total = attributes.get("total")
                if got < 100 or (isinstance(total, int) and offset >= total) or (scan and offset >= scan):
                    break
    finally:
        connection.close()
    return time.process_time() - cpu, time.perf_counter() - wall, pages


def lambda_wall(call: Invocation, vcpu: float) -> float:
    """The invocation's wall time with its CPU at Lambda's vCPU share; the time waiting on the sandbox as measured."""
    return max(0.0, call.wall_s - call.cpu_s) + call.cpu_s / vcpu


def _spread(values: list[float], unit: str, fmt: str = ".2f") -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:{fmt}} {unit}"
    return f"{statistics.median(values):{fmt}} {unit} ({min(values):{fmt}}-{max(values):{fmt}})"


def _datadog_budget(cpu: float, vcpu: float, reads: int) -> str:
    """How long Datadog may take a read before a sweep at Lambda's CPU share passes the goal."""
    room = SHARE_GOAL * INTERVAL_S - cpu / vcpu
    if room <= 0:
        return (
            f"its CPU alone at Lambda's share is {cpu / vcpu / INTERVAL_S:.1%} of the interval: no time left for reads"
        )
    return (
        f"so Datadog may take up to {room / max(1, reads) * 1000:.0f} ms a read ({reads} reads, one after another) "
        f"before a sweep at Lambda's CPU share passes {SHARE_GOAL:.0%}"
    )


def _per_read_ms(calls: list[Invocation]) -> str:
    """The time each read waited on the sandbox (wall beyond CPU), median over the runs."""
    return f"{statistics.median([(c.wall_s - c.cpu_s) / max(1, c.reads) for c in calls]) * 1000:.0f}"


def show_sweeps(size: str, sweeps: Sweeps, memory_mb: int) -> None:
    """Every run of one sandbox's sweeps, the interval shares (local and Lambda) and the floor."""
    vcpu = min(1.0, memory_mb / FULL_VCPU_MB)
    print(f"  {sweeps.label}:")
    for call in sweeps.path.calls:
        endpoints = ", ".join(f"{e} {n}" for e, n in sorted(call.by_endpoint.items()))
        print(
            f"    {call.name:<16} {call.wall_s:6.2f} s wall {call.cpu_s:6.2f} s CPU {call.rss_mb:5.0f} MB peak RSS"
            f"  reads {call.reads:3d} writes {call.writes}  [{endpoints}]"
        )
    found = sweeps.found[-1]
    todo = sum(len(found[k]) for k in ("to_allocate", "to_free", "to_end"))
    print(f"    each sweep saw {found['live']} live leases, {todo} steps waiting; queued {sweeps.queued} (goal 0)")
    warm = sweeps.warm or sweeps.path.calls
    walls = [c.wall_s for c in warm]
    lam = [lambda_wall(c, vcpu) for c in warm]
    share = statistics.median(walls) / INTERVAL_S
    lam_share = statistics.median(lam) / INTERVAL_S
    print(
        f"    warm: {_spread(walls, 's')} wall, {_spread([c.cpu_s for c in warm], 's')} CPU = {share:.1%} of the "
        f"{INTERVAL_S:g} s interval ({'ok' if share <= SHARE_GOAL else 'MISSED'}, goal ≤ {SHARE_GOAL:.0%})"
    )
    print(
        f"    Lambda at {memory_mb} MB ({vcpu:.2f} vCPU): {_spread(lam, 's')} = {lam_share:.1%} of the interval "
        f"({'ok' if lam_share <= SHARE_GOAL else 'MISSED'}, goal ≤ {SHARE_GOAL:.0%})"
    )
    cpu = statistics.median([c.cpu_s for c in warm])
    reads = warm[-1].reads
    print(f"    {_datadog_budget(cpu, vcpu, reads)} (the sandbox here: {_per_read_ms(warm)} ms a read)")
    waited = statistics.median([c.wall_s - c.cpu_s for c in warm])
    room = SHARE_GOAL * INTERVAL_S - waited
    needed = f"{max(LEAST_MB, math.ceil(cpu / room * FULL_VCPU_MB))} MB" if room > 0 else "none: waiting alone is over"
    print(f"    the least MemorySize that keeps it within {SHARE_GOAL:.0%} at the sandbox's answer times: {needed}")
    cpus, fwalls, pages = zip(*sweeps.floor, strict=True)
    print(
        f"    floor, the same {pages[0]} search pages through plain HTTP + json.loads: {_spread(list(cpus), 's')} CPU, "
        f"{_spread(list(fwalls), 's')} wall; the sweep's CPU is {cpu / max(1e-9, statistics.median(cpus)):.1f} x "
        f"the floor's"
    )


def show_growth(results: dict[str, dict[str, Sweeps]]) -> None:
    """Warm sweeps from the small farm to the large one, per sandbox."""
    if not {"small", "large"} <= results.keys():
        return
    print("\n== growth small → large (warm sweeps, medians)")
    for label in results["small"]:
        a, b = results["small"][label].warm, results["large"][label].warm
        wall = statistics.median([c.wall_s for c in b]) / statistics.median([c.wall_s for c in a])
        cpu = statistics.median([c.cpu_s for c in b]) / statistics.median([c.cpu_s for c in a])
        print(
            f"  {label}: {wall:.1f} x wall, {cpu:.1f} x CPU, reads {a[-1].reads} → {b[-1].reads} "
            f"(the farm: 10 x hosts and leases)"
        )


@contextmanager
def sandboxes() -> Iterator[dict[str, tuple[str, scalefarm.Api]]]:
    """A plain sandbox process and one playing `facets-400`, each on its own port; stopped at the end."""
    started: list[Any] = []
    out: dict[str, tuple[str, scalefarm.Api]] = {}
    try:
        for label, quirks in (("plain sandbox", ""), ("facets-400 sandbox", "facets-400")):
            port = free_port()
            proc, _ = start_sandbox(port, quirks=quirks)
            started.append(proc)
            url = f"http://127.0.0.1:{port}"
            out[label] = (url, scalefarm.Api(url))
        yield out
    finally:
        for proc in started:
            proc.terminate()
            proc.wait(timeout=10)


def cost(sizes: list[str], runs: int, memory_mb: int) -> dict[str, dict[str, Sweeps]]:
    """Every size on both sandboxes: seed, settle, sweep `runs` times; printed as it goes."""
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-sweep-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml())
    results: dict[str, dict[str, Sweeps]] = {}
    with sandboxes() as running:
        for size in sizes:
            hosts, leases = SIZES[size]
            results[size] = {}
            print(f"\n== {size}: {hosts:,} hosts / {leases:,} live leases and {leases:,} ended ones")
            for label, (url, api) in running.items():
                os.environ.update(scalefarm.environment(url, farm_file))
                began = time.perf_counter()
                scalefarm.prepare(api)
                plan = scalefarm.layout(hosts, leases)
                scalefarm.seed(api, plan)
                seed_ended(api, plan)
                scalefarm.settle(api)
                del plan
                print(f"  ({label} seeded in {time.perf_counter() - began:.1f} s)")
                sweeps = run_sweeps(api, url, runs)
                sweeps.label = label
                results[size][label] = sweeps
                show_sweeps(size, sweeps, memory_mb)
    show_growth(results)
    return results


def template_limits() -> tuple[int, int]:
    """FUNCTION's Timeout and MemorySize from template.yaml."""
    spec = load_template(ROOT / "template.yaml").functions[FUNCTION]
    return spec.timeout, spec.memory


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="small,large", help="comma-separated: tiny, small, large")
    parser.add_argument(
        "--runs", type=int, default=4, help="sweeps per sandbox and size (the first in a fresh container)"
    )
    parser.add_argument("--requests", type=int, default=20, help="requests per latency farm")
    parser.add_argument("--step", type=float, default=1.5, help="sandbox-clock seconds per step of the latency farms")
    parser.add_argument("--parts", default="cost,latency", help="comma-separated: cost, latency")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    timeout, memory = template_limits()
    TIMEOUT_S["sync"] = timeout
    print(f"template.yaml: {FUNCTION} {timeout} s / {memory} MB, the sweep every {INTERVAL_S:g} s ({SCHEDULE})")
    started = time.perf_counter()
    # The cost first: its peak RSS is then measured before three local hosts have run in this process.
    if "cost" in parts:
        cost(args.sizes.split(","), max(2, args.runs), memory)
    if "latency" in parts:
        show_latency(latency(args.requests, args.step), args.step)
    print(f"\n(benchmarks/sweep.py ran {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
