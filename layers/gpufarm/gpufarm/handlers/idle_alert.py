"""The idle alert webhook (Function URL): Datadog's idle monitors say an allocation (or part of it) is idle or busy.

gpufarm's monitors (gpufarm.setup.monitors) group by the per-device lease tag and the host, so the scope reads
`gpu_ir:ir-12,host:gpu-a-01` (with `gpu_uuid:...` on shared pools); a monitor grouped `by {ir}` sends `ir:ir-12`.
Both are accepted; the hosts and devices, the idle kind and window (the monitor's tags) and the measured value
(the rendered message) travel in the command as its IdleScope, and an alert naming a host the lease does not hold
changes nothing. Alerts for unknown or foreign incidents, or scopes that name no lease, are answered 200 and
logged: Datadog must not retry what can never apply.

A notification can arrive late or out of order (a retried Triggered after its Recovered). Before acting, the
handler asks the monitor what its group says now: a Triggered whose group is no longer in Alert, or a Recovered
whose group is in Alert again, is stale and changes nothing. When the monitor cannot say (a hand-made monitor
deleted since, Datadog unreachable) the alert is acted on as it reads. A Recovered for a host clears that host's
warning only when no other group of the lease on that host (another kind's monitor) is still in Alert among
gpufarm's monitors; the lease's other hosts keep their own warnings (gpufarm.core.idle.partial), so half a lease getting
busy does not excuse the idle half.

Triggered / Re-Triggered / Renotify warn the requester once (Keep / Release buttons, phase idle-warned) and,
when the warning is older than the farm's grace period, resolve the incident with reason idle; the incident
webhook then reclaims. Recovered clears the warning. Other transitions (Warn, No Data) change nothing.

With the allocation queue wired (GPUFARM_ALLOCATION_QUEUE_URL) the alert becomes an incident command in the
incident's pool group and is answered 202: the warning is decided there, after any release or Keep queued before
it, never over it (docs/design.md, rule 7). Datadog's retries of one notification carry the same alert id,
transition and date, so they share a dedup id and collapse.

The squatter monitor (tagged gpufarm_monitor_kind:squatter) calls this same webhook: its notifications, validated
and checked for staleness the same way, become squatter commands (gpufarm.handlers.squatter_alert).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import IdleKind
from gpufarm.core.kernel.bounded import ascii_digits
from gpufarm.core.kernel.errors import GpufarmError, NotFound, UpstreamError
from gpufarm.core.kernel.hosts import MANAGED_TAG, SQUATTER_MONITOR_TAG
from gpufarm.core.kernel.ir import ir_tag_value, parse_ir
from gpufarm.core.kernel.serial import DEVICE_UUID, HOST_NAME, MAX_SCOPE_ITEMS, IdleScope, IncidentCommand, Op
from gpufarm.handlers import http, squatter_alert, telemetry, webhook
from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

LEASE_KEYS = ("ir", "gpu_ir")  # the host allocation tag, and the node agent's exact per-device tag
KIND_TAG = "gpufarm_idle_kind"
WINDOW_TAG = "gpufarm_idle_window"
_HOST_RE = re.compile(HOST_NAME)
_DEVICE_RE = re.compile(DEVICE_UUID)
_WINDOW_RE = re.compile(r"^([0-9]{1,5})m$")
_VALUE_RE = re.compile(r"\bvalue=(-?[0-9]{1,12}(?:\.[0-9]{1,12})?(?:[eE][+-]?[0-9]{1,3})?)")
_KINDS = frozenset(k.value for k in IdleKind)


class ScopeError(ValueError):
    """The alert's scope names no lease, or two different ones."""


IDLE_TRANSITIONS = frozenset({"triggered", "re-triggered", "renotify"})
BUSY_TRANSITIONS = frozenset({"recovered"})


class IdleAlert(BaseModel):
    """The idle webhook's payload (gpufarm.setup.webhooks.IDLE_PAYLOAD, rendered by Datadog)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    alert_transition: str = Field(min_length=1, max_length=40)
    alert_scope: str = Field(default="", max_length=2000)
    alert_id: str | int | None = None
    # Datadog's status line restates the query's scope and the group: a per-device group on a shared pool passes 200.
    alert_status: str = Field(default="", max_length=2000)
    alert_title: str = Field(default="", max_length=500)
    date: str = Field(default="", max_length=40)
    alert_query: str = Field(default="", max_length=2000)
    tags: str = Field(default="", max_length=4000)
    message: str = Field(default="", max_length=4000)

    def monitor_tags(self) -> list[str]:
        """The monitor's own tags ($TAGS), lowercased, at most a bounded number."""
        return [t.strip().lower() for t in self.tags.split(",") if t.strip()][:200]

    def scope_tags(self) -> list[str]:
        """The group's tags, lowercased (Datadog lowercases tags), at most a bounded number."""
        return [t.strip().lower() for t in self.alert_scope.split(",") if t.strip()][: 4 * MAX_SCOPE_ITEMS]

    def ir(self) -> int | None:
        """The IR of the monitor group (`ir:ir-123` or `gpu_ir:ir-123`); ScopeError when tags disagree."""
        found: set[int] = set()
        for tag in self.scope_tags():
            key, _, value = tag.partition(":")
            if key in LEASE_KEYS and value != "none":
                try:
                    found.add(parse_ir(value))
                except GpufarmError:
                    continue
        if len(found) > 1:
            raise ScopeError("the alert scope names more than one ir")
        return found.pop() if found else None

    def idle_scope(self) -> IdleScope:
        """Hosts and devices of the group, the idle kind and window (monitor tags) and the value (message)."""
        hosts, devices = self._hosts_and_devices()
        monitor_tags = self.monitor_tags()
        kind = _tag_value(monitor_tags, KIND_TAG)
        return IdleScope(
            hosts=tuple(hosts[:MAX_SCOPE_ITEMS]),
            devices=tuple(devices[:MAX_SCOPE_ITEMS]),
            kind=kind if kind in _KINDS else None,
            value=_measured(self.message),
            window_minutes=_window_minutes(_tag_value(monitor_tags, WINDOW_TAG)),
        )

    def _hosts_and_devices(self) -> tuple[list[str], list[str]]:
        """The well-formed host names and GPU uuids the group's scope names, each once, in order."""
        hosts: list[str] = []
        devices: list[str] = []
        for tag in self.scope_tags():
            key, _, value = tag.partition(":")
            if key == "host" and _HOST_RE.match(value) and value not in hosts:
                hosts.append(value)
            elif key == "gpu_uuid" and _DEVICE_RE.match(value) and value not in devices:
                devices.append(value)
        return hosts, devices


def _measured(message: str) -> float | None:
    """The value the monitor's message carries (a finite number), or None."""
    measured = _VALUE_RE.search(message)
    number = float(measured.group(1)) if measured else None
    return number if number is not None and math.isfinite(number) else None


def _window_minutes(tag: str | None) -> int | None:
    """The idle window a monitor's window tag names, in minutes (one minute to a week), or None."""
    window = _WINDOW_RE.match(tag or "")
    return int(window.group(1)) if window and 1 <= int(window.group(1)) <= 7 * 24 * 60 else None


def _tag_value(tags: list[str], key: str) -> str | None:
    prefix = f"{key}:"
    return next((t[len(prefix) :] for t in tags if t.startswith(prefix)), None)


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Act on one monitor notification."""
    return webhook.receive(event, IdleAlert, "idle alert", _act)


def _act(runtime: rt.Runtime, alert: IdleAlert, _token_in: str) -> dict[str, Any]:
    if SQUATTER_MONITOR_TAG in alert.monitor_tags():
        return _squatter(runtime, alert)
    try:
        ir = alert.ir()
    except ScopeError as exc:
        log.warning("idle alert ignored: %s (%s)", exc, alert.alert_scope[:200])
        return http.respond(200, {"ignored": str(exc)})
    transition = alert.alert_transition.strip().lower()
    if ir is None:
        return http.respond(200, {"ignored": "the alert scope names no ir"})
    telemetry.correlate(ir=ir)
    if transition not in IDLE_TRANSITIONS | BUSY_TRANSITIONS:
        return http.respond(200, {"ignored": f"transition {alert.alert_transition[:40]}"})
    scope = alert.idle_scope()
    svc = runtime.service()  # a missing configuration fails here, before any call to Datadog
    stale = _stale(runtime, alert, transition)
    if stale is None and transition in BUSY_TRANSITIONS:
        stale = _still_idle(runtime, alert, ir)
    if stale:
        log.info("idle alert for IR-%d ignored: %s", ir, stale)
        return http.respond(200, {"ir": f"IR-{ir}", "ignored": stale})
    command = IncidentCommand(
        op=Op.IDLE if transition in IDLE_TRANSITIONS else Op.BUSY,
        ir=ir,
        origin=f"{alert.alert_id}|{transition}|{alert.date}"[:300],
        idle=scope if scope != IdleScope() else None,
    )
    where = scope.describe()
    try:
        done = executor.submit(svc.context, command)
    except NotFound:
        # Unknown, deleted, or another incident type's: nothing gpufarm holds. Datadog must not retry it.
        log.warning("idle alert for IR-%d ignored: no such gpufarm allocation (%s)", ir, where)
        return http.respond(200, {"ir": f"IR-{ir}", "ignored": f"IR-{ir} is not a gpufarm allocation"})
    except UpstreamError as exc:
        log.error("idle alert for IR-%d failed: %s", ir, exc)  # noqa: TRY400
        return http.error(503, "upstream failure; retry")
    except GpufarmError as exc:
        return http.error(409, str(exc))
    if done is None:
        extra = _scope_answer(scope)
        return http.respond(202, {"ir": f"IR-{ir}", "queued": command.op.value, **extra})
    log.info("%s", done)
    return http.respond(200, {"ir": f"IR-{ir}", "outcome": done})


def _squatter(runtime: rt.Runtime, alert: IdleAlert) -> dict[str, Any]:
    """The squatter monitor's notification: the same payload and staleness check, its own commands."""
    transition = alert.alert_transition.strip().lower()
    stale = _stale(runtime, alert, transition) if transition in IDLE_TRANSITIONS | BUSY_TRANSITIONS else None
    found = squatter_alert.SquatterAlert(
        transition=transition,
        scope_tags=alert.scope_tags(),
        origin=f"{alert.alert_id}|{transition}|{alert.date}",
        value=_measured(alert.message),
    )
    return squatter_alert.act(runtime, found, stale)


def _stale(runtime: rt.Runtime, alert: IdleAlert, transition: str) -> str | None:
    """Why the alert no longer holds (its monitor's group says otherwise now), or None."""
    monitor_id = ascii_digits(str(alert.alert_id or "").strip(), max_digits=18)
    if monitor_id is None:
        return None
    try:
        status = runtime.monitor_states().group_status(monitor_id, alert.scope_tags())
    except GpufarmError as exc:
        log.warning("idle alert: monitor %s state unknown (%s); acting on the alert as sent", monitor_id, exc)
        return None
    if status is None:
        return None
    if transition in IDLE_TRANSITIONS and status != "Alert":
        return f"stale {alert.alert_transition[:40]}: the monitor's group is {status[:20]} now"
    if transition in BUSY_TRANSITIONS and status == "Alert":
        return f"stale {alert.alert_transition[:40]}: the monitor's group is in Alert again"
    return None


def _still_idle(runtime: rt.Runtime, alert: IdleAlert, ir: int) -> str | None:
    """Where the lease is still idle by another of gpufarm's monitor groups, or None."""
    lease = {f"{key}:{ir_tag_value(ir)}" for key in LEASE_KEYS}
    this = (str(alert.alert_id or "").strip(), frozenset(alert.scope_tags()))
    try:
        groups = runtime.monitor_states().alerting_groups(MANAGED_TAG, excluding=SQUATTER_MONITOR_TAG)
    except GpufarmError as exc:
        log.warning("idle alert: gpufarm's alerting monitor groups unknown (%s); acting on the alert as sent", exc)
        return None
    others = _other_idle_groups(groups, lease, this, {t for t in alert.scope_tags() if t.startswith("host:")})
    if not others:
        return None
    hosts = sorted({t[len("host:") :] for _, tags in others for t in tags if t.startswith("host:")})
    where = f" on {', '.join(hosts[:5])}" if hosts else ""
    return f"IR-{ir} is still idle{where} (monitor {others[0][0]}); the warning stands"


def _other_idle_groups(
    groups: list[tuple[int, tuple[str, ...]]],
    lease: set[str],
    this: tuple[str, frozenset[str]],
    hosts_named: set[str],
) -> list[tuple[int, tuple[str, ...]]]:
    """The alerting groups, other than this alert's, that say the lease is idle where this alert spoke of."""
    others = [(mid, tags) for mid, tags in groups if lease & set(tags) and (str(mid), frozenset(tags)) != this]
    if hosts_named:
        # Idle state is kept per host (gpufarm.core.idle.partial): only the same host's other groups, or a lease-wide
        # one, keep this host's warning; another host still idle keeps its own.
        others = [(mid, tags) for mid, tags in others if hosts_named & set(tags) or not _names_host(tags)]
    return others


def _names_host(tags: tuple[str, ...]) -> bool:
    return any(t.startswith("host:") for t in tags)


def _scope_answer(scope: IdleScope) -> dict[str, Any]:
    """The alert's hosts, devices and kind in the answer, where it named them."""
    out: dict[str, Any] = {}
    if scope.hosts:
        out["hosts"] = list(scope.hosts)
    if scope.devices:
        out["devices"] = list(scope.devices)
    if scope.kind:
        out["kind"] = scope.kind
    return out
