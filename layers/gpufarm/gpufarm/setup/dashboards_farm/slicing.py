"""The GPU slicing dashboard: per shared host and MIG slice, the lease and container holding it and how busy it is."""

from __future__ import annotations

from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.setup.dashboards_farm.common import HOST, LEASE, LEASED, PER_LEASE, dashboard, one_of, shared_pools
from gpufarm.setup.dashboards_widgets import Chart, Series, note, scope, template_variable


def slicing(farm: FarmConfig) -> dict[str, Any]:
    """Per shared host and MIG slice: which lease and container holds it and how busy it is."""
    shared = shared_pools(farm)
    pools = one_of("environment", shared)
    mig = scope(pools, HOST, LEASE, "gpu_slicing_mode:mig")
    whole = scope(pools, HOST, LEASE, "gpu_slicing_mode:none")
    names = ", ".join(f"`{n}`" for n in shared) or "none (every MIG slice of the farm is shown)"
    return dashboard(
        "gpufarm: GPU slicing",
        [template_variable("host", "host"), template_variable("ir", "gpu_ir")],
        [
            note(
                f"**GPU slicing.** Shared pools of the farm: {names}. Each MIG slice or shared GPU is held by one "
                "lease (`gpu_ir`); its containers are the pods running on it."
            ),
            Chart(
                "table",
                "MIG slices: lease, activity, memory, processes",
                [
                    Series("sm", "avg:gpufarm.gpu.activity.sm", "SM activity %", aggregator="avg"),
                    Series("used", "max:gpufarm.gpu.memory.used", "memory used"),
                    Series("procs", "max:gpufarm.gpu.processes", "processes"),
                ],
                where=mig,
                by=" by {host,gpu_uuid,mig_profile,gpu_ir}",
            ),
            Chart(
                "timeseries",
                "SM activity per slice",
                [Series("a", "avg:gpufarm.gpu.activity.sm", "SM activity %")],
                where=mig,
                by=" by {host,gpu_uuid,gpu_ir}",
            ),
            Chart(
                "table",
                "Shared whole GPUs: lease and utilisation",
                [
                    Series("util", "avg:gpufarm.gpu.utilization", "utilisation %", aggregator="avg"),
                    Series("procs", "max:gpufarm.gpu.processes", "processes"),
                ],
                where=whole,
                by=" by {host,gpu_uuid,gpu_ir}",
            ),
            Chart(
                "table",
                "Containers on shared devices",
                [
                    Series("procs", "max:gpufarm.container.processes", "processes"),
                    Series("mem", "max:gpufarm.container.memory.used", "GPU memory"),
                ],
                where=scope(pools, HOST, LEASE),
                by=" by {host,gpu_uuid,pod_name,container_id,gpu_ir}",
            ),
            Chart(
                "toplist",
                "MIG slices and shared GPUs per lease",
                [Series("a", "sum:gpufarm.ir.gpus", "slices and GPUs")],
                where=scope(pools, HOST, LEASE, LEASED),
                by=PER_LEASE,
            ),
        ],
    )
