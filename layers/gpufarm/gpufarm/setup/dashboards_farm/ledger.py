"""The quota ledger dashboard: entitled / allocated / used / idle / idle-held / unmeasured per team, project,
environment and model, and what they cost an hour by kind; each pool's unallocated GPUs' cost; reserved GPU-hours,
the pools' calendars and the four weeks' free capacity; budget burn; inventory; unattributed usage per host and team.
"""

from __future__ import annotations

from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.setup.dashboards_farm.calendar import calendar_charts
from gpufarm.setup.dashboards_farm.common import (
    ENV,
    LEASED,
    MODEL,
    TEAM,
    budget_table,
    dashboard,
    env_values,
    model_values,
)
from gpufarm.setup.dashboards_farm.outlook import outlook_charts
from gpufarm.setup.dashboards_widgets import Chart, Formula, Series, note, scope, template_variable


def quota_ledger(farm: FarmConfig) -> dict[str, Any]:
    """Entitled, allocated and used per team, environment and model; inventory; unattributed usage."""
    q = scope(TEAM, ENV, MODEL)
    by = " by {team,environment,gpu_model}"
    variables = [
        template_variable("team", "team", sorted(farm.teams)),
        template_variable("environment", "environment", env_values(farm)),
        template_variable("gpu_model", "gpu_model", model_values(farm)),
    ]
    return dashboard(
        "gpufarm: quota ledger",
        variables,
        [
            note(
                "**Quota ledger.** Entitled is the farm configuration's quota, allocated what the team's leases "
                "hold, used / idle / unmeasured what the agents' metrics say of those GPUs (all from the scheduled "
                "sync; unmeasured GPUs are never counted idle); budgets are GPU-hours per period. Unattributed "
                "usage is busy GPUs no lease claims."
            ),
            Chart(
                "table",
                "Entitled and allocated per team, environment and model",
                [
                    Series("entitled", "sum:gpufarm.quota.entitled", "entitled GPUs and slices"),
                    Series("allocated", "sum:gpufarm.quota.allocated", "allocated GPUs and slices"),
                ],
                where=q,
                by=by,
                formulas=[Formula("100 * allocated / entitled", "% of entitlement")],
            ),
            Chart(
                "table",
                "Held GPUs and slices per team, project, environment and model: used, idle, unmeasured (sync's ledger)",
                [
                    Series("held", "sum:gpufarm.ledger.gpus.allocated", "allocated GPUs and slices"),
                    Series("used", "sum:gpufarm.ledger.gpus.used", "used (busy)"),
                    Series("idle", "sum:gpufarm.ledger.gpus.idle", "idle"),
                    Series("idle_held", "sum:gpufarm.ledger.gpus.idle_held", "of idle: idle-held (memory, no work)"),
                    Series("unmeasured", "sum:gpufarm.ledger.gpus.unmeasured", "unmeasured (no metrics)"),
                ],
                where=q,
                by=" by {team,project,environment,gpu_model}",
            ),
            Chart(
                "table",
                "Cost an hour of the held GPUs per team, project and pool, by kind (rate card; unpriced pools absent)",
                [Series("cost", "sum:gpufarm.ledger.cost.per_hour", "cost an hour")],
                where=q,
                by=" by {team,project,environment,kind,currency}",
            ),
            Chart(
                "timeseries",
                "Cost an hour per team and kind (busy, idle, idle-held, unmeasured)",
                [Series("cost", "sum:gpufarm.ledger.cost.per_hour", "cost an hour")],
                where=q,
                by=" by {team,kind}",
            ),
            Chart(
                "table",
                "Unallocated capacity: what each pool's GPUs no lease holds cost an hour",
                [Series("unallocated", "sum:gpufarm.ledger.cost.unallocated_per_hour", "cost an hour")],
                where=scope(ENV, MODEL),
                by=" by {environment,gpu_model,currency}",
            ),
            *calendar_charts(),
            *outlook_charts(),
            Chart(
                "table",
                "Used now: busy devices per team, environment and model (node agents)",
                [Series("busy", "sum:gpufarm.gpu.idle_state", "busy devices")],
                where=scope(q, "state:busy", LEASED),
                by=by,
            ),
            budget_table(scope(TEAM)),
            Chart(
                "timeseries",
                "Allocated vs entitled per team",
                [
                    Series("entitled", "sum:gpufarm.quota.entitled", "entitled"),
                    Series("allocated", "sum:gpufarm.quota.allocated", "allocated"),
                ],
                where=q,
                by=" by {team}",
            ),
            Chart(
                "table",
                "Inventory per environment and model",
                [
                    Series("total", "sum:gpufarm.inventory.gpus.total", "total GPUs and slices"),
                    Series("free", "sum:gpufarm.inventory.gpus.free", "free GPUs and slices"),
                ],
                where=scope(ENV, MODEL),
                by=" by {environment,gpu_model}",
            ),
            Chart(
                "toplist",
                "Unattributed usage: busy GPUs and MIG slices no lease claims, per host and team (the sync's ledger)",
                [Series("a", "sum:gpufarm.ledger.gpus.unattributed", "busy GPUs and slices")],
                where=scope(ENV),
                by=" by {host,team}",
            ),
            Chart(
                "toplist",
                "Unattributed usage now: busy devices no lease holds, per host (node agents)",
                [Series("a", "sum:gpufarm.gpu.idle_state", "busy devices")],
                where=scope(ENV, "state:busy", "gpu_ir:none"),
                by=" by {host}",
            ),
        ],
    )
