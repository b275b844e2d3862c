"""The farm overview dashboard: per environment and GPU model, total / allocated / free GPUs, busy / idle / lost
devices, down and agentless GPUs, waiting requests and the longest wait, idle warnings and reclaims by reason;
cloud quota used vs limit and held by leases; inventory source errors; one group per environment of the farm.
"""

from __future__ import annotations

from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.setup.dashboards_farm.common import ENV, MODEL, dashboard, env_values, model_values
from gpufarm.setup.dashboards_widgets import Chart, Formula, Series, Widget, group, note, scope, template_variable


def farm_overview(farm: FarmConfig) -> dict[str, Any]:
    """Capacity and state per environment and model, one group per environment of the farm."""
    s = scope(ENV, MODEL)
    by = " by {environment,gpu_model}"
    widgets: list[Widget | Chart] = [
        note(
            "**gpufarm farm overview.** Capacity comes from the scheduled sync (`gpufarm.inventory.*`, "
            "`gpufarm.quota.allocated`, the cloud sources' `gpufarm.cloud.*`); device states from the node agents "
            "(`gpufarm.gpu.idle_state`: busy, idle, idle with memory held; `gpufarm.gpu.unhealthy`). A MIG slice "
            "counts as one device. Waiting requests and leases warned as idle are the sync's gauges "
            "(`gpufarm.requests.*`, `gpufarm.leases.idle_warned`); idle warnings and reclaims are counted as they "
            "are recorded (`gpufarm.leases.idle_warnings`, `gpufarm.leases.reclaims` by `reclaim_reason`)."
        ),
        Chart(
            "table",
            "Capacity per environment and model",
            [
                Series("total", "sum:gpufarm.inventory.gpus.total", "total GPUs and slices"),
                Series("free", "sum:gpufarm.inventory.gpus.free"),
                Series("allocated", "sum:gpufarm.quota.allocated", "allocated"),
            ],
            where=s,
            by=by,
            formulas=[Formula("free", "free")],  # the free column after the allocated one
        ),
        Chart(
            "table",
            "Devices busy, idle and down per environment and model",
            [
                Series("busy", "sum:gpufarm.gpu.idle_state", "busy", filter="state:busy"),
                Series("idle", "sum:gpufarm.gpu.idle_state", "idle (no process)", filter="state:idle"),
                Series("held", "sum:gpufarm.gpu.idle_state", "idle, memory held", filter="state:idle_held"),
                Series("down", "sum:gpufarm.gpu.unhealthy", "down (lost)"),
            ],
            where=s,
            by=by,
        ),
        Chart(
            "table",
            "Down and agentless GPUs per environment and model",
            [
                Series("down", "sum:gpufarm.inventory.gpus.down", "down (node silent)"),
                Series(
                    "no_agent", "sum:gpufarm.inventory.gpus.no_agent", "no agent (seen by a cloud or static source)"
                ),
            ],
            where=s,
            by=by,
        ),
        *_lifecycle(s, by),
        Chart(
            "table",
            "Cloud quota per region and GPU family: used vs limit, held by gpufarm",
            [
                Series("limit", "sum:gpufarm.cloud.quota.limit", "limit (vCPUs / cores)"),
                Series("used", "sum:gpufarm.cloud.quota.used", "used"),
                Series("held", "sum:gpufarm.cloud.quota.held", "held by leases"),
            ],
            by=" by {source,region,family}",
            formulas=[Formula("100 * used / limit", "% of limit used")],
        ),
        Chart(
            "toplist",
            "Inventory source errors in the last sync (skipped and reported)",
            [Series("a", "sum:gpufarm.inventory.source.errors", "errors")],
            by=" by {source}",
        ),
        Chart(
            "timeseries",
            "Devices by state",
            [Series("a", "sum:gpufarm.gpu.idle_state", "devices")],
            where=s,
            by=" by {state}",
            display="area",
        ),
    ]
    for name in env_values(farm):
        env = farm.environments[name]
        e = f"environment:{name}"
        models = ", ".join(env.gpu_models)
        widgets.append(
            group(
                f"{name} ({env.kind.value}: {models})",
                [
                    Chart(
                        "query_value",
                        "Total GPUs and slices",
                        [Series("a", "sum:gpufarm.inventory.gpus.total")],
                        where=e,
                    ),
                    Chart(
                        "query_value",
                        "Allocated GPUs and slices",
                        [Series("a", "sum:gpufarm.quota.allocated")],
                        where=e,
                    ),
                    Chart(
                        "query_value", "Free GPUs and slices", [Series("a", "sum:gpufarm.inventory.gpus.free")], where=e
                    ),
                    Chart(
                        "query_value",
                        "Busy devices",
                        [Series("a", "sum:gpufarm.gpu.idle_state", filter="state:busy")],
                        where=e,
                    ),
                    Chart("query_value", "Waiting requests", [Series("a", "sum:gpufarm.requests.waiting")], where=e),
                    Chart("query_value", "Longest wait", [Series("a", "max:gpufarm.requests.oldest_wait")], where=e),
                    Chart(
                        "timeseries",
                        "Free vs total GPUs and MIG slices (a slice counts one)",
                        [
                            Series("total", "sum:gpufarm.inventory.gpus.total", "total"),
                            Series("free", "sum:gpufarm.inventory.gpus.free", "free"),
                        ],
                        where=e,
                        by=" by {gpu_model}",
                    ),
                ],
            )
        )
    variables = [
        template_variable("environment", "environment", env_values(farm)),
        template_variable("gpu_model", "gpu_model", model_values(farm)),
    ]
    return dashboard("gpufarm: farm overview", variables, widgets)


def _lifecycle(where: str, by: str) -> list[Widget | Chart]:
    """Waiting requests and their age, idle warnings and reclaims by reason (gpufarm.core.leases.metrics): the
    sync's gauges as last seen, the counts summed over the time frame."""
    counted = f"{by}.as_count()"
    return [
        Chart(
            "table",
            "Waiting requests per environment and model: for an operator, for hosts, the longest wait",
            [
                Series(
                    "approval", "sum:gpufarm.requests.waiting", "awaiting an operator", filter="waiting_for:approval"
                ),
                Series("hosts", "sum:gpufarm.requests.waiting", "waiting for hosts", filter="waiting_for:hosts"),
                Series("oldest", "max:gpufarm.requests.oldest_wait", "longest wait"),
            ],
            where=where,
            by=by,
        ),
        Chart(
            "timeseries",
            "Waiting requests per environment",
            [Series("a", "sum:gpufarm.requests.waiting", "waiting")],
            where=where,
            by=" by {environment}",
        ),
        Chart(
            "table",
            "Idle leases per environment and model: warned now",
            [Series("now", "sum:gpufarm.leases.idle_warned", "leases warned as idle now")],
            where=where,
            by=by,
        ),
        Chart(
            "table",
            "Idle warnings per environment and model over the time frame",
            [Series("warnings", "sum:gpufarm.leases.idle_warnings", "idle warnings", aggregator="sum")],
            where=where,
            by=counted,
        ),
        Chart(
            "table",
            "Reclaims by reason per environment and model over the time frame",
            [
                Series("reclaims", "sum:gpufarm.leases.reclaims", "reclaims", aggregator="sum"),
                Series("gpus", "sum:gpufarm.leases.reclaimed_gpus", "GPUs and slices freed", aggregator="sum"),
            ],
            where=where,
            by=" by {reclaim_reason,environment,gpu_model}.as_count()",
        ),
        Chart(
            "timeseries",
            "Reclaims by reason",
            [Series("a", "sum:gpufarm.leases.reclaims", "reclaims")],
            where=where,
            by=" by {reclaim_reason}.as_count()",
            display="bars",
        ),
    ]
