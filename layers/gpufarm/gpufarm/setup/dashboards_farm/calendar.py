"""The pools' calendars on the quota ledger dashboard: the reserved column and each pool's days ahead, from the
gauges the sync sends (gpufarm.core.calendar.gauges)."""

from __future__ import annotations

from gpufarm.setup.dashboards_farm.common import ENV, MODEL, TEAM
from gpufarm.setup.dashboards_widgets import Chart, Series, scope


def calendar_charts() -> list[Chart]:
    """Reserved GPU-hours ahead per team, project, pool and model; GPUs reserved per pool, model and day ahead."""
    return [
        Chart(
            "table",
            "Reserved GPU-hours ahead per team, project, environment and model (reservations not begun)",
            [Series("reserved", "sum:gpufarm.ledger.gpu_hours.reserved", "reserved GPU-hours")],
            where=scope(TEAM, ENV, MODEL),
            by=" by {team,project,environment,gpu_model}",
        ),
        Chart(
            "table",
            "Calendar: GPUs reserved per pool and model, per day ahead (00 is today, UTC; the busiest moment)",
            [Series("reserved", "max:gpufarm.calendar.gpus.reserved", "GPUs reserved")],
            where=scope(ENV, MODEL),
            by=" by {environment,gpu_model,day}",
        ),
    ]
