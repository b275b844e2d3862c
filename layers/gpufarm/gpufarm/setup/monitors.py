"""gpufarm's idle monitors, generated from the farm's idle policy (gpufarm.core.config.farm.IdleSettings); pure: no
calls.

One Datadog metric monitor per idle kind and per group of environments and teams that share a policy:

- *idle*: `max(<window>):max:gpufarm.gpu.processes{...} by {gpu_ir,host} < 1`: no compute process on any of the
  lease's GPUs on that host at any point of the window;
- *idle_held*: `min(<window>):min:gpufarm.gpu.idle_state{...,state:idle_held} by {gpu_ir,host} >= 1`: every GPU of
  the lease on that host held memory with activity under the node agent's threshold for the whole window;
- *low_utilization*: `avg(<window>):avg:gpufarm.gpu.utilization{...} by {gpu_ir,host} < T`.

The window is the kind's `window_minutes` as Datadog's reference writes it (`last_30m`, `last_1h`, `last_2h`,
`last_1d`: window_text); the farm configuration admits only the windows it documents (MONITOR_WINDOW_MINUTES), and
apply has Datadog validate each monitor before it creates or updates any (gpufarm.setup.apply).

The queries read the node agent's per-device series (spec/metrics.yaml), grouped by the exact per-device lease tag
`gpu_ir` and the host (and, on shared pools, the device's `gpu_uuid`), so one idle host of a multi-host lease, or
one idle slice of a shared host, alerts on its own. The scope keeps to gpufarm's hosts (`gpufarm:managed`, a host
tag), drops unattributed devices (`NOT gpu_ir:none`) and narrows by `environment` (and `team`, a host tag gpufarm
writes on allocation) where overrides make policies differ. A fresh lease's groups are skipped for the start-up
grace or one whole window, whichever is longer (`new_group_delay`); an alert re-notifies every grace period while it
lasts, so a warning cleared by another group's recovery comes back. Every message notifies the idle webhook, whose
payload carries the monitor's tags (kind, window) and the rendered message (value).

An environment whose nodes run the Datadog Agent's GPU check instead (`metrics_source: datadog-agent`) gets monitors
on the check's `gpu.sm_active` (percent of time the SMs were active, per `gpu_uuid`), grouped by the host's `ir`
tag (Datadog stamps host tags on every metric the host's Agent sends) and the host (and `gpu_uuid` on shared
pools), scoped to leased hosts (`ir:ir-*`) instead of `NOT gpu_ir:none`:

- *idle*: `max(<window>):max:gpu.sm_active{...} by {ir,host} < 1`: no SM activity on any of the lease's GPUs on that
  host for the window. The check's process series (`gpu.process.*`) exist only while a process runs, so no series
  says "no process"; an idle GPU and one held by a process doing nothing both read ~0 % SM activity, so this one
  monitor covers *idle_held* too (an idle_held monitor is made only when *idle* is disabled);
- *low_utilization*: `avg(<window>):avg:gpu.sm_active{...} by {ir,host} < T`.

On a shared host the `ir:` host tags name every lease on it, so each device's group exists once per lease there:
the Agent cannot say which lease a device serves, so a sliced pool that needs exact attribution runs gpufarm-node
(its per-device `gpu_ir`).

Monitors are gpufarm's when they carry MANAGED_TAG; each one's stable identity is its KEY_TAG_KEY tag, so a changed
threshold updates the monitor in place and a removed group is deleted only with `--prune`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufarm.core.accounting import agent_usage
from gpufarm.core.config.farm import (
    MONITOR_WINDOW_MINUTES,
    FarmConfig,
    IdleKind,
    IdleKindPolicy,
    MetricsSource,
    PoolKind,
)
from gpufarm.core.kernel.hosts import ENVIRONMENT_KEY, MANAGED_TAG, TEAM_KEY
from gpufarm.setup.changes import Action, Change
from gpufarm.setup.webhooks import IDLE_HANDLE

KIND = "monitor"
NAME_PREFIX = "[gpufarm] "
KEY_TAG_KEY = "gpufarm_monitor"
IDLE_KIND_TAG_KEY = "gpufarm_idle_kind"
WINDOW_TAG_KEY = "gpufarm_idle_window"
# The per-device lease tag the node agent writes (never a host tag, so exact on shared hosts) and the host.
LEASE_KEY = "gpu_ir"
HOST_KEY = "host"
DEVICE_KEY = "gpu_uuid"
# Keys a query may use that come from the host (Datadog stamps host tags on every point), not from the agent.
HOST_TAG_KEYS = frozenset({HOST_KEY, "gpufarm", ENVIRONMENT_KEY, TEAM_KEY})
MESSAGE_VALUE_MARK = "value="

METRICS: Mapping[IdleKind, str] = {
    IdleKind.IDLE: "gpufarm.gpu.processes",
    IdleKind.IDLE_HELD: "gpufarm.gpu.idle_state",
    IdleKind.LOW_UTILIZATION: "gpufarm.gpu.utilization",
}
_WHAT = {
    IdleKind.IDLE: "no process on its GPUs",
    IdleKind.IDLE_HELD: "GPU memory held with no activity",
    IdleKind.LOW_UTILIZATION: "low GPU utilisation",
}
# The Datadog Agent's GPU check (metric prefix `gpu.`): SM activity per device, tagged gpu_uuid; the lease is the
# host's `ir:` tag, which Datadog stamps on every metric the host's Agent sends. Under BUSY_PERCENT is idle here and
# not busy in the ledger (gpufarm.core.accounting.agent_usage): one threshold for both.
AGENT_ACTIVITY_METRIC = agent_usage.ACTIVITY_METRIC
AGENT_LEASE_KEY = agent_usage.LEASE_KEY
_AGENT_WHAT = {
    IdleKind.IDLE: "no GPU activity",
    IdleKind.IDLE_HELD: "no GPU activity",
    IdleKind.LOW_UTILIZATION: "low GPU activity",
}
# Options gpufarm sets; options Datadog adds on its own (defaults) are not compared.
_COMPARED_FIELDS = ("name", "query", "message")


@dataclass(frozen=True)
class _Cell:
    """One environment and one team with an idle override (None: every other team) of that environment."""

    environment: str
    team: str | None


@dataclass(frozen=True)
class _Signature:
    """What makes two cells share a monitor of one kind."""

    kind: IdleKind
    policy: IdleKindPolicy
    # The start-up grace or one whole window, whichever is longer: how long a fresh lease's groups go unjudged.
    startup_minutes: int
    grace_minutes: int
    per_device: bool
    source: MetricsSource = MetricsSource.GPUFARM_NODE


@dataclass(frozen=True)
class IdleMonitor:
    """One monitor apply wants: its stable key and its Datadog v1 monitor JSON."""

    key: str
    # The idle kind it judges; None for the squatter monitor (gpufarm.setup.squatter_monitor).
    kind: IdleKind | None
    body: Mapping[str, Any]


def desired_monitors(farm: FarmConfig) -> list[IdleMonitor]:
    """The idle monitors the farm's policy asks for, in a stable order."""
    teams = sorted(farm.idle.teams)
    groups: dict[_Signature, list[_Cell]] = {}
    for env_name in sorted(farm.environments):
        env = farm.environments[env_name]
        per_device = env.kind is PoolKind.SHARED
        for team in [None, *teams]:
            policy = farm.idle.policy(env_name, team)
            for kind, kind_policy in _kinds_for(env.metrics_source, policy.enabled()):
                startup = max(policy.startup_grace_minutes, kind_policy.window_minutes)
                grace = policy.grace_minutes
                signature = _Signature(kind, kind_policy, startup, grace, per_device, env.metrics_source)
                groups.setdefault(signature, []).append(_Cell(env_name, team))
    monitors = [_monitor(signature, cells, teams) for signature, cells in groups.items()]
    return sorted(monitors, key=lambda m: (list(IdleKind).index(m.kind) if m.kind else len(IdleKind), m.body["name"]))


def _kinds_for(
    source: MetricsSource, enabled: list[tuple[IdleKind, IdleKindPolicy]]
) -> list[tuple[IdleKind, IdleKindPolicy]]:
    """The kinds a source's monitors judge: on the Agent's check, "no activity" is idle and idle_held at once."""
    if source is MetricsSource.DATADOG_AGENT and any(kind is IdleKind.IDLE for kind, _ in enabled):
        return [(kind, policy) for kind, policy in enabled if kind is not IdleKind.IDLE_HELD]
    return enabled


def _monitor(signature: _Signature, cells: Sequence[_Cell], overridden_teams: Sequence[str]) -> IdleMonitor:
    if signature.source is MetricsSource.DATADOG_AGENT:
        return _agent_monitor(signature, cells, overridden_teams)
    kind, policy = signature.kind, signature.policy
    where = _where(cells, overridden_teams)
    scope = " AND ".join([MANAGED_TAG, f"NOT {LEASE_KEY}:none", *([where] if where else [])])
    if kind is IdleKind.IDLE_HELD:
        scope += " AND state:idle_held"
    keys = [LEASE_KEY, HOST_KEY, *([DEVICE_KEY] if signature.per_device else [])]
    window = window_text(policy.window_minutes)
    metric = METRICS[kind]
    by = "by {" + ",".join(keys) + "}"
    if kind is IdleKind.IDLE:
        query, threshold = f"max({window}):max:{metric}{{{scope}}} {by} < 1", 1.0
    elif kind is IdleKind.IDLE_HELD:
        query, threshold = f"min({window}):min:{metric}{{{scope}}} {by} >= 1", 1.0
    else:
        threshold = float(policy.threshold_percent if policy.threshold_percent is not None else 0.0)
        query = f"avg({window}):avg:{metric}{{{scope}}} {by} < {_number(threshold)}"
    message = _message(kind, policy, signature.per_device)
    return _body(signature, cells, query, threshold, what=_WHAT[kind], message=message)


def _agent_monitor(signature: _Signature, cells: Sequence[_Cell], overridden_teams: Sequence[str]) -> IdleMonitor:
    """A monitor on the Datadog Agent GPU check's SM activity, grouped by the host's `ir` tag and the host."""
    kind, policy = signature.kind, signature.policy
    where = _where(cells, overridden_teams)
    # Only leased hosts carry an `ir:` tag; the wildcard keeps the rest (and their N/A group) out.
    scope = " AND ".join([MANAGED_TAG, f"{AGENT_LEASE_KEY}:ir-*", *([where] if where else [])])
    keys = [AGENT_LEASE_KEY, HOST_KEY, *([DEVICE_KEY] if signature.per_device else [])]
    window = window_text(policy.window_minutes)
    by = "by {" + ",".join(keys) + "}"
    metric = AGENT_ACTIVITY_METRIC
    if kind is IdleKind.LOW_UTILIZATION:
        threshold = float(policy.threshold_percent if policy.threshold_percent is not None else 0.0)
        query = f"avg({window}):avg:{metric}{{{scope}}} {by} < {_number(threshold)}"
    else:
        threshold = agent_usage.BUSY_PERCENT
        query = f"max({window}):max:{metric}{{{scope}}} {by} < {_number(threshold)}"
    what = _AGENT_WHAT[kind]
    message = _message(kind, policy, signature.per_device, lease_key=AGENT_LEASE_KEY, what=what)
    return _body(signature, cells, query, threshold, what=what, message=message)


def _body(
    signature: _Signature, cells: Sequence[_Cell], query: str, threshold: float, *, what: str, message: str
) -> IdleMonitor:
    kind, policy = signature.kind, signature.policy
    identity = json.dumps([kind.value, sorted((c.environment, c.team or "") for c in cells)])
    key = f"{kind.value.replace('_', '-')}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"
    envs = sorted({c.environment for c in cells})
    teams_named = sorted({c.team for c in cells if c.team})
    label = ", ".join(envs) + (f"; teams {', '.join(teams_named)}" if teams_named else "")
    name = f"{NAME_PREFIX}{what} ({label})"
    body: dict[str, Any] = {
        "name": name[:200],
        "type": "query alert",
        "query": query,
        "message": message,
        "tags": sorted(
            [
                MANAGED_TAG,
                f"{KEY_TAG_KEY}:{key}",
                f"{IDLE_KIND_TAG_KEY}:{kind.value}",
                f"{WINDOW_TAG_KEY}:{policy.window_minutes}m",
            ]
        ),
        "options": {
            "thresholds": {"critical": threshold},
            "notify_no_data": False,
            "require_full_window": False,
            "include_tags": True,
            # A fresh allocation is not idle: its groups are not evaluated for the start-up grace, nor before they
            # have one whole window of data (a lease idle from its allocation is warned a window after it, never on
            # the half-filled window the first evaluation after a shorter grace would see).
            "new_group_delay": signature.startup_minutes * 60,
            # While a group stays idle the webhook hears again each grace period (a cleared warning comes back).
            "renotify_interval": signature.grace_minutes,
            "renotify_statuses": ["alert"],
        },
    }
    return IdleMonitor(key, kind, body)


def window_text(minutes: int) -> str:
    """A monitor window as Datadog's reference writes it, in its largest whole unit: 30 -> `last_30m`, 60 ->
    `last_1h`, 120 -> `last_2h`, 1440 -> `last_1d`; ValueError for minutes that are not one of its windows."""
    if minutes not in MONITOR_WINDOW_MINUTES:
        raise ValueError(f"{minutes} minutes is not one of Datadog's documented monitor windows")
    if minutes % (24 * 60) == 0:
        return f"last_{minutes // (24 * 60)}d"
    if minutes % 60 == 0:
        return f"last_{minutes // 60}h"
    return f"last_{minutes}m"


def _where(cells: Sequence[_Cell], overridden_teams: Sequence[str]) -> str:
    """The environment/team part of a scope: exactly the cells given, merged where they share a team clause."""
    by_env: dict[str, set[str | None]] = {}
    for cell in cells:
        by_env.setdefault(cell.environment, set()).add(cell.team)
    clauses: dict[str, list[str]] = {}
    for env_name, teams in sorted(by_env.items()):
        if None in teams:
            rest = sorted(t for t in overridden_teams if t not in teams)
            clause = f"{TEAM_KEY} NOT IN ({', '.join(rest)})" if rest else ""
        else:
            named = sorted(t for t in teams if t is not None)
            clause = f"{TEAM_KEY}:{named[0]}" if len(named) == 1 else f"{TEAM_KEY} IN ({', '.join(named)})"
        clauses.setdefault(clause, []).append(env_name)
    parts = []
    for clause, envs in clauses.items():
        env_term = f"{ENVIRONMENT_KEY}:{envs[0]}" if len(envs) == 1 else f"{ENVIRONMENT_KEY} IN ({', '.join(envs)})"
        parts.append(f"{env_term} AND {clause}" if clause else env_term)
    if len(parts) == 1:
        return parts[0]
    return "(" + " OR ".join(f"({p})" for p in parts) + ")"


def _message(
    kind: IdleKind, policy: IdleKindPolicy, per_device: bool, *, lease_key: str = LEASE_KEY, what: str | None = None
) -> str:
    where = "{{host.name}}" + (" device {{gpu_uuid.name}}" if per_device else "")
    window = policy.window_minutes
    lease = "{{" + lease_key + ".name}}"
    return (
        f"{{{{#is_alert}}}}gpufarm lease {lease} on {where}: {what or _WHAT[kind]} over the last {window} "
        f"minutes (kind {kind.value}, {MESSAGE_VALUE_MARK}{{{{value}}}}). {IDLE_HANDLE}{{{{/is_alert}}}}"
        f"{{{{#is_recovery}}}}gpufarm lease {lease} on {where} is busy again "
        f"(kind {kind.value}). {IDLE_HANDLE}{{{{/is_recovery}}}}"
    )


def _number(value: float) -> str:
    return f"{value:g}"


# -- planning (pure) -----------------------------------------------------------------------------------------


def is_managed(monitor: Mapping[str, Any]) -> bool:
    """Whether a monitor is one of gpufarm's (it carries the managed tag and a key tag)."""
    tags = [str(t) for t in monitor.get("tags") or []]
    return MANAGED_TAG in tags and any(t.startswith(f"{KEY_TAG_KEY}:") for t in tags)


def monitor_key(monitor: Mapping[str, Any]) -> str | None:
    """A managed monitor's stable key (its KEY_TAG_KEY tag), or None."""
    for tag in monitor.get("tags") or []:
        if str(tag).startswith(f"{KEY_TAG_KEY}:"):
            return str(tag)[len(KEY_TAG_KEY) + 1 :]
    return None


def plan_monitors(current: Iterable[Mapping[str, Any]], wanted: Sequence[IdleMonitor], *, prune: bool) -> list[Change]:
    """Create, update, keep and (with prune) delete gpufarm's monitors so Datadog holds exactly `wanted`."""
    existing: dict[str, list[Mapping[str, Any]]] = {}
    for monitor in current:
        key = monitor_key(monitor) if is_managed(monitor) else None
        if key is not None:
            existing.setdefault(key, []).append(monitor)
    changes: list[Change] = []
    for want in wanted:
        name = str(want.body["name"])
        found = sorted(existing.pop(want.key, []), key=lambda m: int(m.get("id") or 0))
        if not found:
            changes.append(Change(KIND, name, Action.CREATE, want.key, want.body))
        else:
            target = found[0]
            differs = differences(target, want.body)
            action = Action.UPDATE if differs else Action.UNCHANGED
            changes.append(
                Change(KIND, name, action, ", ".join(differs), want.body, str(target.get("id")), tuple(differs))
            )
            # Twins of one key (a run interrupted between create and its answer): the oldest stays.
            changes += [_stale(m, prune, "duplicate of monitor " + str(target.get("id"))) for m in found[1:]]
    for monitors in existing.values():
        changes += [_stale(m, prune, "no longer in the idle policy") for m in monitors]
    return changes


def _stale(monitor: Mapping[str, Any], prune: bool, why: str) -> Change:
    name = str(monitor.get("name") or monitor.get("id"))
    if prune:
        return Change(KIND, name, Action.DELETE, why, target_id=str(monitor.get("id")))
    return Change(KIND, name, Action.UNCHANGED, f"{why}; --prune deletes it", target_id=str(monitor.get("id")))


def differences(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """What of `wanted` a stored monitor lacks: fields, tags, and each option gpufarm sets."""
    differs = [k for k in _COMPARED_FIELDS if current.get(k) != wanted.get(k)]
    if _kind_of(current.get("type")) != _kind_of(wanted.get("type")):
        differs.append("type")
    if sorted(current.get("tags") or []) != sorted(wanted.get("tags") or []):
        differs.append("tags")
    return differs + _option_differences(current.get("options") or {}, wanted.get("options") or {})


def _option_differences(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """`options.<key>` for each option gpufarm sets that the stored monitor holds otherwise (thresholds as numbers)."""
    differs = []
    for key, value in wanted.items():
        stored, want = have.get(key), value
        if key == "thresholds":
            stored = {k: float(v) for k, v in (stored or {}).items() if v is not None}
            want = {k: float(v) for k, v in value.items()}
        if stored != want:
            differs.append(f"options.{key}")
    return differs


def _kind_of(monitor_type: Any) -> str:
    # Datadog stores a created "metric alert" as "query alert"; they are one kind.
    return "query alert" if monitor_type == "metric alert" else str(monitor_type)


def validated(monitor: Mapping[str, Any]) -> Any:
    """The monitor as datadog-api-client's Monitor model; ValueError when the client cannot read all of it."""
    from datadog_api_client import ApiClient, Configuration
    from datadog_api_client.v1.model.monitor import Monitor

    with ApiClient(Configuration()) as client:  # type: ignore[no-untyped-call]
        model = client.deserialize(json.dumps(dict(monitor)), (Monitor,), True)
    if getattr(model, "_unparsed", False):
        raise ValueError(f"monitor {monitor.get('name')!r} has parts datadog-api-client does not know")
    return model
