"""Races against `gpufarm local`: two writers on one incident, and a burst of requests on one team's quota.

Each scenario plays one round on a live local host (the sandbox's Slack users, webhooks and the scheduled sync)
with the Datadog incident API slowed by the sandbox's latency injection, so the two writers' reads and writes
overlap as they would at a realistic 250 ms. A round passes when the incident ends in a state some sequential
order of the two actions gives and each person was told only what happened (checked in the sandbox's Slack
messages). tests/integration/test_races.py runs a few rounds of each; benchmarks/reliability.py runs many and
prints the figures. A new scenario is a function `(RaceFarm, round) -> list[str]` (the problems found; empty
when the round passed) added to SCENARIOS.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufarm.core.config.farm import FarmConfig, parse_farm
from gpufarm.core.governance import charging
from gpufarm.core.governance.policy import GRANTED_PHASES
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, DANA, HOSTS, OPERATORS_CHANNEL

# Datadog's incident API as slow as the issue measured it; host tags and Slack stay fast.
INCIDENT_LATENCY_MS = 250
INCIDENT_PATHS = r"^/api/v2/incidents"
# The second action of a pair follows the first this much later (the "0.1 s later").
GAP_S = 0.1
IDLE_WARNING = "is idle and will be reclaimed"


@dataclass
class RaceFarm:
    """A LocalFarm with the helpers the races share."""

    farm: LocalFarm
    latency_ms: int = INCIDENT_LATENCY_MS

    def slow(self, on: bool = True) -> None:
        """Slow (or stop slowing) the incident API."""
        spec: dict[str, Any] = (
            {"latency_ms": self.latency_ms, "paths": INCIDENT_PATHS} if on and self.latency_ms else {}
        )
        status, body = self.farm.post("/_sandbox/faults", spec)
        if status != 200:
            raise RuntimeError(f"the sandbox refused the fault plan: {body}")

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for every hand-off, webhook and queued command, and for the webhooks they trigger."""
        if not self.farm.settle(timeout=timeout):
            raise RuntimeError("the local host did not settle")
        time.sleep(0.05)
        self.farm.settle(timeout=timeout)

    def allocated(self, project: str, days: int = 7) -> Allocation:
        """Alice gets 8 H100s (within team nlp's quota) the ordinary way, through Slack."""
        self.farm.slash(ALICE, f"request 8 H100 project={project} team=nlp env=onprem-hpc days={days}")
        self.settle()
        found = self.farm.messages(user=ALICE.id, kind="response", contains=f"nlp/{project}`")
        ir = ir_in(found[-1]["text"]) if found else None
        if ir is None or not self.farm.wait_for(lambda: self.farm.allocation(ir).phase is Phase.ALLOCATED):
            raise RuntimeError(f"the round's allocation ({project}) did not happen")
        return self.farm.allocation(ir)

    def answers(self, user: str, ir: int, *, skip: str = " created: ") -> list[str]:
        """The answers (response_url) a user got about one IR, request confirmations left out."""
        found = self.farm.messages(user=user, kind="response", contains=f"IR-{ir}")
        return [m["text"] for m in found if skip not in m["text"]]

    def dms(self, user: str, ir: int, contains: str) -> list[str]:
        """DMs to a user about one IR that contain a phrase."""
        return [
            m["text"] for m in self.farm.messages(user=user, kind="dm", contains=contains) if ir_in(m["text"]) == ir
        ]

    def idle_alert(self, ir: int, transition: str, date: str) -> int:
        """Datadog's idle monitor notifies about one IR (its own date: not a retry of an earlier one)."""
        token = {"X-Gpufarm-Token": self.farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
        body = {"alert_transition": transition, "alert_scope": f"ir:ir-{ir}", "alert_id": "77", "date": date}
        status, _ = self.farm.post("/fn/idle_alert/", body, token)
        return status

    def pair(self, first: Callable[[], Any], second: Callable[[], Any], gap: float = GAP_S) -> None:
        """Run two actions GAP_S apart, each on its own thread, with the incident API slowed."""

        def later() -> None:
            time.sleep(gap)
            second()

        self.slow()
        try:
            threads = [threading.Thread(target=first), threading.Thread(target=later)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            self.settle()
        finally:
            self.slow(False)
        self.settle()


def _reclaimed(race: RaceFarm, alloc: Allocation, reason: ReclaimReason) -> list[str]:
    """The round's allocation ended, for this reason, and its host carries no tag of it."""
    problems = []
    if not race.farm.wait_for(lambda: race.farm.allocation(alloc.ir).phase is Phase.RECLAIMED, timeout=20):
        problems.append(f"{alloc.ir_label} ended {race.farm.allocation(alloc.ir).phase.value}, not reclaimed")
    final = race.farm.allocation(alloc.ir)
    if final.reclaim_reason is not reason:
        problems.append(f"{alloc.ir_label} reclaimed for {final.reclaim_reason}, not {reason.value}")
    problems += [f"{h} still tagged {alloc.ir_tag}" for h in alloc.hosts if alloc.ir_tag in race.farm.ir_tags(h)]
    return problems


def release_and_extend(race: RaceFarm, n: int) -> list[str]:
    """`/gpu release IR-n`, then `/gpu extend IR-n` 0.1 s later: the release is never lost."""
    alloc = race.allocated(f"rel-ext-{n}")
    race.pair(
        lambda: race.farm.slash(ALICE, f"release {alloc.ir_label} now"),
        lambda: race.farm.slash(ALICE, f"extend {alloc.ir_label} 2"),
    )
    problems = _reclaimed(race, alloc, ReclaimReason.RELEASED)
    answers = race.answers(ALICE.id, alloc.ir)
    released = [a for a in answers if "being released" in a]
    extended = [a for a in answers if "extended by" in a]
    too_late = [a for a in answers if "nothing to extend" in a]
    final = race.farm.allocation(alloc.ir)
    if len(released) != 1 or len(answers) != 2:
        problems.append(f"answers {answers}")
    # Either order is sequential; the answers must say which one happened, and the incident must agree.
    if extended and final.duration_days != (alloc.duration_days or 0) + 2:
        problems.append("told extended, but the incident was not")
    if not extended and (len(too_late) != 1 or final.duration_days != alloc.duration_days):
        problems.append(f"extend answered {answers}, duration {final.duration_days}")
    return problems


def release_and_idle_warning(race: RaceFarm, n: int) -> list[str]:
    """`/gpu release IR-n` and the idle monitor's Triggered together: released, warned only if it came first."""
    alloc = race.allocated(f"rel-idle-{n}")
    race.pair(
        lambda: race.farm.slash(ALICE, f"release {alloc.ir_label} now"),
        lambda: race.idle_alert(alloc.ir, "Triggered", f"{n}-release"),
        gap=0.0,
    )
    problems = _reclaimed(race, alloc, ReclaimReason.RELEASED)
    answers = race.answers(ALICE.id, alloc.ir)
    if [a for a in answers if "being released" in a] != answers or len(answers) != 1:
        problems.append(f"answers {answers}")
    warned = race.dms(ALICE.id, alloc.ir, IDLE_WARNING)
    final = race.farm.allocation(alloc.ir)
    # Warned before the release (a sequential order) or not at all; never a warning the incident does not show.
    if len(warned) > 1 or bool(warned) != (final.idle_warned_at is not None):
        problems.append(f"idle warnings {len(warned)}, incident warned at {final.idle_warned_at}")
    return problems


def expiry_and_keep(race: RaceFarm, n: int) -> list[str]:
    """The scheduled sync expires an idle-warned allocation while Alice clicks Keep: it expires either way."""
    alloc = race.allocated(f"exp-keep-{n}", days=1)
    race.idle_alert(alloc.ir, "Triggered", f"{n}-keep")
    race.settle()
    warning = [
        m for m in race.farm.messages(user=ALICE.id, kind="dm", contains=IDLE_WARNING) if ir_in(m["text"]) == alloc.ir
    ]
    if not warning:
        return [f"{alloc.ir_label} was never warned"]
    race.farm.host.schedules_paused = True
    try:
        race.farm.post("/_sandbox/clock", {"advance": 86_400 + 60})
        race.pair(
            lambda: race.farm.host.submit("QuotaSyncFunction", {"job": "quota_sync"}),
            lambda: race.farm.click(ALICE, warning[-1], "gpu_keep"),
            gap=0.0,
        )
    finally:
        race.farm.host.schedules_paused = False
    problems = _reclaimed(race, alloc, ReclaimReason.EXPIRED)
    answers = race.answers(ALICE.id, alloc.ir)
    kept = [a for a in answers if "kept" in a]
    too_late = [a for a in answers if "nothing to keep" in a]
    final = race.farm.allocation(alloc.ir)
    if len(answers) != 1 or len(kept) + len(too_late) != 1:
        problems.append(f"answers {answers}")
    # Kept first: the warning was cleared before the expiry; expired first: the warning is still on record.
    if bool(kept) != (final.idle_warned_at is None):
        problems.append(f"told {answers}, incident warned at {final.idle_warned_at}")
    return problems


def approve_and_reject(race: RaceFarm, n: int) -> list[str]:
    """An operator's Approve click and a reject command (with its reason) on one request beyond quota: exactly one
    decision stands."""
    race.farm.slash(BOB, f"request 12 H100 project=ar-{n} team=vision env=onprem-hpc days=1")
    race.settle()
    asks = [
        m
        for m in race.farm.messages(channel=OPERATORS_CHANNEL, contains="needs approval")
        if f"vision/ar-{n}`" in json.dumps(m["blocks"])
    ]
    if not asks:
        return [f"request ar-{n} never reached the operators"]
    ir = ir_in(asks[-1]["text"])
    assert ir is not None
    race.pair(
        lambda: race.farm.click(DANA, asks[-1], "gpu_approve"),
        lambda: race.farm.slash(DANA, f"reject IR-{ir} no budget for round {n}"),
        gap=0.0,
    )
    final = race.farm.allocation(ir)
    problems = _one_decision(race, ir, final)
    # Free the pool for the next round.
    if final.state is not State.RESOLVED:
        race.farm.slash(DANA, f"reclaim IR-{ir} end of round")
        race.settle()
    return problems


def _one_decision(race: RaceFarm, ir: int, final: Allocation) -> list[str]:
    """Exactly one of the approval and the rejection stood: in the operator's answers, the requester's DMs and the
    allocation's phase."""
    answers = race.answers(DANA.id, ir)
    approved = [a for a in answers if "approved; allocating" in a]
    rejected = [a for a in answers if a.endswith("rejected.")]
    refused = [a for a in answers if "cannot be" in a]
    problems = []
    if len(approved) + len(rejected) != 1 or len(refused) != 1:
        problems.append(f"operator answers {answers}")
    told = race.dms(BOB.id, ir, "approved") + race.dms(BOB.id, ir, "rejected")
    if len(told) != 1:
        problems.append(f"requester told {told}")
    if approved and final.phase not in GRANTED_PHASES:
        problems.append(f"approved, but {final.phase.value}")
    if rejected and final.phase is not Phase.REJECTED:
        problems.append(f"rejected, but {final.phase.value}")
    return problems


SCENARIOS: dict[str, Callable[[RaceFarm, int], list[str]]] = {
    "release + extend": release_and_extend,
    "release + idle warning": release_and_idle_warning,
    "expiry + keep": expiry_and_keep,
    "approve + reject": approve_and_reject,
}


@dataclass
class Tally:
    """Rounds of one scenario: how many ended as a sequential order would, and the first problems seen."""

    rounds: int = 0
    failed: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, problems: list[str]) -> None:
        """Count one round."""
        self.rounds += 1
        if problems:
            self.failed += 1
            self.problems += problems[: max(0, 10 - len(self.problems))]


def run_scenario(race: RaceFarm, name: str, rounds: int) -> Tally:
    """Play one scenario `rounds` times."""
    tally = Tally()
    start = time.monotonic()
    for n in range(rounds):
        tally.add(SCENARIOS[name](race, n))
    tally.seconds = time.monotonic() - start
    return tally


# -- the quota burst --------------------------------------------------------------------------------------------------

BURST_TEAM, BURST_POOL, BURST_MODEL = "nlp", "onprem-hpc", "H100"
# Team nlp's members in the sandbox's workspace (alice; emulator.slack_workspace.TEAM_USERGROUPS): anyone else's
# request for nlp is refused on membership and never reaches the quota.
BURST_USERS = (ALICE,)
# More than the quota and, charged as whole hosts (2 of onprem-hpc's 8-GPU hosts), the whole hard limit: an ask the
# policy never grants and the operators are asked for only while nothing else of the team's is granted.
BIG_ASK = 10
# How often the big asks look for the burst's first grant.
GRANT_POLL_S = 0.05


@dataclass
class Burst:
    """What a burst of concurrent requests on one team's quota ended as."""

    sent: int
    incidents: int
    # GPUs the burst's grants count against the team's quota: the whole hosts they take
    # (gpufarm.core.governance.charging).
    granted_by_policy: int
    granted_after_approvals: int
    quota: int
    hard_limit: int
    answered: int
    refused: int
    to_operators: int
    double_held_hosts: list[str]
    seconds: float
    problems: list[str]


def quota_burst(
    race: RaceFarm, count: int, *, gpus: int = 2, approvals: int | None = None, latency_ms: int | None = None
) -> Burst:
    """`count` concurrent `/gpu request {gpus} H100 team=nlp env=onprem-hpc`, then pending ones approved at once.

    Every fifth asks for BIG_ASK GPUs instead, sent once the burst's first grant by policy is in the incidents, while
    the other asks are still being decided: on top of that grant it is over the hard limit, so it is refused
    whatever order the rest arrive in (decided before any grant, it would go to the operators). `approvals` caps
    how many pending requests the operator approves together (None: all of them; enough to pass the hard limit is
    what the check needs). Granted by policy must stay within the quota, granted in all within the hard limit
    (operators' approvals are re-checked in the pool's queue group too), every requester answered with a decision
    on the quota, no host in two incidents. `latency_ms` overrides the race's injected latency for the burst (the
    concurrency itself is the race here; 0 keeps a CI-sized burst short).
    """
    if latency_ms is not None:
        race = RaceFarm(race.farm, latency_ms=latency_ms)
    farm = race.farm
    wait = 60.0 + 3.0 * count
    # The farm the local functions read (gpufarm local's default).
    config = parse_farm((farm.host.root / "config" / "farm.example.yaml").read_text())
    limits = config.quota(BURST_TEAM, BURST_POOL, BURST_MODEL)
    assert limits is not None and limits.hard_limit is not None
    start = time.monotonic()
    before = {who.id: len(farm.messages(user=who.id, kind="response")) for who in BURST_USERS}
    sent_by = Counter(BURST_USERS[i % len(BURST_USERS)].id for i in range(count))

    granted = threading.Event()
    watcher = threading.Thread(target=_watch_for_a_grant, args=(farm, config, granted, wait), daemon=True)
    watcher.start()
    _together(race, [_ask(farm, i, gpus, granted, wait) for i in range(count)], wait)
    watcher.join(timeout=wait)
    by_policy = _granted(farm, config)
    problems: list[str] = [] if granted.is_set() else [f"nothing granted by policy within {wait:.0f} s"]
    answered, refused, to_operators = _requesters_answered(farm, before, sent_by, problems)
    if by_policy > limits.gpus:
        problems.append(f"policy granted {by_policy} GPUs against a quota of {limits.gpus}")
    after = _approve_pending(race, config, approvals, wait, problems)
    if after > limits.hard_limit:
        problems.append(f"granted {after} GPUs against a hard limit of {limits.hard_limit}")
    holders = _holders(farm)
    double = [h for h, irs in holders.items() if len(irs) > 1]
    problems += [f"{h} held by {', '.join(holders[h])}" for h in double]
    burst = Burst(
        sent=count,
        incidents=len(_burst(farm)),
        granted_by_policy=by_policy,
        granted_after_approvals=after,
        quota=limits.gpus,
        hard_limit=limits.hard_limit,
        answered=answered,
        refused=refused,
        to_operators=to_operators,
        double_held_hosts=double,
        seconds=time.monotonic() - start,
        problems=problems,
    )
    _end_burst(race, wait)
    return burst


def _ask(farm: LocalFarm, i: int, gpus: int, granted: threading.Event, wait: float) -> Callable[[], Any]:
    """The burst's i-th request; every fifth asks for BIG_ASK GPUs, and only once a grant by policy is in."""
    who = BURST_USERS[i % len(BURST_USERS)]
    text = f"request {gpus} {BURST_MODEL} project=burst-{i} team={BURST_TEAM} env={BURST_POOL} days=1"
    if i % 5 != 4:
        return lambda: farm.slash(who, text)
    big = text.replace(f"request {gpus} ", f"request {BIG_ASK} ", 1)

    def once_granted() -> None:
        granted.wait(timeout=wait)
        farm.slash(who, big)

    return once_granted


def _watch_for_a_grant(farm: LocalFarm, config: FarmConfig, granted: threading.Event, wait: float) -> None:
    """Set `granted` once an incident of the burst is granted (or give up after `wait` seconds)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _granted(farm, config) > 0:
            granted.set()
            return
        time.sleep(GRANT_POLL_S)


def _decided(answer: str) -> bool:
    """An answer that decides a request on the quota: created (by policy or for the operators) or refused."""
    return " created: " in answer or "refused" in answer


def _requesters_answered(
    farm: LocalFarm, before: dict[str, int], sent_by: Counter[str], problems: list[str]
) -> tuple[int, int, int]:
    """Answers the requesters got since `before` (all, refusals, sent to the operators); one per request, or a
    problem noted."""
    answered = refused = to_operators = 0
    for who in BURST_USERS:
        texts = [m["text"] for m in farm.messages(user=who.id, kind="response")[before[who.id] :]]
        answered += len(texts)
        refused += sum("refused" in t for t in texts)
        to_operators += sum("Sent to the GPU operators" in t for t in texts)
        if len(texts) != sent_by[who.id]:
            problems.append(f"{who.name}: {sent_by[who.id]} requests, {len(texts)} answers")
        problems += [f"{who.name} answered {t[:120]!r}" for t in texts if not _decided(t)]
    return answered, refused, to_operators


def _approve_pending(
    race: RaceFarm, config: FarmConfig, approvals: int | None, wait: float, problems: list[str]
) -> int:
    """The operator approves (up to `approvals` of) the pending requests at once; the GPUs granted after, and a
    problem noted unless every approval was answered."""
    farm = race.farm
    pending = sorted((a for a in _burst(farm) if a.phase is Phase.REQUESTED), key=lambda a: a.ir)[:approvals]
    _together(race, [_approve(farm, a.ir_label) for a in pending], wait)
    after = _granted(farm, config)
    asked = {a.ir for a in pending}
    answers = [m["text"] for m in farm.messages(user=DANA.id, kind="response") if ir_in(m["text"]) in asked]
    if len(answers) != len(pending):
        problems.append(f"{len(pending)} approvals, {len(answers)} answers")
    return after


def _approve(farm: LocalFarm, label: str) -> Callable[[], Any]:
    return lambda: farm.slash(DANA, f"approve {label}")


def _together(race: RaceFarm, calls: list[Callable[[], Any]], wait: float) -> None:
    """Start every call at once (a barrier), with the incident API slowed, and wait for all they set off."""
    if not calls:
        return
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> None:
        barrier.wait()
        call()

    race.slow()
    try:
        threads = [threading.Thread(target=run, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=wait)
        race.settle(timeout=wait)
    finally:
        race.slow(False)
    race.settle(timeout=wait)


def _granted(farm: LocalFarm, config: FarmConfig) -> int:
    """GPUs the burst's granted incidents count against their team's quota (whole hosts on a dedicated pool)."""
    return sum(charging.held(a, config, _host_sizes) for a in _burst(farm) if a.phase in GRANTED_PHASES)


def _host_sizes(environment: str, gpu_model: str) -> charging.HostSizes:
    """Hosts per (cluster, GPUs per host) of one pool's model, in the farm LocalFarm seeds."""
    return Counter(
        (cluster, gpus) for _, model, gpus, env, cluster in HOSTS if (env, model) == (environment, gpu_model)
    )


def _burst(farm: LocalFarm) -> list[Allocation]:
    return [a for a in farm.incidents() if (a.project or "").startswith("burst-")]


def _holders(farm: LocalFarm) -> dict[str, list[str]]:
    hosts = {h for a in farm.incidents() for h in a.hosts} | {"hpc-a-01", "hpc-a-02", "hpc-b-01", "hpc-b-02"}
    return {h: farm.ir_tags(h) for h in sorted(hosts)}


def _end_burst(race: RaceFarm, wait: float) -> None:
    """Reclaim what the burst left live, so a later scenario starts from a free pool."""
    for a in _burst(race.farm):
        if a.state is not State.RESOLVED:
            race.farm.slash(DANA, f"reclaim {a.ir_label} end of burst")
    race.settle(timeout=wait)
