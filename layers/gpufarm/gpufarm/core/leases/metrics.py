"""Lifecycle metrics: requests waiting and their age, leases warned as idle, and reclaims by reason.

Two kinds, declared under `lifecycle_metrics` in spec/metrics.yaml (names, types, units, tags; `gpufarm datadog
apply` sends their metadata):

- gauges the scheduled sync publishes from its one read of the live incidents (gpufarm.core.sync
  publish_gauges, no read of their own): requests waiting per environment, model and team, split by what they wait
  for (`waiting_for:approval`, an operator's decision; `waiting_for:hosts`, granted and queued for hosts), the
  longest of those waits in seconds, and one 0/1 gauge per lease holding hosts that is 1 while it is warned as idle.
  Every team, environment and model of the farm gets its zeros, so a dashboard's "last value" falls back to 0
  when the last request is served instead of keeping the stale count;
- counts submitted when a lifecycle step is recorded: a lease's reclaim with its reason (`reclaim_reason`, the
  incident's reason, or `partial-idle` for the idle part of a busy lease given back; gpufarm.core.idle.partial) and the
  GPUs it freed, and each idle warning.

The counts go through the service's metrics sink after the incident write that records the step succeeded: a
failed submit is logged and never fails the step (the incident, not the metric, is the record). Each is sent by the
run whose write made the change, and a redelivered command is answered from its ledger without running again
(gpufarm.core.commands.record), so nothing is counted twice; a run whose write landed but whose answer was lost is
counted by no one rather than twice.

The lease tags are `ir` (as on the hosts) and `gpu_ir` (the key the project dashboard's lease variable selects,
the node agent's per-device tag), both `ir-<n>`; these series carry no host, so both are exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.leases import terms

log = logging.getLogger(__name__)

REQUESTS_WAITING = "gpufarm.requests.waiting"
OLDEST_WAIT = "gpufarm.requests.oldest_wait"
LEASES_IDLE_WARNED = "gpufarm.leases.idle_warned"
IDLE_WARNINGS = "gpufarm.leases.idle_warnings"
RECLAIMS = "gpufarm.leases.reclaims"
RECLAIMED_GPUS = "gpufarm.leases.reclaimed_gpus"
GAUGES = (REQUESTS_WAITING, OLDEST_WAIT, LEASES_IDLE_WARNED)
COUNTS = (IDLE_WARNINGS, RECLAIMS, RECLAIMED_GPUS)
# Datadog units, as spec/metrics.yaml declares them (a lease has none of its own).
UNITS: dict[str, str | None] = {
    REQUESTS_WAITING: "request",
    OLDEST_WAIT: "second",
    LEASES_IDLE_WARNED: None,
    IDLE_WARNINGS: "event",
    RECLAIMS: "event",
    RECLAIMED_GPUS: "device",
}

# What a live request in each phase waits for: an operator's decision, or hosts once granted.
APPROVAL, HOSTS = "approval", "hosts"
WAITING_FOR: dict[Phase, str] = {Phase.REQUESTED: APPROVAL, **dict.fromkeys(terms.WAITING, HOSTS)}
# The reclaim reason of the idle part of a busy lease given back while the rest stays (gpufarm.core.idle.partial).
PARTIAL_IDLE = "partial-idle"
REASONS = (*(r.value for r in ReclaimReason), PARTIAL_IDLE)

_GAUGE, _COUNT = 3, 1


def gauges(live: Iterable[Allocation], farm: FarmConfig, now: datetime) -> list[MetricSeries]:
    """The waiting and idle-warned gauges of the live leases at `now` (pure: the sync's own read of them)."""
    ts = int(now.timestamp())
    waiting: dict[tuple[str, ...], int] = {}
    oldest: dict[tuple[str, ...], float] = {}
    # Zeros for every team, pool and model first (bounded by the farm file), so an emptied queue reads 0.
    for team in sorted(farm.teams):
        for env_name, env in sorted(farm.environments.items()):
            for model in env.gpu_models:
                for what in (APPROVAL, HOSTS):
                    key = _waiting_key(env_name, model, team, what)
                    waiting[key], oldest[key] = 0, 0.0
    warned: list[MetricSeries] = []
    for alloc in live:
        if alloc.state is State.RESOLVED:
            continue
        waits_for = WAITING_FOR.get(alloc.phase)
        if waits_for is not None:
            key = _waiting_key(alloc.environment, alloc.gpu_model, alloc.team, waits_for)
            waiting[key] = waiting.get(key, 0) + 1
            since = terms.waiting_since(alloc) or now
            oldest[key] = max(oldest.get(key, 0.0), 0.0, (now - since).total_seconds())
        elif alloc.phase in HOLDING:
            value = 1.0 if alloc.phase is Phase.IDLE_WARNED else 0.0
            warned.append(_series(LEASES_IDLE_WARNED, value, lease_tags(alloc), ts, _GAUGE))
    series = [
        _series(REQUESTS_WAITING, float(count), _keyed(key), ts, _GAUGE) for key, count in sorted(waiting.items())
    ]
    series += [_series(OLDEST_WAIT, round(age, 1), _keyed(key), ts, _GAUGE) for key, age in sorted(oldest.items())]
    return series + warned


def reclaimed(ctx: LeaseContext, alloc: Allocation, reason: str, gpus: int) -> None:
    """Count one reclaim of the lease (or of its idle part) and the GPUs it freed; call after its write landed."""
    tags = [normalize_tag(f"reclaim_reason:{reason}"), *lease_tags(alloc)]
    ts = int(ctx.now().timestamp())
    series = [_series(RECLAIMS, 1.0, tags, ts, _COUNT), _series(RECLAIMED_GPUS, float(max(0, gpus)), tags, ts, _COUNT)]
    _submit(ctx, series, f"the reclaim ({reason}) of {alloc.ir_label}")


def warned(ctx: LeaseContext, alloc: Allocation) -> None:
    """Count one idle warning of the lease; call after the write that records it landed."""
    ts = int(ctx.now().timestamp())
    _submit(ctx, [_series(IDLE_WARNINGS, 1.0, lease_tags(alloc), ts, _COUNT)], f"the idle warning of {alloc.ir_label}")


def lease_tags(alloc: Allocation) -> list[str]:
    """`environment`, `gpu_model`, `team`, `project`, `ir` and `gpu_ir` of a lease (absent values left out)."""
    ir = ir_tag_value(alloc.ir)
    return _tags(
        environment=alloc.environment,
        gpu_model=alloc.gpu_model,
        team=alloc.team,
        project=alloc.project,
        ir=ir,
        gpu_ir=ir,
    )


def held_gpus(alloc: Allocation) -> int:
    """The GPUs (or MIG slices) a lease holds: its GPUs per host, else its count once hosts were written."""
    return sum(alloc.host_gpus.values()) or (alloc.gpu_count if alloc.hosts else 0)


def _submit(ctx: LeaseContext, series: list[MetricSeries], what: str) -> None:
    if ctx.metrics is None:
        return
    try:
        ctx.metrics.submit(series)
    except GpufarmError as exc:
        # The incident already records the step; a lost count must not fail (and replay) it.
        log.warning("could not count %s: %s", what, exc)


def _waiting_key(environment: str | None, model: str | None, team: str | None, what: str) -> tuple[str, ...]:
    return (environment or "", (model or "").lower(), team or "", what)


def _keyed(key: tuple[str, ...]) -> list[str]:
    environment, model, team, what = key
    return _tags(environment=environment, gpu_model=model, team=team, waiting_for=what)


def _tags(**values: str | None) -> list[str]:
    return [normalize_tag(f"{k}:{v}") for k, v in values.items() if v]


def _series(name: str, value: float, tags: list[str], ts: int, kind: int) -> MetricSeries:
    return MetricSeries(name, (MetricPoint(ts, value),), tuple(tags), type=kind, unit=UNITS[name])
