"""Idle reclaim timing on the sandbox clock, with the farm's default idle policy (config/farm.example.yaml).

Each case runs on a fresh local environment (`gpufarm local`'s sandbox and functions, the Datadog setup with the
idle monitors `gpufarm datadog apply` makes from the policy), with the real gpufarm-node agent on fake NVML pushing
one cycle per simulated minute and the sandbox evaluating the monitors once per minute (Datadog's evaluation
period). A lease's job runs for BUSY_MINUTES, then its GPUs go idle in the case's way (the idle onset); the clock
runs until the lease (or its idle part) is warned and then reclaimed, and the times come from the incident itself
(the warning's time in its idle state, the reclaim in its history, the given-back host in its returned list):

- idle: no process on an 8-GPU lease's GPUs;
- idle_held: a process holding memory with no activity ("alive but useless");
- low_utilization: a process busy 8 % of the time at 10 % (under the 5 % mean, but never idle for a whole window);
- partly idle: a 16-GPU lease on two hosts, one host's job stops (idle.partial: reclaim gives that host back);
- sliced device: a one-slice lease on a MIG host (a100-mig-slicing: 2 x A100 in 7 x 1g.10gb) of the shared pool,
  its exact slice assigned by the allocator (gpufarm_devices, gpu_assign tag), its job carrying GPUFARM_IR; the
  slice goes idle.

The goal beside each figure is the policy's window (+ grace for the reclaim) plus at most one evaluation period.

Run: .venv/bin/python benchmarks/idle.py [--only idle,partly] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from gpufarm.core.config.farm import IdleKind, IdlePolicy, parse_farm
from gpufarm.core.kernel import history, units
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation, parse_time
from gpufarm_node.topology import ProcessSpec, Profile, container_id
from gpufarm_sandbox.demo import slicing_stage
from gpufarm_sandbox.demo.lifecycle_stage import ALICE, BOB, DANA, HOSTS, OPERATORS_CHANNEL, LocalFarm, Person
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
from gpufarm_sandbox.localhost import LocalEnv, start_local
from gpufarm_sandbox.simfarm import HostSpec, SimulatedFarm, simulate_hosts

STEP_S = 60.0  # one agent cycle and one monitor evaluation per simulated minute
EVALUATION_MIN = STEP_S / 60
BUSY_MINUTES = 10
LIMIT_MIN = 400  # simulated minutes a case may run before it is called missing


@dataclass
class Row:
    """One case's figures: minutes from idle onset to the warning and to the reclaim, and their goals."""

    case: str
    kind: str
    window_min: int
    grace_min: int
    warned_min: float | None
    warn_goal_min: float
    reclaimed_min: float | None
    reclaim_goal_min: float
    warned_by: str
    note: str = ""

    @property
    def ok(self) -> bool:
        """Both figures present and within their goals."""
        return (
            self.warned_min is not None
            and self.reclaimed_min is not None
            and self.warned_min <= self.warn_goal_min
            and self.reclaimed_min <= self.reclaim_goal_min
        )


class Bench:
    """One case's local farm, simulated nodes and sandbox clock."""

    def __init__(self, local: LocalEnv) -> None:
        self.local = local
        self.farm = LocalFarm.ready(local)
        self.nodes: SimulatedFarm | None = None
        config = (local.host.root / "config" / "farm.example.yaml").read_text()
        self.config = parse_farm(config)

    def policy(self, environment: str, team: str) -> IdlePolicy:
        return self.config.idle.policy(environment, team)

    def now(self) -> float:
        return float(self.local.sandbox.clock.now())

    def simulate(self, specs: list[HostSpec]) -> SimulatedFarm:
        self.nodes = simulate_hosts(
            specs,
            self.local.url,
            DEFAULT_DD_API_KEY,
            DEFAULT_DD_APP_KEY,
            clock=self.local.sandbox.clock.now,
            background=False,
        )
        return self.nodes

    def minute(self) -> None:
        assert self.nodes is not None
        self.nodes.step_all()
        self.farm.post("/_sandbox/clock", {"advance": STEP_S})
        self.farm.settle(timeout=20)

    def run_until(self, done: Callable[[], bool], limit: int = LIMIT_MIN) -> bool:
        for _ in range(limit):
            if done():
                return True
            self.minute()
        return done()

    def ask(self, person: Person, text: str, *, approve: bool = False) -> Allocation | None:
        ir = self.farm.request_ir(person, text)
        if ir is None:
            return None
        if approve:
            asked = self.farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} needs approval")
            if asked:
                self.farm.click(DANA, asked[-1], "gpu_approve")
                self.farm.settle()
        lease = self.farm.allocation(ir)
        return lease if lease.phase is Phase.ALLOCATED else None

    def close(self) -> None:
        if self.nodes is not None:
            self.nodes.stop()
        self.farm.close()


def _spec(host: str) -> HostSpec:
    name, model, gpus, env, cluster = next(h for h in HOSTS if h[0] == host)
    return HostSpec(name, env, cluster, model, gpus)


def _minutes(moment: datetime | None, onset: float) -> float | None:
    return None if moment is None else round((moment.timestamp() - onset) / 60, 1)


def _history(lease: Allocation, step: history.Step) -> list[history.Entry]:
    entries = (history.parse(line) for line in lease.history)
    return [e for e in entries if e is not None and e.step == step.value]


def _warned_kind(lease: Allocation) -> str:
    warned = _history(lease, history.Step.WARNED)
    details = warned[0].details if warned else ""
    return details.split(";")[0].removeprefix("kind ").strip() or "-"


def _part_since(part: str, field: tuple[str, ...]) -> datetime | None:
    """The time of a part's entry in gpufarm_idle_parts (`part=time`) or gpufarm_idle_returned (`part=n@time`)."""
    for entry in field:
        name, _, rest = entry.rpartition("=")
        if name == part:
            return parse_time(rest.rpartition("@")[2])
    return None


def _row(case: str, policy: IdlePolicy, kind: IdleKind = IdleKind.IDLE) -> Row:
    """A case's row before it runs: the policy's window and grace, and the goals they make."""
    window = policy.kinds[kind].window_minutes
    warn_goal = window + EVALUATION_MIN
    return Row(
        case, kind.value, window, policy.grace_minutes, None, warn_goal, None, warn_goal + policy.grace_minutes, "-"
    )


def _measure(bench: Bench, row: Row, ir: int, go_idle: Callable[[], None], part: str | None = None) -> Allocation:
    """Keep the lease's job busy BUSY_MINUTES, make it idle (`go_idle`: the onset), run the clock until the lease is
    warned and then reclaimed, and put the minutes since the onset in `row`; the lease as it ends is returned.

    With `part` (a host of the lease) only that host goes idle: the warning and the reclaim are that part's
    (gpufarm_idle_parts, gpufarm_idle_returned), and the lease itself stays.
    """
    for _ in range(BUSY_MINUTES):
        bench.minute()
    go_idle()
    onset = bench.now()

    def lease() -> Allocation:
        return bench.farm.allocation(ir)

    if part is None:
        bench.run_until(lambda: lease().phase is not Phase.ALLOCATED)
        bench.run_until(lambda: lease().phase in (Phase.RECLAIMING, Phase.RECLAIMED))
        final = lease()
        row.warned_min = _minutes(final.idle_warned_at, onset)
        reclaimed = _history(final, history.Step.RECLAIMED)
        row.reclaimed_min = _minutes(reclaimed[0].at, onset) if reclaimed else None
    else:
        bench.run_until(lambda: bool(lease().idle_parts))
        warned = lease()
        bench.run_until(lambda: part not in lease().hosts)
        final = lease()
        row.warned_min = _minutes(_part_since(part, warned.idle_parts), onset)
        row.reclaimed_min = _minutes(_part_since(part, final.idle_returned), onset)
    row.warned_by = _warned_kind(final)
    return final


def _low_utilization(bench: Bench, host: str) -> None:
    """Each GPU's job computes 8 % of the time at 10 % activity: a mean under 5 %, never a whole idle window."""
    assert bench.nodes is not None
    node = bench.nodes.node(host)
    bench.nodes.set_profile(host, "idle")  # the busy job ends
    fake = node.fake
    for index in range(node.spec.gpus):
        memory = fake.gpu_spec(index).memory_mib * 0.4
        ir = node.assignments.get((index, None))
        env = {"GPUFARM_IR": ir.upper()} if ir else {}
        fake.add_process(
            ProcessSpec(
                pid=90_000 + index,
                gpu=index,
                mig=None,
                memory_mib=Profile("constant", value=memory),
                sm=Profile("square", high=10, low=0, period=25 * 60, duty=0.08),
                start=fake.now(),
                env=env,
                docker=container_id(f"{host}/{ir or 'low'}"),
            )
        )


def whole_lease(kind: IdleKind) -> Callable[[LocalEnv], Row]:
    """An 8-GPU lease on one host going idle in `kind`'s way."""

    def case(local: LocalEnv) -> Row:
        bench = Bench(local)
        row = _row(kind.value, bench.policy("onprem-hpc", "nlp"), kind)
        try:
            lease = bench.ask(ALICE, "request 8 H100 project=bench team=nlp env=onprem-hpc days=7")
            if lease is None:
                row.note = "not allocated"
                return row
            host = lease.hosts[0]
            nodes = bench.simulate([_spec(host)])
            nodes.assign(host, lease.ir)
            nodes.set_profile(host, "busy")

            def go_idle() -> None:
                if kind is IdleKind.IDLE:
                    nodes.set_profile(host, "idle")
                elif kind is IdleKind.IDLE_HELD:
                    nodes.set_profile(host, "idle-held")
                else:
                    _low_utilization(bench, host)

            _measure(bench, row, lease.ir, go_idle)
            return row
        finally:
            bench.close()

    return case


def partly_idle(local: LocalEnv) -> Row:
    """A 16-GPU lease on two hosts; one host's job stops and that host is given back."""
    bench = Bench(local)
    row = _row("partly idle (1 of 2 hosts)", bench.policy("onprem-hpc", "vision"))
    try:
        text = "request 16 H100 project=bench team=vision env=onprem-hpc days=7"
        lease = bench.ask(BOB, text, approve=True)
        if lease is None or len(lease.hosts) != 2:
            row.note = "not allocated on two hosts"
            return row
        busy_host, idle_host = sorted(lease.hosts)
        nodes = bench.simulate([_spec(busy_host), _spec(idle_host)])
        for host in (busy_host, idle_host):
            nodes.assign(host, lease.ir)
            nodes.set_profile(host, "busy")
        lease = _measure(bench, row, lease.ir, lambda: nodes.set_profile(idle_host, "idle"), part=idle_host)
        kept = lease.hosts == (busy_host,) and lease.phase is Phase.ALLOCATED
        row.note = f"kept {busy_host}" if kept else f"lease now {lease.phase.value} on {', '.join(lease.hosts)}"
        return row
    finally:
        bench.close()


def sliced_device(local: LocalEnv) -> Row:
    """A one-slice lease on the MIG host of the shared pool; its slice goes idle."""
    bench = Bench(local)
    pool = slicing_stage.POOL
    row = _row("sliced device (1g.10gb)", bench.policy(pool, "vision"))
    try:
        # The pool's plain A100 host is taken first, so the lease lands on a slice.
        if bench.ask(ALICE, f"request 8 A100 project=filler team=nlp env={pool} days=7", approve=True) is None:
            row.note = "the plain A100 host could not be filled"
            return row
        nodes = bench.simulate([HostSpec(*slicing_stage.HOST)])
        nodes.step_all()  # registration: the slices' gpu_unit tags
        lease = bench.ask(BOB, f"request 1 A100 project=bench team=vision env={pool} days=3")
        host = slicing_stage.HOST[0]
        held = units.lease_devices(lease).get(host, ()) if lease is not None else ()
        if lease is None or len(held) != 1 or held[0].uuid is None:
            row.note = "not allocated on one slice"
            return row
        slot = slicing_stage.nodes_slot(nodes, held[0].uuid)
        # The job carries GPUFARM_IR too: the lease is attributed whether or not the agent reads gpu_assign tags.
        nodes.assign(host, lease.ir, gpus=[slot])
        nodes.set_profile(host, "busy", gpus=[slot])
        _measure(bench, row, lease.ir, lambda: nodes.set_profile(host, "idle", gpus=[slot]))
        row.note = f"slice {slot} of {host}"
        return row
    finally:
        bench.close()


CASES: dict[str, Callable[[LocalEnv], Row]] = {
    "idle": whole_lease(IdleKind.IDLE),
    "idle_held": whole_lease(IdleKind.IDLE_HELD),
    "low_utilization": whole_lease(IdleKind.LOW_UTILIZATION),
    "partly": partly_idle,
    "sliced": sliced_device,
}


def _cell(value: float | None) -> str:
    return "missing" if value is None else f"{value:g}"


def table(rows: list[Row]) -> str:
    """The figures beside their goals, one line per case."""
    head = ("case", "warned by", "window", "grace", "warned", "goal", "reclaimed", "goal", "ok")
    lines = [
        (
            r.case,
            r.warned_by,
            str(r.window_min),
            str(r.grace_min),
            _cell(r.warned_min),
            f"<= {r.warn_goal_min:g}",
            _cell(r.reclaimed_min),
            f"<= {r.reclaim_goal_min:g}",
            "yes" if r.ok else "NO",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [head, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r.case}: {r.note}" for r in rows if r.note]
    return "\n".join(out + (["", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    """Run the cases (or `--only` some), print the table; exit 1 when a figure is missing or over its goal."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--only", default="", help=f"comma-separated cases of {', '.join(CASES)}")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON as well")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.only.split(",") if c.strip()] or list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    rows: list[Row] = []
    started = time.perf_counter()
    with start_local(port=0) as local:
        for name in chosen:
            began = time.perf_counter()
            row = CASES[name](local)
            rows.append(row)
            print(
                f"{row.case}: warned {_cell(row.warned_min)} min, reclaimed {_cell(row.reclaimed_min)} min after "
                f"the onset ({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
    print(
        f"\nminutes from idle onset, sandbox clock, evaluation every {EVALUATION_MIN:g} min, default policy "
        f"({time.perf_counter() - started:.0f} s in all)\n"
    )
    print(table(rows))
    if args.json:
        print(json.dumps([asdict(r) | {"ok": r.ok} for r in rows], indent=2))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
