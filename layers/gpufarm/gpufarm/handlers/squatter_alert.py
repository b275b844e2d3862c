"""The squatter monitor's notifications, which reach the idle alert webhook (the same Function URL, secret and
validated payload, gpufarm.handlers.idle_alert, which hands them here by the monitor's kind tag).

A group reads `host:<h>,gpu_uuid:<uuid>,gpu_ir:ir-<n>` (`gpu_ir:none`: a device no lease holds;
gpufarm.setup.squatter_monitor). Triggered / Re-Triggered / Renotify become a squatter command, Recovered a
squatter-clear command, in the hurt lease's pool group (gpufarm.core.commands.executor: one writer per incident);
the episode's rules are gpufarm.core.squatters'. A group naming no lease is one command in the unassigned group,
keyed by the notification (alert id, transition, date): Datadog's retries of it share the queue's dedup id and
collapse, and no state store is invented for a device nobody holds; its re-notifications and recovery tell no
one. A scope without a well-formed host and device, or naming two leases, changes nothing and is answered 200
(Datadog must not retry what can never apply).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufarm.core.commands import executor
from gpufarm.core.kernel.errors import GpufarmError, NotFound, UpstreamError
from gpufarm.core.kernel.ir import parse_ir
from gpufarm.core.kernel.serial import DEVICE_UUID, HOST_NAME, IncidentCommand, Op, SquatterScope
from gpufarm.handlers import http, telemetry
from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

ALERT_TRANSITIONS = frozenset({"triggered", "re-triggered", "renotify"})
CLEAR_TRANSITIONS = frozenset({"recovered"})
# What starts an alert (a device no lease holds is told of these only).
FIRST_TRANSITIONS = frozenset({"triggered", "re-triggered"})
NO_LEASE = "none"
_HOST_RE = re.compile(HOST_NAME)
_DEVICE_RE = re.compile(DEVICE_UUID)


@dataclass(frozen=True)
class SquatterAlert:
    """What the squatter webhook acts on, from the idle webhook's validated payload."""

    transition: str  # lowercased
    scope_tags: Sequence[str]  # lowercased, bounded
    origin: str  # the notification: alert id, transition, date
    value: float | None = None


def group_of(tags: Sequence[str]) -> tuple[str | None, str | None, int | None, bool]:
    """(host, device, lease IR or None, well-formed) of a squatter group's tags."""
    values: dict[str, set[str]] = {"host": set(), "gpu_uuid": set(), "gpu_ir": set()}
    for key, _, value in (t.partition(":") for t in tags):
        if key in values:
            values[key].add(value)
    hosts = {v for v in values["host"] if _HOST_RE.match(v)}
    devices = {v for v in values["gpu_uuid"] if _DEVICE_RE.match(v)}
    leases = values["gpu_ir"]
    if len(hosts) != 1 or len(devices) != 1 or len(leases) != 1:
        return None, None, None, False
    lease = leases.pop()
    if lease == NO_LEASE:
        return hosts.pop(), devices.pop(), None, True
    try:
        return hosts.pop(), devices.pop(), parse_ir(lease), True
    except GpufarmError:
        return None, None, None, False


def act(runtime: rt.Runtime, alert: SquatterAlert, stale: str | None) -> dict[str, Any]:
    """Turn one squatter notification into its command; `stale`: why the monitor's group says otherwise now."""
    host, device, ir, ok = group_of(alert.scope_tags)
    if not ok or host is None or device is None:
        return http.respond(200, {"ignored": "the squatter alert's scope names no one host, device and lease"})
    if ir is not None:
        telemetry.correlate(ir=ir)
    ignored = _ignored(alert, host, device, ir, stale)
    if ignored is not None:
        return http.respond(200, {"ignored": ignored})
    value = alert.value if alert.value is not None and 0 <= alert.value <= 1024 else None
    command = IncidentCommand(
        op=Op.SQUATTER if alert.transition in ALERT_TRANSITIONS else Op.SQUATTER_CLEAR,
        ir=ir,
        origin=alert.origin[:300],
        squatter=SquatterScope(host=host, device=device, value=value),
    )
    return _submit(
        runtime, command, {"lease": f"IR-{ir}" if ir is not None else "no lease", "host": host, "device": device}
    )


def _ignored(alert: SquatterAlert, host: str, device: str, ir: int | None, stale: str | None) -> str | None:
    """Why this notification changes nothing, or None when it is to be acted on."""
    if alert.transition not in ALERT_TRANSITIONS | CLEAR_TRANSITIONS:
        return f"transition {alert.transition[:40]}"
    if ir is None and alert.transition not in FIRST_TRANSITIONS:
        # Without a lease there is no episode to remember: the operators hear of a group when it starts alerting,
        # not again at every re-notification (which stop-after pools elsewhere turn on for the whole monitor).
        return f"{alert.transition[:40]} of a device no lease holds: told at its alert"
    if stale:
        log.info("squatter alert for %s %s ignored: %s", host, device, stale)
        return stale
    return None


def _submit(runtime: rt.Runtime, command: IncidentCommand, answer: dict[str, Any]) -> dict[str, Any]:
    """Run or queue the command in the lease's pool group; the webhook's answer says which."""
    lease = answer["lease"]
    try:
        done = executor.submit(runtime.service().context, command)
    except NotFound:
        log.warning("squatter alert for %s ignored: no such gpufarm allocation", lease)
        return http.respond(200, {"ignored": f"{lease} is not a gpufarm allocation"})
    except UpstreamError as exc:
        log.error("squatter alert for %s failed: %s", lease, exc)  # noqa: TRY400
        return http.error(503, "upstream failure; retry")
    except GpufarmError as exc:
        return http.error(409, str(exc))
    if done is None:
        return http.respond(202, {**answer, "queued": command.op.value})
    log.info("%s", done)
    return http.respond(200, {**answer, "outcome": done})
