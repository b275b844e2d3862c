"""One enforcer run, and the loop of them: read leases and the cluster, plan, apply each operation, report.

A run that cannot read Datadog or scontrol applies nothing (it could not tell what to delete). A failed operation
leaves the others applied and is retried by the next run. The enforcement lag (seconds since the cluster last
matched the leases, 0 when it does) is sent as `gpufarm.enforce.lag_seconds` every run; a failing episode, a
reservation put back after a hand edit and a requester without a cluster user are posted as events once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any, Protocol

from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.leases import Lease, Skipped, lease_of
from gpufarm_node.enforce.reporting import Reporter as Reporter  # noqa: PLC0414 - named here by its users
from gpufarm_node.enforce.reporting import post_event, send_gauges
from gpufarm_node.enforce.slurm_plan import (
    Op,
    OpKind,
    ParseError,
    Reservation,
    desired,
    parse_nodes,
    parse_reservations,
    plan,
)

log = logging.getLogger("gpufarm_node.enforce")

LAG_METRIC = "gpufarm.enforce.lag_seconds"
FAILED_METRIC = "gpufarm.enforce.failed_ops"
RESERVATIONS_METRIC = "gpufarm.enforce.reservations"
APPLIED_METRIC = "gpufarm.enforce.applied_ops"
# Their units (spec/metrics.yaml, enforce_metrics).
UNITS = {LAG_METRIC: "second", FAILED_METRIC: "operation", APPLIED_METRIC: "operation", RESERVATIONS_METRIC: "item"}
# What slurmctld answers for a user it cannot resolve, and how long such a user is left out before it is tried again.
INVALID_USER = "Invalid user id"
UNKNOWN_USER_RETRY_S = 3600.0
# Notices told once per process: at most this many remembered (a map fixed by then stops the telling anyway).
MAX_TOLD = 10_000


class LeaseSource(Protocol):
    """Where live incidents come from (Datadog)."""

    def live_incidents(self) -> list[dict[str, Any]]: ...


class Cluster(Protocol):
    """Slurm as the enforcer uses it (scontrol)."""

    def reservations(self) -> str: ...

    def nodes(self) -> str: ...

    def apply(self, args: Sequence[str]) -> None: ...


@dataclass
class RunReport:
    """What one run did."""

    leases: int = 0
    reservations: int = 0
    applied: list[Op] = field(default_factory=list)
    failed: list[tuple[Op, str]] = field(default_factory=list)
    deferred: int = 0
    error: str | None = None
    lag_seconds: float = 0.0
    notices: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        """True when the cluster holds what the leases call for."""
        return self.error is None and not self.failed and not self.deferred

    def lines(self) -> list[str]:
        """One line per thing done, for the log and the command line."""
        out = [f"{op.kind.value} {op.name}: {op.why}" for op in self.applied]
        out += [f"FAILED {op.kind.value} {op.name}: {why}" for op, why in self.failed]
        out += [f"deferred {self.deferred} operations to the next run"] if self.deferred else []
        out += [f"not applied: {self.error}"] if self.error else []
        out += [f"notice: {text}" for text in self.notices]
        return out


class SlurmEnforcer:
    """Holds what it last applied (to tell a hand edit from a lease change) and the notices already told."""

    def __init__(
        self,
        leases: LeaseSource,
        cluster: Cluster,
        names: SlurmNames,
        reporter: Reporter | None = None,
        *,
        cluster_tag: str = "default",
        clock: Callable[[], float] = time.time,
        tz: tzinfo | None = None,
    ) -> None:
        self.leases, self.cluster, self.names, self.reporter = leases, cluster, names, reporter
        self.clock, self.tz = clock, tz
        self.tags = ("enforcer:slurm", f"cluster:{cluster_tag}")
        self._applied: dict[str, Reservation] = {}
        self._told: set[str] = set()
        # Cluster users slurmctld refused ("Invalid user id") and since when: their leases name the team's account
        # until UNKNOWN_USER_RETRY_S has passed, then the user is tried again.
        self._unknown_users: dict[str, float] = {}
        self._converged_at = clock()
        self._failing = False

    def run_once(self) -> RunReport:
        """Read, plan, apply, report."""
        now = self.clock()
        report = RunReport()
        try:
            self._apply(report, datetime.fromtimestamp(now, UTC))
        except Exception as exc:  # noqa: BLE001 - any read failure: nothing applied, reported, retried next run
            report.error = str(exc)[:300] or type(exc).__name__
        if report.converged:
            self._converged_at = now
        report.lag_seconds = 0.0 if report.converged else max(0.0, now - self._converged_at)
        self._report(report, now)
        return report

    def _apply(self, report: RunReport, now: datetime) -> None:
        leases: list[Lease] = []
        for data in self.leases.live_incidents():
            got = lease_of(data)
            if isinstance(got, Skipped):
                self._tell(report, f"skip:{got.ir}", f"IR-{got.ir} is not enforced: {got.why}")
            elif got is not None:
                leases.append(got)
        report.leases = len(leases)
        nodes = parse_nodes(self.cluster.nodes())
        have = parse_reservations(self.cluster.reservations(), self.tz)
        want = desired(leases, self._known_names(now.timestamp()), nodes, now)
        report.reservations = len(want.reservations)
        for notice in want.notices:
            self._tell(report, notice.key, notice.text)
        todo = plan(want.reservations, have, self._applied, self.tz)
        report.deferred = todo.deferred
        for op in todo.ops:
            try:
                self.cluster.apply(op.args)
            except Exception as exc:  # noqa: BLE001 - one failed op leaves the others; retried next run
                report.failed.append((op, str(exc)[:300]))
                self._refused_user(report, op, str(exc), now.timestamp())
                continue
            report.applied.append(op)
            if op.kind is OpKind.DELETE:
                self._applied.pop(op.name, None)
            elif op.target is not None:
                self._applied[op.name] = op.target
        # What Slurm already held as the lease wants counts as applied too: a later difference is a hand edit.
        for name, target in want.reservations.items():
            current = have.get(name)
            if current is not None and target.same_as(current):
                self._applied[name] = target
        for name in list(self._applied):
            if name not in want.reservations:
                self._applied.pop(name, None)

    def _known_names(self, now: float) -> SlurmNames:
        """The farm's names without the cluster users slurmctld refused lately."""
        for user, since in list(self._unknown_users.items()):
            if now - since >= UNKNOWN_USER_RETRY_S:
                del self._unknown_users[user]
        if not self._unknown_users:
            return self.names
        users = {k: v for k, v in self.names.users.items() if v not in self._unknown_users}
        return SlurmNames(self.names.pools, users, self.names.accounts)

    def _refused_user(self, report: RunReport, op: Op, error: str, now: float) -> None:
        """A user slurmctld does not know: the next run names the team's account instead (said once)."""
        if INVALID_USER not in error or op.target is None or not op.target.users:
            return
        for user in op.target.users:
            if len(self._unknown_users) < MAX_TOLD:
                self._unknown_users[user] = now
            self._tell(
                report,
                f"unknown:{user}",
                f"cluster user {user} (enforcement.slurm.users) is unknown to Slurm ({INVALID_USER}): "
                f"{op.name} and its requester's other leases name their team's account until it exists",
            )

    def _tell(self, report: RunReport, key: str, text: str) -> None:
        if key in self._told:
            return
        if len(self._told) < MAX_TOLD:
            self._told.add(key)
        report.notices.append(text)
        self._event("gpufarm enforcement: notice", text, alert="info")

    def _report(self, report: RunReport, now: float) -> None:
        for line in report.lines():
            level = logging.WARNING if line.startswith(("FAILED", "not applied")) else logging.INFO
            log.log(level, "%s", line)
        self._episode_events(report)
        if self.reporter is None:
            return
        values = {
            LAG_METRIC: report.lag_seconds,
            FAILED_METRIC: float(len(report.failed) + (1 if report.error else 0)),
            RESERVATIONS_METRIC: float(report.reservations),
            APPLIED_METRIC: float(len(report.applied)),
        }
        send_gauges(self.reporter, values, self.tags, now, "enforcement")

    def _episode_events(self, report: RunReport) -> None:
        """A reservation put back, each time; a lagging episode once when it starts and once when it ends."""
        put_back = [op for op in report.applied if op.why.startswith("edited by hand")]
        for op in put_back:
            self._event("gpufarm enforcement: reservation put back", f"{op.name} was {op.why}", alert="warning")
        if not report.converged and not self._failing:
            why = report.error or "; ".join(f"{op.name}: {w}" for op, w in report.failed) or "operations deferred"
            self._event("gpufarm enforcement is lagging", f"Slurm does not hold the leases yet: {why}", alert="error")
        elif report.converged and self._failing:
            self._event("gpufarm enforcement caught up", "Slurm holds every lease again", alert="success")
        self._failing = not report.converged

    def _event(self, title: str, text: str, *, alert: str) -> None:
        post_event(self.reporter, title, text, self.tags, alert, "enforcement")

    def run(self, stop: threading.Event, interval: float) -> None:
        """Run every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            started = time.monotonic()
            self.run_once()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


__all__ = ["ParseError", "RunReport", "SlurmEnforcer"]
