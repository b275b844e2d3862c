"""The capacity outlook on the quota ledger dashboard: per pool and model, the four weeks ahead, from the gauges the
sync sends (gpufarm.core.outlook.gauges)."""

from __future__ import annotations

from gpufarm.setup.dashboards_farm.common import ENV, MODEL
from gpufarm.setup.dashboards_widgets import Chart, Series, scope


def outlook_charts() -> list[Chart]:
    """Free, leased and reserved GPUs per pool, model and week ahead (each the week's busiest moment)."""
    return [
        Chart(
            "table",
            "Outlook: GPUs free per pool and model, per week ahead (00 starts now; the busiest moment; leases held to "
            "their expected ends, reservations over their windows)",
            [
                Series("free", "min:gpufarm.outlook.free_gpus", "free GPUs"),
                Series("leased", "max:gpufarm.outlook.leased_gpus", "held by leases"),
                Series("reserved", "max:gpufarm.outlook.reserved_gpus", "reserved"),
            ],
            where=scope(ENV, MODEL),
            by=" by {environment,gpu_model,week}",
        ),
    ]
