"""The node → device → process dashboard: per host its GPUs, MIG slices, containers and processes with their
leases, and its health (XID, ECC, temperature, throttling, lost devices, row remaps).
"""

from __future__ import annotations

from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.setup.dashboards_farm.common import ENV, HOST, LEASE, dashboard, env_values
from gpufarm.setup.dashboards_widgets import Chart, Series, group, note, scope, template_variable


def nodes(farm: FarmConfig) -> dict[str, Any]:
    """Per host its devices, MIG slices, containers and processes with their leases, and its health."""
    h = scope(ENV, HOST)
    d = scope(ENV, HOST, LEASE)
    per_device = " by {host,gpu_uuid}"
    health = [
        Chart(
            "toplist",
            "XID errors per host and code",
            [Series("a", "sum:gpufarm.gpu.xid_errors", "XID events", aggregator="sum")],
            where=h,
            by=" by {host,xid}.as_count()",
        ),
        Chart(
            "toplist",
            "Uncorrected ECC errors per device",
            [Series("a", "max:gpufarm.gpu.ecc.uncorrected", "ECC errors", aggregator="max")],
            where=h,
            by=per_device,
        ),
        Chart(
            "timeseries",
            "Temperature per device",
            [Series("a", "max:gpufarm.gpu.temperature", "°C")],
            where=h,
            by=per_device,
        ),
        Chart(
            "timeseries",
            "Clock throttling per host and reason",
            [Series("a", "max:gpufarm.gpu.clock_event_reason", "throttled", filter="!reason:gpu_idle")],
            where=h,
            by=" by {host,reason}",
            display="bars",
        ),
        Chart(
            "table",
            "Lost devices and pending row remaps",
            [
                Series("lost", "max:gpufarm.gpu.unhealthy", "lost", aggregator="max"),
                Series("pending", "max:gpufarm.gpu.remapped_rows.pending", "remap pending", aggregator="max"),
                Series("failed", "max:gpufarm.gpu.remapped_rows.failure", "remap failed", aggregator="max"),
            ],
            where=h,
            by=per_device,
        ),
    ]
    variables = [
        template_variable("environment", "environment", env_values(farm)),
        template_variable("host", "host"),
        template_variable("ir", "gpu_ir"),
    ]
    return dashboard(
        "gpufarm: node, device, process",
        variables,
        [
            note(
                "**Node → device → process.** Pick an environment, host or lease (`ir-<n>`) above. Every row names "
                "the lease (`gpu_ir`) the node agent attributed the device, container or process to; `none` is "
                "usage nobody holds."
            ),
            Chart(
                "table",
                "Hosts",
                [
                    Series("gpus", "max:gpufarm.node.gpus", "GPUs"),
                    Series("cycle", "avg:gpufarm.node.cycle_time", "agent cycle (s)", aggregator="avg"),
                ],
                where=h,
                by=" by {host}",
            ),
            Chart(
                "table",
                "Devices and their leases",
                [
                    Series("used", "max:gpufarm.gpu.memory.used", "memory used"),
                    Series("total", "max:gpufarm.gpu.memory.total", "memory total"),
                    Series("procs", "max:gpufarm.gpu.processes", "processes"),
                ],
                where=d,
                by=" by {host,gpu_uuid,gpu_model,gpu_slicing_mode,gpu_ir}",
            ),
            Chart(
                "timeseries",
                "Utilisation per device",
                [Series("a", "avg:gpufarm.gpu.utilization", "utilisation %")],
                where=d,
                by=per_device,
            ),
            Chart(
                "table",
                "MIG slices",
                [
                    Series("sm", "avg:gpufarm.gpu.activity.sm", "SM activity %", aggregator="avg"),
                    Series("used", "max:gpufarm.gpu.memory.used", "memory used"),
                ],
                where=scope(d, "gpu_slicing_mode:mig"),
                by=" by {host,gpu_parent_uuid,gpu_uuid,mig_profile,gpu_ir}",
            ),
            Chart(
                "table",
                "Containers",
                [
                    Series("procs", "max:gpufarm.container.processes", "processes"),
                    Series("mem", "max:gpufarm.container.memory.used", "GPU memory"),
                ],
                where=d,
                by=" by {host,gpu_uuid,kube_namespace,pod_name,gpu_ir}",
            ),
            Chart(
                "table",
                "Processes (agents started with --per-process)",
                [
                    Series("mem", "max:gpufarm.process.memory.used", "GPU memory"),
                    Series("sm", "avg:gpufarm.process.sm_utilization", "SM %", aggregator="avg"),
                ],
                where=d,
                by=" by {host,gpu_uuid,pid,gpu_ir}",
            ),
            group("Health: XID, ECC, temperature, throttling", health),
        ],
    )
