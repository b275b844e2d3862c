"""A bad day on `gpufarm local`: 20 % of the Datadog and Slack API calls answered 429, 500 or 503, half of the
5xx after the call was served (the write landed, the answer was lost).

The scenario plays waves of eight requests, one of each kind in KINDS (each on its own team x pool x model quota,
so no request's decision depends on another's order), through the real path: signed slash commands, operators'
approvals and rejections, releases, an extension, idle warnings and a recovery through the idle alert Function
URL, and expiries (idle grace included) by moving the sandbox clock a day and running the scheduled sync. Each
wave ends with all its allocations over, so the next starts from free pools. Then the faults stop, the queues
drain, one sync runs, and `check` compares every request with the state a fault-free sequential run gives it:
nothing lost, nothing doubled (one incident per request, one extension), no host in two incidents (checked at
every wave's peak), no gpufarm tag left on any host, every requester and every action answered.

The harness reads the sandbox (incidents, host tags) with the faults paused: what it checks is what gpufarm did,
not whether the checker's own reads got through. tests/hardening/test_faults.py runs a few waves;
benchmarks/reliability.py runs 200 requests and prints the figures.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.model import Allocation
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.example_farm import ALICE, BOB, CAROL, DANA, HOSTS, PEOPLE, Person

FAULT_RATE = 0.2
FAULT_STATUSES = (429, 500, 503)
# How many times a user asks again after "try again in a minute" (membership unreadable while Slack fails).
RETRIES = 3
# Half of the injected 5xx come after the request was served (the write landed, its answer lost).
FAULT_AFTER = 0.5
# The Datadog API, Slack's Web API and its response_urls; never the sandbox's own inspection endpoints.
FAULT_PATHS = r"^/(api|slack)/"
# Datadog re-sends a webhook that got a 5xx; the idle monitor here does the same.
ALERT_ATTEMPTS = 6
DAY_S = 86_400
ALLOC_TAG_KEYS = ("ir", "project", "team")
DEDICATED_POOLS = ("onprem-hpc", "cloud-aws")


@dataclass(frozen=True)
class Kind:
    """One request of a wave: who asks for what, and the end a fault-free run gives it."""

    name: str
    user: Person
    team: str
    env: str
    count: int
    model: str
    days: int
    phase: Phase
    reason: ReclaimReason | None


KINDS = (
    # Within quota, approved by policy, released by the requester.
    Kind("release", ALICE, "nlp", "onprem-hpc", 8, "H100", 14, Phase.RECLAIMED, ReclaimReason.RELEASED),
    # Within quota, one day: expired by the sync once the clock passes it.
    Kind("expire", BOB, "vision", "onprem-hpc", 8, "H100", 1, Phase.RECLAIMED, ReclaimReason.EXPIRED),
    # Within quota, extended by 2 days (exactly once), then released.
    Kind("extend", ALICE, "nlp", "cloud-aws", 8, "H100", 14, Phase.RECLAIMED, ReclaimReason.RELEASED),
    # Within quota, warned idle, still idle past the grace period: reclaimed by the sync.
    Kind("idle", CAROL, "speech", "cloud-aws", 8, "A100", 14, Phase.RECLAIMED, ReclaimReason.IDLE),
    # Beyond quota: an operator approves; one day, so it expires.
    Kind("approve", ALICE, "nlp", "shared-slices", 6, "A100", 1, Phase.RECLAIMED, ReclaimReason.EXPIRED),
    # Within quota, warned idle, busy again (the warning cleared), then released.
    Kind("recover", BOB, "vision", "shared-slices", 4, "L4", 14, Phase.RECLAIMED, ReclaimReason.RELEASED),
    # Beyond quota: an operator rejects.
    Kind("reject", CAROL, "speech", "shared-slices", 4, "L4", 3, Phase.REJECTED, None),
    # Over the hard limit: refused (up front, or in the group when the up-front check could not read Datadog).
    Kind("refuse", BOB, "vision", "shared-slices", 6, "A100", 3, Phase.REJECTED, None),
)
EXTEND_DAYS = 2


@dataclass
class Request:
    """One request of the scenario and what it became."""

    wave: int
    kind: Kind
    ir: int | None = None

    @property
    def project(self) -> str:
        """The request's project: unique in the run, so its incident is found by it."""
        return f"bd{self.wave}-{self.kind.name}"

    def text(self) -> str:
        """The slash command."""
        k = self.kind
        return f"request {k.count} {k.model} project={self.project} team={k.team} env={k.env} days={k.days}"


@dataclass
class Report:
    """The fault day's figures (every count but `requests` and `told` should be 0)."""

    requests: int = 0
    lost: int = 0
    doubled: int = 0
    hosts_in_two: int = 0
    orphan_tags: int = 0
    told: int = 0
    untold: int = 0
    faults_injected: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        """Note a problem (the first 20 are kept)."""
        if len(self.problems) < 20:
            self.problems.append(text)

    @property
    def ok(self) -> bool:
        """True when nothing was lost, doubled, shared, orphaned or left untold."""
        return not (self.lost or self.doubled or self.hosts_in_two or self.orphan_tags or self.untold)


class BadDay:
    """Plays the fault day against a ready LocalFarm."""

    def __init__(self, farm: LocalFarm, *, rate: float = FAULT_RATE, seed: int = 8) -> None:
        self.farm = farm
        self.rate = rate
        self.seed = seed
        self.injected = 0
        self.report = Report()
        self.requests: list[Request] = []
        self._faulty = False

    # -- faults -------------------------------------------------------------------------------------------------

    def faults(self, on: bool) -> None:
        """Start (a fresh seeded plan) or stop injecting; counts what the stopped plan injected."""
        if self._faulty:
            self.injected += int(self.farm.get("/_sandbox/faults").get("injected", 0) or 0)
        status, body = self.farm.post("/_sandbox/faults", {})
        if status != 200:
            raise RuntimeError(f"the sandbox refused to clear faults: {body}")
        self._faulty = on and self.rate > 0
        if self._faulty:
            self.seed += 1
            spec = {
                "rate": self.rate,
                "statuses": list(FAULT_STATUSES),
                "paths": FAULT_PATHS,
                "seed": self.seed,
                "after": FAULT_AFTER,
            }
            status, body = self.farm.post("/_sandbox/faults", spec)
            if status != 200:
                raise RuntimeError(f"the sandbox refused the fault plan: {body}")

    def reading(self, read: Callable[[], Any]) -> Any:
        """Run a harness read with the faults paused (then resumed as they were)."""
        was = self._faulty
        if was:
            self.faults(False)
        try:
            return read()
        finally:
            if was:
                self.faults(True)

    # -- acting --------------------------------------------------------------------------------------------------

    def settle(self, timeout: float = 120.0) -> None:
        """Wait until hand-offs, webhooks (and their retries) and queued commands are done."""
        for _ in range(3):
            self.farm.settle(timeout=timeout)
            time.sleep(0.05)
        if not self.farm.settle(timeout=timeout):
            raise RuntimeError("the local host did not settle")

    def together(self, calls: list[Callable[[], Any]]) -> None:
        """Start calls at once, each on its own thread, and wait for what they set off."""
        threads = [threading.Thread(target=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.settle()

    def idle_alert(self, ir: int, transition: str, date: str) -> None:
        """The idle monitor notifies about one IR."""
        self.send_alert({"alert_transition": transition, "alert_scope": f"ir:ir-{ir}", "alert_id": "77", "date": date})

    def send_alert(self, body: dict[str, str]) -> None:
        """POST one idle alert to its Function URL, re-sending on 5xx as Datadog's webhooks do."""
        token = {"X-Gpufarm-Token": self.farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
        for attempt in range(ALERT_ATTEMPTS):
            status, _ = self.farm.post("/fn/idle_alert/", body, token)
            if status < 500:
                return
            time.sleep(0.2 * 2**attempt)

    def sync(self) -> None:
        """The scheduled sync, once."""
        self.farm.host.submit("QuotaSyncFunction", {"job": "quota_sync"})
        self.settle()

    def wave(self, n: int) -> None:
        """Eight requests, their approvals, actions and ends, with the faults on."""
        wave = [Request(n, kind) for kind in KINDS]
        self.requests += wave
        by = {r.kind.name: r for r in wave}
        self.faults(True)
        self._ask(wave)
        self._check_hosts(f"wave {n} after the requests")
        self.together(self._actions(n, by))
        self._check_hosts(f"wave {n} at its peak")
        if by["recover"].ir:
            self.idle_alert(by["recover"].ir, "Recovered", f"bd{n}-busy")
            self.settle()
        self.together(
            [
                partial(self.farm.slash, by[name].kind.user, f"release IR-{by[name].ir} now")
                for name in ("extend", "recover")
                if by[name].ir
            ]
        )
        # A day later: the one-day allocations expire, the idle one is past its grace; the sync finds both.
        self.farm.post("/_sandbox/clock", {"advance": DAY_S + 120})
        for _ in range(4):
            self.sync()
            if not self.reading(partial(self._live, wave)):
                break
        self.faults(False)

    def _ask(self, wave: list[Request]) -> None:
        """Every request of the wave typed at once; each learns its incident, and the ones refused for want of
        Slack's answer are typed again."""
        self.together([partial(self.farm.slash, r.kind.user, r.text()) for r in wave])
        for attempt in range(RETRIES + 1):
            incidents = self.reading(self.farm.incidents)
            for r in wave:
                mine = [a for a in incidents if a.project == r.project]
                r.ir = min(a.ir for a in mine) if mine else None
            # A request refused because Slack could not say who is in the team was answered "try again in a
            # minute" (never approved on unknown membership): its user asks again, as a person would.
            again = [r for r in wave if r.ir is None and r.kind.name != "refuse"]
            if not again or attempt == RETRIES:
                break
            self.together([partial(self.farm.slash, r.kind.user, r.text()) for r in again])

    def _actions(self, n: int, by: dict[str, Request]) -> list[Callable[[], Any]]:
        """The wave's release, extend, approve and reject commands and idle alerts, for the requests that got an
        incident."""

        def ir(name: str) -> str:
            return f"IR-{by[name].ir}"

        commands = (
            ("release", ALICE, f"release {ir('release')} now"),
            ("extend", ALICE, f"extend {ir('extend')} {EXTEND_DAYS}"),
            ("approve", DANA, f"approve {ir('approve')}"),
            ("reject", DANA, f"reject {ir('reject')} not this week"),
        )
        steps: list[Callable[[], Any]] = [
            partial(self.farm.slash, user, text) for name, user, text in commands if by[name].ir
        ]
        steps += [
            partial(self.idle_alert, by[name].ir or 0, "Triggered", f"bd{n}-warn")
            for name in ("idle", "recover")
            if by[name].ir
        ]
        return steps

    def _live(self, wave: list[Request]) -> list[str]:
        irs = {r.ir for r in wave if r.ir}
        return [a.ir_label for a in self.farm.incidents() if a.ir in irs and a.state.value != "resolved"]

    def _check_hosts(self, when: str) -> None:
        """No dedicated host carries two ir: tags or sits in two live incidents' host lists."""

        def look() -> list[str]:
            live = [a for a in self.farm.incidents() if a.state.value != "resolved"]
            problems = []
            held: dict[str, list[str]] = {}
            for a in live:
                if a.environment in DEDICATED_POOLS:
                    for h in a.hosts:
                        held.setdefault(h, []).append(a.ir_label)
            for host, irs in held.items():
                tags = self.farm.ir_tags(host)
                if len(irs) > 1 or len(tags) > 1:
                    problems.append(f"{when}: {host} held by {irs}, tagged {tags}")
            return problems

        for problem in self.reading(look):
            self.report.hosts_in_two += 1
            self.report.problem(problem)

    # -- the day ------------------------------------------------------------------------------------------------

    def run(self, requests: int) -> Report:
        """Play ceil(requests / 8) waves with the faults on, then drain fault-free, sync once and check."""
        start = time.monotonic()
        before = {p.id: len(self.farm.messages(user=p.id, kind="response")) for p in PEOPLE}
        self.farm.host.schedules_paused = True
        try:
            for n in range((requests + len(KINDS) - 1) // len(KINDS)):
                self.wave(n)
        finally:
            self.faults(False)
            self.farm.host.schedules_paused = False
        self.settle()
        self.before_the_last_sync()
        self.sync()
        self.check(before)
        self.report.faults_injected = self.injected
        self.report.dead_letters = len(self.farm.host.state().get("dead_letters", []))
        self.report.seconds = time.monotonic() - start
        return self.report

    def before_the_last_sync(self) -> None:
        """Called once the waves are over and the host has settled (a hook for variants of the day)."""

    def check(self, before: dict[str, int]) -> None:
        """Compare every request's end with the fault-free one; count what was lost, doubled, orphaned, untold."""
        report = self.report
        report.requests = len(self.requests)
        incidents = self.farm.incidents()
        answers = {
            p.id: [m.get("text") or "" for m in self.farm.messages(user=p.id, kind="response")[before[p.id] :]]
            for p in PEOPLE
        }
        refusals = {who: sum("Request refused" in t for t in texts) for who, texts in answers.items()}
        for r in self.requests:
            mine = sorted((a for a in incidents if a.project == r.project), key=lambda a: a.ir)
            self._check_request(r, mine, answers, refusals)
        self._check_orphans(incidents)

    def _check_request(
        self, r: Request, mine: list[Allocation], answers: dict[str, list[str]], refusals: dict[str, int]
    ) -> None:
        """One request against its fault-free end: lost, doubled (or extended twice), told or not."""
        report = self.report
        lost = self._lost(r, mine)
        if lost:
            report.lost += 1
            report.problem(f"{r.project}: {lost}")
        if len(mine) > 1 or (r.kind.name == "extend" and mine and mine[0].duration_days != r.kind.days + EXTEND_DAYS):
            report.doubled += 1
            report.problem(f"{r.project}: {[(a.ir_label, a.phase.value, a.duration_days) for a in mine]}")
        untold = self._untold(r, mine[0] if mine else None, answers, refusals)
        if untold:
            report.untold += 1
            report.problem(f"{r.project}: not told {untold}")
        else:
            report.told += 1

    def _check_orphans(self, incidents: list[Allocation]) -> None:
        """Allocation tags left on a host after the day: each one counted."""
        for host in sorted({h for a in incidents for h in a.hosts} | {h[0] for h in HOSTS}):
            orphans = [t for t in self.farm.user_tags(host) if t.split(":", 1)[0] in ALLOC_TAG_KEYS]
            if orphans:
                self.report.orphan_tags += len(orphans)
                self.report.problem(f"{host} still tagged {orphans}")

    @staticmethod
    def _lost(r: Request, mine: list[Allocation]) -> str:
        kind = r.kind
        if kind.name == "refuse":
            # Refused up front (no incident) or, when that check could not read Datadog, in the group.
            if mine and (mine[0].phase is not Phase.REJECTED or "refused" not in mine[0].title):
                return f"{mine[0].ir_label} {mine[0].phase.value}, not refused"
            return ""
        if not mine:
            return "no incident"
        a = mine[0]
        if a.phase is not kind.phase or a.reclaim_reason is not kind.reason:
            return f"{a.ir_label} ended {a.phase.value}/{a.reclaim_reason}, not {kind.phase.value}/{kind.reason}"
        if kind.name == "approve" and a.approved_by != DANA.id:
            return f"{a.ir_label} approved by {a.approved_by}"
        if kind.name == "recover" and a.idle_warned_at is not None:
            return f"{a.ir_label} still warned"
        if a.hosts:
            return f"{a.ir_label} still lists hosts {a.hosts}"
        return ""

    @staticmethod
    def _untold(r: Request, a: Allocation | None, answers: dict[str, list[str]], refusals: dict[str, int]) -> list[str]:
        """What the request's people were not answered: the request itself, and each action on it."""

        def said(user: str, *parts: str) -> bool:
            return any(all(p in text for p in parts) for text in answers[user])

        kind, user = r.kind, r.kind.user.id
        if a is None:
            # Refused up front: the refusal names no incident; one refusal answer is spent per such request.
            if kind.name == "refuse" and refusals[user] > 0:
                refusals[user] -= 1
                return []
            return ["the request's answer"]
        label = a.ir_label
        missing = [] if said(user, f"/{r.project}`") or said(user, label, "refused") else ["the request's answer"]
        wanted = {
            "release": [(user, label, "being released")],
            "extend": [(user, label, "extended"), (user, label, "being released")],
            "approve": [(DANA.id, label, "approved")],
            "recover": [(user, label, "being released")],
            "reject": [(DANA.id, label, "rejected")],
        }.get(kind.name, [])
        missing += [" ".join(parts[1:]) for parts in wanted if not said(*parts)]
        return missing


def figures(report: Report) -> dict[str, object]:
    """The report as the benchmark prints it."""
    return {
        "requests": report.requests,
        "lost": report.lost,
        "doubled": report.doubled,
        "hosts_in_two_incidents": report.hosts_in_two,
        "orphan_tags": report.orphan_tags,
        "told": report.told,
        "untold": report.untold,
        "faults_injected": report.faults_injected,
        "dead_letters": report.dead_letters,
        "seconds": round(report.seconds, 1),
        "problems": report.problems,
        "ok": report.ok,
    }


def dumps(report: Report) -> str:
    """One line of JSON (for logs)."""
    return json.dumps(figures(report))
