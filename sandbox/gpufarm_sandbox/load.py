"""Load on the local function host: signed slash commands from many threads at once, and what each costs.

The sandbox plays Slack (`POST /_sandbox/slack/commands` signs each command on the sandbox clock, posts it to the
ingress's Function URL and times the answer, as Slack times an app's ack), so an ack here is what a Slack user
would wait for. The worker's time per command kind is read from the host's invocations through a listener
(`LocalHost.listen`), not guessed from the ack. benchmarks/reliability.py ("throughput") prints these figures;
tests/integration/test_local_host.py runs a CI-sized load.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.emulator.slack_workspace import TEAM_USERGROUPS

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
    from gpufarm_sandbox.example_farm import Person

WORKER = "SlackWorkerFunction"
# The demo people's teams, as the sandbox's workspace seeds their user groups (`team-<name>`): a request is for the
# requester's own team, since gpufarm refuses one for a team the user is not in (gpufarm.core.governance.membership).
TEAM_OF = {user: handle.removeprefix("team-") for _, handle, users in TEAM_USERGROUPS for user in users}
COMMANDS_PATH = "/_sandbox/slack/commands"
SLACK_ACK_DEADLINE_MS = 3000.0


@dataclass(frozen=True)
class Planned:
    """One command of a load: who types it, its kind (list, status, request...) and its text."""

    kind: str
    user: Person
    text: str


@dataclass
class Sample:
    """One command as Slack saw it: the ack's status and latency, or why it failed."""

    kind: str
    status: int | None
    ack_ms: float
    error: str | None = None
    # Typing to answer as the client saw it: the ack plus the sandbox playing Slack (signing, its lock).
    round_trip_ms: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank; 0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class LoadReport:
    """What a load ended as: commands sent, acknowledged, failed, ack latencies and the worker's time per kind."""

    sent: int
    threads: int
    wall_s: float
    samples: list[Sample]
    worker_ms: dict[str, list[float]]
    worker_failures: list[str]
    dead_letters: int
    settled: bool

    @property
    def acked(self) -> int:
        """Commands answered 200 within Slack's 3 seconds."""
        return sum(s.status == 200 and s.ack_ms <= SLACK_ACK_DEADLINE_MS for s in self.samples)

    @property
    def errors(self) -> list[Sample]:
        """Commands Slack would show as failed: no answer, a non-200, or an answer after 3 seconds."""
        return [s for s in self.samples if s.status != 200 or s.ack_ms > SLACK_ACK_DEADLINE_MS]

    def ack(self, q: float) -> float:
        """The q-th percentile of ack latency (ms)."""
        return percentile([s.ack_ms for s in self.samples], q)

    def worker(self, kind: str, q: float) -> float:
        """The q-th percentile of the worker's time (ms) for one command kind."""
        return percentile(self.worker_ms.get(kind, []), q)

    def summary(self) -> dict[str, Any]:
        """The figures as plain data."""
        kinds = dict(sorted(Counter(s.kind for s in self.samples).items()))
        return {
            "sent": self.sent,
            "threads": self.threads,
            "acked": self.acked,
            "errors": len(self.errors),
            "first_errors": [f"{s.kind}: {s.status} {s.error or ''} {s.ack_ms:.0f} ms" for s in self.errors[:5]],
            "ack_p50_ms": round(self.ack(50), 1),
            "ack_p95_ms": round(self.ack(95), 1),
            "ack_p99_ms": round(self.ack(99), 1),
            "ack_max_ms": round(self.ack(100), 1),
            "round_trip_p99_ms": round(percentile([s.round_trip_ms for s in self.samples], 99), 1),
            "wall_s": round(self.wall_s, 1),
            "kinds": kinds,
            "worker_ms": {
                kind: {"n": len(v), "p50": round(percentile(v, 50), 1), "p99": round(percentile(v, 99), 1)}
                for kind, v in sorted(self.worker_ms.items())
            },
            "worker_failures": len(self.worker_failures),
            "first_worker_failures": self.worker_failures[:5],
            "dead_letters": self.dead_letters,
            "settled": self.settled,
        }


def job_kind(event: Any) -> str:
    """The command kind a worker invocation carries: the verb (list, status...), or request, action, view."""
    if not isinstance(event, dict):
        return "other"
    if event.get("kind") == "command" and isinstance(event.get("command"), dict):
        return str(event["command"].get("verb", "command"))
    return str(event.get("kind", "other"))


class WorkerTimes:
    """Collects the worker's invocation times per command kind while it is installed on a host."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, entry: dict[str, Any], event: Any) -> None:
        """The host's listener: one finished invocation."""
        if entry.get("function") != WORKER:
            return
        kind = job_kind(event)
        with self._lock:
            self.ms[kind].append(float(entry.get("duration_ms", 0.0)))
            if entry.get("status") != "ok":
                self.failures.append(f"{kind}: {entry.get('error', entry.get('status'))}")


def mixed_commands(count: int, people: Sequence[Person], irs: Sequence[int]) -> list[Planned]:
    """The issue's mix: mostly `/gpu list` and `/gpu status IR-n`, some `/gpu request` (every tenth)."""
    planned: list[Planned] = []
    for i in range(count):
        who = people[i % len(people)]
        if i % 10 == 9:
            text = f"request 1 H100 project=load-{i} team={TEAM_OF.get(who.id, 'nlp')} env=onprem-hpc days=1"
            planned.append(Planned("request", who, text))
        elif i % 2 == 0 and irs:
            planned.append(Planned("status", who, f"status IR-{irs[(i // 2) % len(irs)]}"))
        elif i % 6 == 1:
            planned.append(Planned("list", who, "list all"))
        else:
            planned.append(Planned("list", who, "list"))
    return planned


def send_one(farm: LocalFarm, command: Planned) -> Sample:
    """Type one command as Slack would and time its ack (the sandbox's measurement of the Function URL)."""
    from gpufarm_sandbox.demo.lifecycle_stage import INGRESS_PATH
    from gpufarm_sandbox.example_farm import RESEARCH_CHANNEL

    body = {
        "user": command.user.id,
        "channel": RESEARCH_CHANNEL,
        "command": "/gpu",
        "text": command.text,
        "url": farm.base_url + INGRESS_PATH,
    }
    started = time.perf_counter()
    try:
        status, answer = farm.post(COMMANDS_PATH, body)
    except OSError as exc:
        elapsed = (time.perf_counter() - started) * 1000
        return Sample(command.kind, None, elapsed, f"sandbox: {type(exc).__name__}", elapsed)
    elapsed = (time.perf_counter() - started) * 1000
    if status != 200 or not isinstance(answer, dict):
        return Sample(command.kind, None, elapsed, f"sandbox answered {status}", elapsed)
    ack_ms = float(answer.get("latency_ms") or 0.0)
    return Sample(command.kind, answer.get("status"), ack_ms, answer.get("error"), elapsed)


def run_load(farm: LocalFarm, commands: Sequence[Planned], *, threads: int = 12, settle_s: float = 120.0) -> LoadReport:
    """Send the commands from `threads` client threads as fast as each gets its ack, then wait for the work."""
    times = WorkerTimes()
    samples: list[Sample] = []
    lock = threading.Lock()
    cursor = iter(range(len(commands)))
    dead_before = len(farm.host.dead_letters)

    def client() -> None:
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            sample = send_one(farm, commands[i])
            with lock:
                samples.append(sample)

    remove = farm.host.listen(times)
    try:
        started = time.perf_counter()
        workers = [threading.Thread(target=client, name=f"slack-client-{n}") for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - started
        settled = farm.settle(timeout=settle_s)
    finally:
        remove()
    return LoadReport(
        sent=len(commands),
        threads=threads,
        wall_s=wall,
        samples=samples,
        worker_ms=dict(times.ms),
        worker_failures=times.failures,
        dead_letters=len(farm.host.dead_letters) - dead_before,
        settled=settled,
    )


@dataclass
class CostReport:
    """The worker's time per command kind with a given number of live incidents."""

    live: int
    worker_ms: dict[str, list[float]] = field(default_factory=dict)

    def median(self, kind: str) -> float:
        """The median worker time (ms) for one kind."""
        return percentile(self.worker_ms.get(kind, []), 50)


def seed_live(farm: LocalFarm, count: int, *, requester: Person, prefix: str = "live") -> list[int]:
    """Add `count` live incidents: requests of `requester` awaiting a decision, created through gpufarm's Datadog
    adapter with the fields a request's incident gets (no Slack round trip, no policy decision).

    Returns their IR numbers: the incidents a `status` or `list` has to find its way among.
    """
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.governance.policy import build_request
    from gpufarm.core.kernel.lifecycle import Phase

    config = parse_farm((farm.host.root / "config" / "farm.example.yaml").read_text())
    now = datetime.now(UTC)
    irs: list[int] = []
    for i in range(count):
        request = build_request(
            {
                "gpu_count": "1",
                "gpu_model": "H100",
                "team": "nlp",
                "project": f"{prefix}-{i}",
                "environment": "onprem-hpc",
                "duration_days": "1",
            },
            config,
            requester=requester.id,
            channel=None,
            request_id=f"{prefix}-{i}-{time.time_ns()}",
        )
        record = farm.gateway.create(request.title(), request.to_fields(Phase.REQUESTED, now))
        irs.append(record.public_id)
    return irs


def worker_cost(farm: LocalFarm, commands: Sequence[Planned], *, live: int, settle_s: float = 60.0) -> CostReport:
    """Run the commands one at a time (nothing else running) and keep the worker's time per kind."""
    times = WorkerTimes()
    remove = farm.host.listen(times)
    try:
        for command in commands:
            send_one(farm, command)
            farm.settle(timeout=settle_s)
    finally:
        remove()
    return CostReport(live=live, worker_ms=dict(times.ms))


def cost_commands(user: Person, irs: Sequence[int], repeats: int) -> list[Planned]:
    """`repeats` pairs of `status IR-n` (spread over irs) and `list` (the user's own), typed by one user."""
    planned: list[Planned] = []
    for r in range(repeats):
        ir = irs[(r * 7919) % len(irs)] if irs else 1
        planned.append(Planned("status", user, f"status IR-{ir}"))
        planned.append(Planned("list", user, "list"))
    return planned
