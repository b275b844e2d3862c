"""The idle alert webhook (Function URL): Datadog's idle monitor, grouped by `ir`, says an allocation is idle or busy.

Triggered / Re-Triggered / Renotify warn the requester once (Keep / Release buttons, phase idle-warned) and,
when the warning is older than the farm's grace period, resolve the incident with reason idle; the incident
webhook then reclaims. Recovered clears the warning. Other transitions (Warn, No Data) change nothing.

With the allocation queue wired (GPUFARM_ALLOCATION_QUEUE_URL) the alert becomes an incident command in the
incident's pool group and is answered 202: the warning is decided there, after any release or Keep queued before
it, never over it (docs/design.md, rule 7). Datadog's retries of one notification carry the same alert id,
transition and date, so they share a dedup id and collapse.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core import executor
from gpufarm.core.errors import GpufarmError, NotFound, UpstreamError
from gpufarm.core.ir import ir_from_tags
from gpufarm.core.serial import IncidentCommand, Op
from gpufarm.handlers import http, telemetry, webhook
from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

IDLE_TRANSITIONS = frozenset({"triggered", "re-triggered", "renotify"})
BUSY_TRANSITIONS = frozenset({"recovered"})


class IdleAlert(BaseModel):
    """The idle webhook's payload (gpufarm.setup.apply.IDLE_PAYLOAD, rendered by Datadog)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    alert_transition: str = Field(min_length=1, max_length=40)
    alert_scope: str = Field(default="", max_length=2000)
    alert_id: str | int | None = None
    alert_status: str = Field(default="", max_length=200)
    alert_title: str = Field(default="", max_length=500)
    date: str = Field(default="", max_length=40)

    def ir(self) -> int | None:
        """The IR of the monitor group (`ir:ir-123` in the comma-separated scope)."""
        return ir_from_tags([t.strip() for t in self.alert_scope.split(",") if t.strip()])


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Act on one monitor notification."""
    return webhook.receive(event, IdleAlert, "idle alert", _act)


def _act(runtime: rt.Runtime, alert: IdleAlert) -> dict[str, Any]:
    ir = alert.ir()
    transition = alert.alert_transition.strip().lower()
    if ir is None:
        return http.respond(200, {"ignored": "the alert scope names no ir"})
    telemetry.correlate(ir=ir)
    if transition not in IDLE_TRANSITIONS | BUSY_TRANSITIONS:
        return http.respond(200, {"ignored": f"transition {alert.alert_transition[:40]}"})
    svc = runtime.service()
    command = IncidentCommand(
        op=Op.IDLE if transition in IDLE_TRANSITIONS else Op.BUSY,
        ir=ir,
        origin=f"{alert.alert_id}|{transition}|{alert.date}"[:300],
    )
    try:
        done = executor.submit(svc, command)
    except NotFound:
        return http.error(404, f"IR-{ir} does not exist")
    except UpstreamError as exc:
        log.error("idle alert for IR-%d failed: %s", ir, exc)  # noqa: TRY400
        return http.error(503, "upstream failure; retry")
    except GpufarmError as exc:
        return http.error(409, str(exc))
    if done is None:
        return http.respond(202, {"ir": f"IR-{ir}", "queued": command.op.value})
    log.info("%s", done)
    return http.respond(200, {"ir": f"IR-{ir}", "outcome": done})
