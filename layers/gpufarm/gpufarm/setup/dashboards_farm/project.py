"""The project dashboard (template variables team, project, ir): GPUs held, busy and idle, utilisation, GPU-hours
per lease, idle warnings and reclaims, budget burn, profiler runs; and the group of each team's newest profiler run
page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.setup.dashboards_farm.common import LEASE, LEASED, PER_LEASE, PROJECT, TEAM, budget_table, dashboard
from gpufarm.setup.dashboards_widgets import (
    Chart,
    Formula,
    Series,
    Widget,
    group,
    iframe,
    note,
    scope,
    template_variable,
)


def project(farm: FarmConfig) -> dict[str, Any]:
    """One team's, project's or lease's GPUs: held, busy, idle, utilisation and GPU-hours."""
    s = scope(TEAM, PROJECT, LEASE, LEASED)
    variables = [
        template_variable("team", "team", sorted(farm.teams)),
        template_variable("project", "project"),
        template_variable("ir", "gpu_ir"),
    ]
    return dashboard(
        "gpufarm: project",
        variables,
        [
            note(
                "**A project's GPUs.** Pick a team, project or lease (`ir-<n>`) above. Held, busy and idle devices "
                "are what the node agents attribute to the lease (`gpufarm.ir.*`): whole GPUs and MIG slices, a "
                "slice counting one (the GPU slicing dashboard names each slice and its profile); GPU-hours are the "
                "sum of hourly averages over whole hours of the time frame."
            ),
            Chart("query_value", "GPUs and slices held", [Series("a", "sum:gpufarm.ir.gpus")], where=s),
            Chart("query_value", "Busy", [Series("a", "sum:gpufarm.ir.gpus_busy")], where=s),
            Chart(
                "query_value",
                "Idle",
                [Series("a", "sum:gpufarm.ir.gpus_idle"), Series("b", "sum:gpufarm.ir.gpus_idle_held")],
                where=s,
                formulas=[Formula("a + b", "idle")],
            ),
            Chart(
                "query_value",
                "Utilisation %",
                [Series("a", "avg:gpufarm.ir.utilization", aggregator="avg")],
                where=s,
                precision=1,
            ),
            Chart(
                "timeseries",
                "GPUs and MIG slices held, busy and idle",
                [
                    Series("held", "sum:gpufarm.ir.gpus", "held"),
                    Series("busy", "sum:gpufarm.ir.gpus_busy", "busy"),
                    Series("idle", "sum:gpufarm.ir.gpus_idle", "idle"),
                    Series("held_idle", "sum:gpufarm.ir.gpus_idle_held", "idle, memory held"),
                ],
                where=s,
            ),
            Chart(
                "timeseries",
                "Utilisation per lease",
                [Series("a", "avg:gpufarm.ir.utilization", "utilisation %")],
                where=s,
                by=PER_LEASE,
            ),
            Chart(
                "table",
                "GPU-hours per lease (hourly averages, summed)",
                [
                    Series("held", "sum:gpufarm.ir.gpus", "held GPU-hours", aggregator="sum"),
                    Series("busy", "sum:gpufarm.ir.gpus_busy", "busy GPU-hours", aggregator="sum"),
                    Series("idle", "sum:gpufarm.ir.gpus_idle", aggregator="sum"),
                    Series("held_idle", "sum:gpufarm.ir.gpus_idle_held", aggregator="sum"),
                ],
                where=s,
                by=f"{PER_LEASE}.rollup(avg, 3600)",
                formulas=[Formula("idle + held_idle", "idle GPU-hours")],
            ),
            *_idle_and_reclaims(scope(TEAM, PROJECT, LEASE)),
            budget_table(scope(TEAM, PROJECT)),
            Chart(
                "toplist",
                "GPU memory held per lease",
                [Series("a", "sum:gpufarm.ir.memory.used", "memory used")],
                where=s,
                by=PER_LEASE,
            ),
            Chart(
                "timeseries",
                "Processes per lease",
                [Series("a", "sum:gpufarm.ir.processes", "processes")],
                where=s,
                by=PER_LEASE,
                display="bars",
            ),
            *_profile_runs(scope(TEAM, PROJECT)),
        ],
    )


def _idle_and_reclaims(where: str) -> list[Widget | Chart]:
    """Idle warnings and reclaims of the chosen leases (gpufarm.core.leases.metrics; their `gpu_ir` tag is the
    lease variable's): counted over the time frame, and the leases warned now."""
    return [
        Chart(
            "query_value",
            "Leases warned as idle now",
            [Series("a", "sum:gpufarm.leases.idle_warned")],
            where=where,
        ),
        Chart(
            "query_value",
            "Idle warnings (time frame)",
            [Series("a", "sum:gpufarm.leases.idle_warnings", aggregator="sum")],
            where=where,
            by=".as_count()",
        ),
        Chart(
            "query_value",
            "Reclaims (time frame)",
            [Series("a", "sum:gpufarm.leases.reclaims", aggregator="sum")],
            where=where,
            by=".as_count()",
        ),
        Chart(
            "table",
            "Idle warnings and reclaims per lease over the time frame",
            [
                Series("warnings", "sum:gpufarm.leases.idle_warnings", "idle warnings", aggregator="sum"),
                Series("reclaims", "sum:gpufarm.leases.reclaims", "reclaims", aggregator="sum"),
                Series("gpus", "sum:gpufarm.leases.reclaimed_gpus", "GPUs reclaimed", aggregator="sum"),
            ],
            where=where,
            by=f"{PER_LEASE}.as_count()",
        ),
        Chart(
            "table",
            "Reclaims by reason over the time frame",
            [
                Series("reclaims", "sum:gpufarm.leases.reclaims", "reclaims", aggregator="sum"),
                Series("gpus", "sum:gpufarm.leases.reclaimed_gpus", "GPUs freed", aggregator="sum"),
            ],
            where=where,
            by=" by {reclaim_reason}.as_count()",
        ),
    ]


def latest_runs(links: Mapping[str, str]) -> Widget:
    """One iframe per team showing its newest profiler run's page (signed links, gpufarm.profiling.links)."""
    return group("Newest profiler run per team", [iframe(links[team]) for team in sorted(links)])


def _profile_runs(where: str) -> list[Widget | Chart]:
    """Profiler runs uploaded to the leases (gpufarm profile upload; spec/metrics.yaml `profile_metrics`)."""
    return [
        note(
            "**Profiler runs.** Each `gpufarm profile upload` publishes its trace's figures tagged with the lease "
            "and the run; its summary page (step times, busy streams, top kernels and operators) is linked from "
            "the lease's history: `/gpu status IR-n`."
        ),
        Chart(
            "table",
            "Profiler runs: steps, step time, throughput, memory peak",
            [
                Series("steps", "max:gpufarm.profile.steps", "steps"),
                Series("step", "avg:gpufarm.profile.step_time.mean", "mean step ms"),
                Series("p50", "avg:gpufarm.profile.step_time.p50", "p50 step ms"),
                Series("tput", "avg:gpufarm.profile.throughput", "samples/s"),
                Series("peak", "max:gpufarm.profile.memory.peak", "memory peak bytes"),
            ],
            where=where,
            by=" by {ir,run}",
        ),
    ]
