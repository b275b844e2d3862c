"""Lending and quota changes in the demo's accelerated time: the demo's `lending` and `quota change` stages on a
fresh local host made ready as the integration tests make it, and when each step happened on the sandbox clock.

Lending: the borrower's allocation to its preemption notice (the protection window, 1 h, then the sync's next
tick), the notice to its reclaim (notice_minutes, 30), and the lender's request to its allocation. Quota change:
asked to approved, approved to ended, and how long after its `until` the sweep ended it (the stage moves the clock
two days at once, so this is bounded by that jump, not by the sweep's minute). Wall seconds per stage too.

Run: .venv/bin/python benchmarks/lending.py. Prints one JSON document.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

from gpufarm.config import Settings
from gpufarm_sandbox.demo import lending_stage, quota_change_stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import start_local


def _minutes(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds() / 60, 1) if start and end else None


def main() -> None:
    logging.disable(logging.WARNING)
    lines: list[str] = []
    walls: dict[str, float] = {}
    with start_local(port=0) as env:
        LocalFarm.ready(env).close()
        ctx = DemoContext(sandbox=env.sandbox, base_url=env.url, settings=Settings(), out=lines.append, local=env)
        for name, stage in (("lending", lending_stage), ("quota change", quota_change_stage)):
            started = time.perf_counter()
            stage.run(ctx)
            walls[name] = round(time.perf_counter() - started, 1)
    lend: dict[str, Any] = ctx.shared.get("lending_times", {})
    quota: dict[str, Any] = ctx.shared.get("quota_change_times", {})
    print(
        json.dumps(
            {
                "checks": ctx.checks,
                "failures": ctx.failures,
                "wall_s": walls,
                "lending_minutes": {
                    "allocated_to_notice": _minutes(lend.get("borrower_allocated"), lend.get("notice")),
                    "notice_to_reclaimed": _minutes(lend.get("notice"), lend.get("reclaimed")),
                    "lender_asked_to_allocated": _minutes(lend.get("lender_asked"), lend.get("lender_allocated")),
                },
                "quota_change_minutes": {
                    "asked_to_approved": _minutes(quota.get("requested"), quota.get("approved")),
                    "approved_to_ended": _minutes(quota.get("approved"), quota.get("expired")),
                    "until_to_ended": _minutes(quota.get("until"), quota.get("expired")),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
