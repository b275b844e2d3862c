"""Schedules as the local host runs them: each function's Schedule / ScheduleV2 events fire on the sandbox clock,
checked whenever the clock moves and every few seconds of real time; a jump over several periods fires once."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.localhost.env import ACCOUNT_ID, REGION
from gpufarm_sandbox.localhost.functions import LocalFunction
from gpufarm_sandbox.localhost.schedule import Expression, ScheduleError
from gpufarm_sandbox.localhost.template import ScheduleSpec

if TYPE_CHECKING:
    from gpufarm_sandbox.localhost.function_host import FunctionHost

log = logging.getLogger("gpufarm_sandbox.localhost")

TICK_S = 2.0  # schedules are also checked this often in real time (the sandbox clock moves with real time)
MAX_MISSED_TICKS = 100_000  # a jump of the clock is followed this many ticks at most to find the last one due
# EventBridge Scheduler's context attributes, replaced in a ScheduleV2's Input (docs/slack-lambda.md, "SAM").
SCHEDULER_ATTRIBUTES = ("schedule-arn", "scheduled-time", "execution-id", "attempt-number")


@dataclass
class ScheduledTrigger:
    """A schedule of one function and when it fires next on the sandbox clock."""

    function: LocalFunction
    spec: ScheduleSpec
    expression: Expression | None
    start: float
    next_due: float | None
    last_fired: float | None = None
    fired: int = 0
    error: str | None = None


def iso_utc(epoch: float | None) -> str | None:
    """An epoch time as ISO 8601 UTC with a Z, as AWS writes times (None stays None)."""
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


class Scheduler:
    """The template's schedules and the thread that checks them in real time."""

    def __init__(self, host: FunctionHost) -> None:
        self.host = host
        # While paused, schedules do not fire (tests that move the clock past a tick and must see only their own
        # trigger act); due ticks fire at the first check after resuming.
        self.paused = False
        now = host.clock.now()
        self.schedules: list[ScheduledTrigger] = []
        for fn in host.functions.values():
            for spec in fn.spec.schedules:
                try:
                    expression: Expression | None = Expression.parse(spec.expression, spec.timezone)
                except ScheduleError as exc:
                    log.warning("%s.%s is not scheduled locally: %s", fn.spec.logical_id, spec.name, exc)
                    self.schedules.append(ScheduledTrigger(fn, spec, None, now, None, error=str(exc)))
                    continue
                assert expression is not None
                due = expression.next_after(now, start=now) if spec.enabled else None
                self.schedules.append(ScheduledTrigger(fn, spec, expression, now, due))
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="gpufarm-schedules", daemon=True)

    def start(self) -> None:
        """Follow the sandbox clock and start the real-time checks."""
        self.host.clock.subscribe(self.on_clock)
        self._ticker.start()

    def stop(self) -> None:
        """Stop the real-time checks."""
        self._stop.set()
        self._ticker.join(timeout=5)

    def state(self) -> list[dict[str, Any]]:
        """Each schedule's timetable for `/_local/state`."""
        return [
            {
                "function": t.function.spec.logical_id,
                "name": t.spec.name,
                "kind": t.spec.kind,
                "expression": t.spec.expression,
                "enabled": t.spec.enabled and t.expression is not None,
                "next_tick": iso_utc(t.next_due),
                "last_tick": iso_utc(t.last_fired),
                "fired": t.fired,
                "error": t.error,
            }
            for t in self.schedules
        ]

    def on_clock(self, now: float) -> None:
        """The sandbox clock moved (set or advanced): fire what became due."""
        if not self.host.closed:
            self.tick(now)

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick(self.host.clock.now())

    def tick(self, now: float) -> None:
        """Fire every due schedule once; a jump over several periods fires once, not once per missed period."""
        due: list[tuple[ScheduledTrigger, float]] = []
        with self.host.lock:
            if self.host.closed or self.paused:
                return
            for trigger in self.schedules:
                if trigger.expression is None or trigger.next_due is None or trigger.next_due > now:
                    continue
                scheduled = self._latest_due(trigger, now)
                trigger.last_fired = now
                trigger.fired += 1
                trigger.next_due = trigger.expression.next_after(now, start=trigger.start)
                due.append((trigger, scheduled))
        for trigger, scheduled in due:
            try:
                self.host.start_task(
                    self.host.run_async, trigger.function, self._schedule_event(trigger, now, scheduled), "schedule"
                )
            except RuntimeError:
                return

    def rebase(self, start: float) -> None:
        """Restart every enabled schedule's timetable from start."""
        for trigger in self.schedules:
            trigger.start = start
            if trigger.expression is not None and trigger.spec.enabled:
                trigger.next_due = trigger.expression.next_after(start, start=start)

    @staticmethod
    def _latest_due(trigger: ScheduledTrigger, now: float) -> float:
        """The last tick of the timetable at or before now (a jump over several ticks fires once, as the last)."""
        assert trigger.expression is not None and trigger.next_due is not None
        tick = trigger.next_due
        for _ in range(MAX_MISSED_TICKS):
            following = trigger.expression.next_after(tick, start=trigger.start)
            if following is None or following > now:
                break
            tick = following
        return tick

    def _schedule_event(self, trigger: ScheduledTrigger, now: float, scheduled: float | None = None) -> Any:
        """ScheduleV2 passes its Input as-is ({} without one); a classic Schedule wraps it in a Scheduled Event.

        EventBridge Scheduler fills context attributes into a ScheduleV2's Input before it invokes the target
        (`<aws.scheduler.scheduled-time>` and the others in SCHEDULER_ATTRIBUTES); the local host does the same.
        """
        spec = trigger.spec
        if spec.input is not None:
            text = spec.input
            if spec.kind == "ScheduleV2":
                values = {
                    "schedule-arn": f"arn:aws:scheduler:{REGION}:{ACCOUNT_ID}:schedule/default/"
                    f"{trigger.function.spec.logical_id}-{spec.name}",
                    "scheduled-time": iso_utc(scheduled if scheduled is not None else now) or "",
                    "execution-id": uuid.uuid4().hex[:16],
                    "attempt-number": "1",
                }
                for name in SCHEDULER_ATTRIBUTES:
                    text = text.replace(f"<aws.scheduler.{name}>", values[name])
            try:
                return json.loads(text)
            except ValueError:
                return text
        if spec.kind == "ScheduleV2":
            return {}
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": ACCOUNT_ID,
            "time": iso_utc(now),
            "region": REGION,
            "resources": [f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{trigger.function.spec.logical_id}-{spec.name}"],
            "detail": {},
        }
