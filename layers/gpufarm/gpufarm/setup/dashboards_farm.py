"""gpufarm's five dashboards, built from the farm configuration (pure: Datadog v1 dashboard JSON, no calls).

- **Farm overview**: per environment and GPU model, total / allocated / free GPUs, busy / idle / lost devices, down
  and agentless GPUs; cloud quota used vs limit and held by leases; inventory source errors;
- **Project** (template variables team, project, ir): GPUs held, busy and idle, utilisation, GPU-hours per lease,
  budget burn;
- **Node → device → process**: per host its GPUs, MIG slices, containers and processes with their leases, health;
- **GPU slicing**: per shared host and MIG slice, the lease and container holding it and how busy it is;
- **Quota ledger**: entitled / allocated / used / idle / unmeasured per team, project, environment and model;
  budget burn; inventory; unattributed usage per host and team.

Widgets query only what is emitted: the node agent's metrics (spec/metrics.yaml; `host`, `team`, `project`,
`environment` and `gpufarm` are host tags Datadog stamps on each point) and the gauges the scheduled sync publishes
(gpufarm.core.reconcile.publish_gauges: `gpufarm.quota.*` per team, environment and model, `gpufarm.inventory.*`
per environment and model, and the ledger's gauges gpufarm.core.sources.LEDGER_GAUGES declares: down and agentless
GPUs, cloud quotas, source errors, the measured ledger, budgets). tests/unit/test_dashboards.py holds every query
to those declarations.

The lease template variable is the agent's per-device `gpu_ir` tag (exact on shared hosts, where a host carries
several `ir:` tags); model values are lower-case, as Datadog stores tags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufarm.core.farm import FarmConfig, PoolKind
from gpufarm.core.inventory import normalize_tag
from gpufarm.setup.dashboards_widgets import (
    Formula,
    Query,
    Widget,
    group,
    iframe,
    note,
    query_value,
    scope,
    table,
    template_variable,
    timeseries,
    toplist,
)

# Template variables, as they appear in queries.
ENV, MODEL, TEAM, PROJECT, LEASE, HOST = "$environment", "$gpu_model", "$team", "$project", "$ir", "$host"
LEASED = "!gpu_ir:none"  # devices a lease holds (the agent tags the rest gpu_ir:none)


@dataclass(frozen=True)
class DashboardSpec:
    """One dashboard apply wants: its stable key (the ownership marker names it) and its JSON, marker included."""

    key: str
    body: dict[str, Any]


def _env_values(farm: FarmConfig) -> list[str]:
    return sorted(farm.environments)


def _model_values(farm: FarmConfig) -> list[str]:
    return sorted({_tag_value(m) for env in farm.environments.values() for m in env.gpu_models})


def _tag_value(value: str) -> str:
    return normalize_tag(f"k:{value}").split(":", 1)[1]


def _shared(farm: FarmConfig) -> list[str]:
    return sorted(name for name, env in farm.environments.items() if env.kind is PoolKind.SHARED)


def _in(key: str, values: Sequence[str]) -> str:
    if not values:
        return ""
    return f"{key}:{values[0]}" if len(values) == 1 else f"{key} IN ({', '.join(values)})"


# -- Farm overview ----------------------------------------------------------------------------------------------


def farm_overview(farm: FarmConfig) -> dict[str, Any]:
    """Capacity and state per environment and model, one group per environment of the farm."""
    by = " by {environment,gpu_model}"
    s = scope(ENV, MODEL)
    capacity = table(
        "Capacity per environment and model",
        [
            Query("total", f"sum:gpufarm.inventory.gpus.total{{{s}}}{by}"),
            Query("free", f"sum:gpufarm.inventory.gpus.free{{{s}}}{by}"),
            Query("allocated", f"sum:gpufarm.quota.allocated{{{s}}}{by}"),
        ],
        [Formula("total", "total GPUs"), Formula("allocated", "allocated"), Formula("free", "free")],
    )
    states = table(
        "Devices busy, idle and down per environment and model",
        [
            Query("busy", f"sum:gpufarm.gpu.idle_state{{{scope(s, 'state:busy')}}}{by}"),
            Query("idle", f"sum:gpufarm.gpu.idle_state{{{scope(s, 'state:idle')}}}{by}"),
            Query("held", f"sum:gpufarm.gpu.idle_state{{{scope(s, 'state:idle_held')}}}{by}"),
            Query("down", f"sum:gpufarm.gpu.unhealthy{{{s}}}{by}"),
        ],
        [
            Formula("busy", "busy"),
            Formula("idle", "idle (no process)"),
            Formula("held", "idle, memory held"),
            Formula("down", "down (lost)"),
        ],
    )
    unseen = table(
        "Down and agentless GPUs per environment and model",
        [
            Query("down", f"sum:gpufarm.inventory.gpus.down{{{s}}}{by}"),
            Query("no_agent", f"sum:gpufarm.inventory.gpus.no_agent{{{s}}}{by}"),
        ],
        [Formula("down", "down (node silent)"), Formula("no_agent", "no agent (seen by a cloud or static source)")],
    )
    quota_by = " by {source,region,family}"
    cloud = table(
        "Cloud quota per region and GPU family: used vs limit, held by gpufarm",
        [
            Query("limit", f"sum:gpufarm.cloud.quota.limit{{*}}{quota_by}"),
            Query("used", f"sum:gpufarm.cloud.quota.used{{*}}{quota_by}"),
            Query("held", f"sum:gpufarm.cloud.quota.held{{*}}{quota_by}"),
        ],
        [
            Formula("limit", "limit (vCPUs / cores)"),
            Formula("used", "used"),
            Formula("held", "held by leases"),
            Formula("100 * used / limit", "% of limit used"),
        ],
    )
    widgets: list[Widget] = [
        note(
            "**gpufarm farm overview.** Capacity comes from the scheduled sync (`gpufarm.inventory.*`, "
            "`gpufarm.quota.allocated`, the cloud sources' `gpufarm.cloud.*`); device states from the node agents "
            "(`gpufarm.gpu.idle_state`: busy, idle, idle with memory held; `gpufarm.gpu.unhealthy`). A MIG slice "
            "counts as one device."
        ),
        capacity,
        states,
        unseen,
        cloud,
        toplist(
            "Inventory source errors in the last sync (skipped and reported)",
            Query("a", "sum:gpufarm.inventory.source.errors{*} by {source}"),
            "errors",
        ),
        timeseries(
            "Devices by state",
            [Query("a", f"sum:gpufarm.gpu.idle_state{{{s}}} by {{state}}")],
            [Formula("a", "devices")],
            display="area",
        ),
    ]
    for name in _env_values(farm):
        env = farm.environments[name]
        e = f"environment:{name}"
        models = ", ".join(env.gpu_models)
        widgets.append(
            group(
                f"{name} ({env.kind.value}: {models})",
                [
                    query_value("Total GPUs", [Query("a", f"sum:gpufarm.inventory.gpus.total{{{e}}}")]),
                    query_value("Allocated GPUs", [Query("a", f"sum:gpufarm.quota.allocated{{{e}}}")]),
                    query_value("Free GPUs", [Query("a", f"sum:gpufarm.inventory.gpus.free{{{e}}}")]),
                    query_value(
                        "Busy devices", [Query("a", f"sum:gpufarm.gpu.idle_state{{{scope(e, 'state:busy')}}}")]
                    ),
                    timeseries(
                        "Free vs total GPUs",
                        [
                            Query("total", f"sum:gpufarm.inventory.gpus.total{{{e}}} by {{gpu_model}}"),
                            Query("free", f"sum:gpufarm.inventory.gpus.free{{{e}}} by {{gpu_model}}"),
                        ],
                        [Formula("total", "total"), Formula("free", "free")],
                    ),
                ],
            )
        )
    return {
        "title": "gpufarm: farm overview",
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": [
            template_variable("environment", "environment", _env_values(farm)),
            template_variable("gpu_model", "gpu_model", _model_values(farm)),
        ],
        "widgets": widgets,
    }


# -- Project ----------------------------------------------------------------------------------------------------


def project(farm: FarmConfig) -> dict[str, Any]:
    """One team's, project's or lease's GPUs: held, busy, idle, utilisation and GPU-hours."""
    s = scope(TEAM, PROJECT, LEASE, LEASED)
    hourly = ".rollup(avg, 3600)"
    return {
        "title": "gpufarm: project",
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": [
            template_variable("team", "team", sorted(farm.teams)),
            template_variable("project", "project"),
            template_variable("ir", "gpu_ir"),
        ],
        "widgets": [
            note(
                "**A project's GPUs.** Pick a team, project or lease (`ir-<n>`) above. Held, busy and idle devices "
                "are what the node agents attribute to the lease (`gpufarm.ir.*`); GPU-hours are the sum of hourly "
                "averages over whole hours of the time frame."
            ),
            query_value("GPUs held", [Query("a", f"sum:gpufarm.ir.gpus{{{s}}}")]),
            query_value("Busy", [Query("a", f"sum:gpufarm.ir.gpus_busy{{{s}}}")]),
            query_value(
                "Idle",
                [Query("a", f"sum:gpufarm.ir.gpus_idle{{{s}}}"), Query("b", f"sum:gpufarm.ir.gpus_idle_held{{{s}}}")],
                "a + b",
            ),
            query_value("Utilisation %", [Query("a", f"avg:gpufarm.ir.utilization{{{s}}}", "avg")], precision=1),
            timeseries(
                "GPUs held, busy and idle",
                [
                    Query("held", f"sum:gpufarm.ir.gpus{{{s}}}"),
                    Query("busy", f"sum:gpufarm.ir.gpus_busy{{{s}}}"),
                    Query("idle", f"sum:gpufarm.ir.gpus_idle{{{s}}}"),
                    Query("held_idle", f"sum:gpufarm.ir.gpus_idle_held{{{s}}}"),
                ],
                [
                    Formula("held", "held"),
                    Formula("busy", "busy"),
                    Formula("idle", "idle"),
                    Formula("held_idle", "idle, memory held"),
                ],
            ),
            timeseries(
                "Utilisation per lease",
                [Query("a", f"avg:gpufarm.ir.utilization{{{s}}} by {{gpu_ir}}")],
                [Formula("a", "utilisation %")],
            ),
            table(
                "GPU-hours per lease (hourly averages, summed)",
                [
                    Query("held", f"sum:gpufarm.ir.gpus{{{s}}} by {{gpu_ir}}{hourly}", "sum"),
                    Query("busy", f"sum:gpufarm.ir.gpus_busy{{{s}}} by {{gpu_ir}}{hourly}", "sum"),
                    Query("idle", f"sum:gpufarm.ir.gpus_idle{{{s}}} by {{gpu_ir}}{hourly}", "sum"),
                    Query("held_idle", f"sum:gpufarm.ir.gpus_idle_held{{{s}}} by {{gpu_ir}}{hourly}", "sum"),
                ],
                [
                    Formula("held", "held GPU-hours"),
                    Formula("busy", "busy GPU-hours"),
                    Formula("idle + held_idle", "idle GPU-hours"),
                ],
            ),
            _budget_table(scope(TEAM, PROJECT)),
            toplist(
                "GPU memory held per lease",
                Query("a", f"sum:gpufarm.ir.memory.used{{{s}}} by {{gpu_ir}}"),
                "memory used",
            ),
            timeseries(
                "Processes per lease",
                [Query("a", f"sum:gpufarm.ir.processes{{{s}}} by {{gpu_ir}}")],
                [Formula("a", "processes")],
                display="bars",
            ),
            *_profile_runs(scope(TEAM, PROJECT)),
        ],
    }


def latest_runs(links: Mapping[str, str]) -> Widget:
    """One iframe per team showing its newest profiler run's page (signed links, gpufarm.profiling.links)."""
    return group("Newest profiler run per team", [iframe(links[team]) for team in sorted(links)])


def _profile_runs(where: str) -> list[Widget]:
    """Profiler runs uploaded to the leases (gpufarm profile upload; spec/metrics.yaml `profile_metrics`)."""
    by = " by {ir,run}"
    return [
        note(
            "**Profiler runs.** Each `gpufarm profile upload` publishes its trace's figures tagged with the lease "
            "and the run; its summary page (step times, busy streams, top kernels and operators) is linked from "
            "the lease's history: `/gpu status IR-n`."
        ),
        table(
            "Profiler runs: steps, step time, throughput, memory peak",
            [
                Query("steps", f"max:gpufarm.profile.steps{{{where}}}{by}", "last"),
                Query("step", f"avg:gpufarm.profile.step_time.mean{{{where}}}{by}", "last"),
                Query("p50", f"avg:gpufarm.profile.step_time.p50{{{where}}}{by}", "last"),
                Query("tput", f"avg:gpufarm.profile.throughput{{{where}}}{by}", "last"),
                Query("peak", f"max:gpufarm.profile.memory.peak{{{where}}}{by}", "last"),
            ],
            [
                Formula("steps", "steps"),
                Formula("step", "mean step ms"),
                Formula("p50", "p50 step ms"),
                Formula("tput", "samples/s"),
                Formula("peak", "memory peak bytes"),
            ],
        ),
    ]


# -- Node -> device -> process ----------------------------------------------------------------------------------


def nodes(farm: FarmConfig) -> dict[str, Any]:
    """Per host its devices, MIG slices, containers and processes with their leases, and its health."""
    h = scope(ENV, HOST)
    d = scope(ENV, HOST, LEASE)
    health = [
        toplist(
            "XID errors per host and code",
            Query("a", f"sum:gpufarm.gpu.xid_errors{{{h}}} by {{host,xid}}.as_count()", "sum"),
            "XID events",
        ),
        toplist(
            "Uncorrected ECC errors per device",
            Query("a", f"max:gpufarm.gpu.ecc.uncorrected{{{h}}} by {{host,gpu_uuid}}", "max"),
            "ECC errors",
        ),
        timeseries(
            "Temperature per device",
            [Query("a", f"max:gpufarm.gpu.temperature{{{h}}} by {{host,gpu_uuid}}")],
            [Formula("a", "°C")],
        ),
        timeseries(
            "Clock throttling per host and reason",
            [Query("a", f"max:gpufarm.gpu.clock_event_reason{{{scope(h, '!reason:gpu_idle')}}} by {{host,reason}}")],
            [Formula("a", "throttled")],
            display="bars",
        ),
        table(
            "Lost devices and pending row remaps",
            [
                Query("lost", f"max:gpufarm.gpu.unhealthy{{{h}}} by {{host,gpu_uuid}}", "max"),
                Query("pending", f"max:gpufarm.gpu.remapped_rows.pending{{{h}}} by {{host,gpu_uuid}}", "max"),
                Query("failed", f"max:gpufarm.gpu.remapped_rows.failure{{{h}}} by {{host,gpu_uuid}}", "max"),
            ],
            [Formula("lost", "lost"), Formula("pending", "remap pending"), Formula("failed", "remap failed")],
        ),
    ]
    return {
        "title": "gpufarm: node, device, process",
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": [
            template_variable("environment", "environment", _env_values(farm)),
            template_variable("host", "host"),
            template_variable("ir", "gpu_ir"),
        ],
        "widgets": [
            note(
                "**Node → device → process.** Pick an environment, host or lease (`ir-<n>`) above. Every row names "
                "the lease (`gpu_ir`) the node agent attributed the device, container or process to; `none` is "
                "usage nobody holds."
            ),
            table(
                "Hosts",
                [
                    Query("gpus", f"max:gpufarm.node.gpus{{{h}}} by {{host}}"),
                    Query("cycle", f"avg:gpufarm.node.cycle_time{{{h}}} by {{host}}", "avg"),
                ],
                [Formula("gpus", "GPUs"), Formula("cycle", "agent cycle (s)")],
            ),
            table(
                "Devices and their leases",
                [
                    Query(
                        "used",
                        f"max:gpufarm.gpu.memory.used{{{d}}} by {{host,gpu_uuid,gpu_model,gpu_slicing_mode,gpu_ir}}",
                    ),
                    Query(
                        "total",
                        f"max:gpufarm.gpu.memory.total{{{d}}} by {{host,gpu_uuid,gpu_model,gpu_slicing_mode,gpu_ir}}",
                    ),
                    Query(
                        "procs",
                        f"max:gpufarm.gpu.processes{{{d}}} by {{host,gpu_uuid,gpu_model,gpu_slicing_mode,gpu_ir}}",
                    ),
                ],
                [Formula("used", "memory used"), Formula("total", "memory total"), Formula("procs", "processes")],
            ),
            timeseries(
                "Utilisation per device",
                [Query("a", f"avg:gpufarm.gpu.utilization{{{d}}} by {{host,gpu_uuid}}")],
                [Formula("a", "utilisation %")],
            ),
            table(
                "MIG slices",
                [
                    Query(
                        "sm",
                        f"avg:gpufarm.gpu.activity.sm{{{scope(d, 'gpu_slicing_mode:mig')}}} "
                        "by {host,gpu_parent_uuid,gpu_uuid,mig_profile,gpu_ir}",
                        "avg",
                    ),
                    Query(
                        "used",
                        f"max:gpufarm.gpu.memory.used{{{scope(d, 'gpu_slicing_mode:mig')}}} "
                        "by {host,gpu_parent_uuid,gpu_uuid,mig_profile,gpu_ir}",
                    ),
                ],
                [Formula("sm", "SM activity %"), Formula("used", "memory used")],
            ),
            table(
                "Containers",
                [
                    Query(
                        "procs",
                        f"max:gpufarm.container.processes{{{d}}} by {{host,gpu_uuid,kube_namespace,pod_name,gpu_ir}}",
                    ),
                    Query(
                        "mem",
                        f"max:gpufarm.container.memory.used{{{d}}} by {{host,gpu_uuid,kube_namespace,pod_name,gpu_ir}}",
                    ),
                ],
                [Formula("procs", "processes"), Formula("mem", "GPU memory")],
            ),
            table(
                "Processes (agents started with --per-process)",
                [
                    Query("mem", f"max:gpufarm.process.memory.used{{{d}}} by {{host,gpu_uuid,pid,gpu_ir}}"),
                    Query("sm", f"avg:gpufarm.process.sm_utilization{{{d}}} by {{host,gpu_uuid,pid,gpu_ir}}", "avg"),
                ],
                [Formula("mem", "GPU memory"), Formula("sm", "SM %")],
            ),
            group("Health: XID, ECC, temperature, throttling", health),
        ],
    }


# -- GPU slicing ------------------------------------------------------------------------------------------------


def slicing(farm: FarmConfig) -> dict[str, Any]:
    """Per shared host and MIG slice: which lease and container holds it and how busy it is."""
    shared = _shared(farm)
    pools = _in("environment", shared)
    mig = scope(pools, HOST, LEASE, "gpu_slicing_mode:mig")
    whole = scope(pools, HOST, LEASE, "gpu_slicing_mode:none")
    anywhere = scope(pools, HOST, LEASE)
    slice_by = " by {host,gpu_uuid,mig_profile,gpu_ir}"
    container_by = " by {host,gpu_uuid,pod_name,container_id,gpu_ir}"
    names = ", ".join(f"`{n}`" for n in shared) or "none (every MIG slice of the farm is shown)"
    return {
        "title": "gpufarm: GPU slicing",
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": [template_variable("host", "host"), template_variable("ir", "gpu_ir")],
        "widgets": [
            note(
                f"**GPU slicing.** Shared pools of the farm: {names}. Each MIG slice or shared GPU is held by one "
                "lease (`gpu_ir`); its containers are the pods running on it."
            ),
            table(
                "MIG slices: lease, activity, memory, processes",
                [
                    Query("sm", f"avg:gpufarm.gpu.activity.sm{{{mig}}}{slice_by}", "avg"),
                    Query("used", f"max:gpufarm.gpu.memory.used{{{mig}}}{slice_by}"),
                    Query("procs", f"max:gpufarm.gpu.processes{{{mig}}}{slice_by}"),
                ],
                [Formula("sm", "SM activity %"), Formula("used", "memory used"), Formula("procs", "processes")],
            ),
            timeseries(
                "SM activity per slice",
                [Query("a", f"avg:gpufarm.gpu.activity.sm{{{mig}}} by {{host,gpu_uuid,gpu_ir}}")],
                [Formula("a", "SM activity %")],
            ),
            table(
                "Shared whole GPUs: lease and utilisation",
                [
                    Query("util", f"avg:gpufarm.gpu.utilization{{{whole}}} by {{host,gpu_uuid,gpu_ir}}", "avg"),
                    Query("procs", f"max:gpufarm.gpu.processes{{{whole}}} by {{host,gpu_uuid,gpu_ir}}"),
                ],
                [Formula("util", "utilisation %"), Formula("procs", "processes")],
            ),
            table(
                "Containers on shared devices",
                [
                    Query("procs", f"max:gpufarm.container.processes{{{anywhere}}}{container_by}"),
                    Query("mem", f"max:gpufarm.container.memory.used{{{anywhere}}}{container_by}"),
                ],
                [Formula("procs", "processes"), Formula("mem", "GPU memory")],
            ),
            toplist(
                "Devices per lease on shared pools",
                Query("a", f"sum:gpufarm.ir.gpus{{{scope(pools, HOST, LEASE, LEASED)}}} by {{gpu_ir}}"),
                "devices",
            ),
        ],
    }


# -- Quota ledger -----------------------------------------------------------------------------------------------


def quota_ledger(farm: FarmConfig) -> dict[str, Any]:
    """Entitled, allocated and used per team, environment and model; inventory; unattributed usage."""
    q = scope(TEAM, ENV, MODEL)
    by = " by {team,environment,gpu_model}"
    ledger_by = " by {team,project,environment,gpu_model}"
    return {
        "title": "gpufarm: quota ledger",
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": [
            template_variable("team", "team", sorted(farm.teams)),
            template_variable("environment", "environment", _env_values(farm)),
            template_variable("gpu_model", "gpu_model", _model_values(farm)),
        ],
        "widgets": [
            note(
                "**Quota ledger.** Entitled is the farm configuration's quota, allocated what the team's leases "
                "hold, used / idle / unmeasured what the agents' metrics say of those GPUs (all from the scheduled "
                "sync; unmeasured GPUs are never counted idle); budgets are GPU-hours per period. Unattributed "
                "usage is busy GPUs no lease claims."
            ),
            table(
                "Entitled and allocated per team, environment and model",
                [
                    Query("entitled", f"sum:gpufarm.quota.entitled{{{q}}}{by}"),
                    Query("allocated", f"sum:gpufarm.quota.allocated{{{q}}}{by}"),
                ],
                [
                    Formula("entitled", "entitled GPUs"),
                    Formula("allocated", "allocated GPUs"),
                    Formula("100 * allocated / entitled", "% of entitlement"),
                ],
            ),
            table(
                "Held GPUs per team, project, environment and model: used, idle, unmeasured (the sync's ledger)",
                [
                    Query("held", f"sum:gpufarm.ledger.gpus.allocated{{{q}}}{ledger_by}"),
                    Query("used", f"sum:gpufarm.ledger.gpus.used{{{q}}}{ledger_by}"),
                    Query("idle", f"sum:gpufarm.ledger.gpus.idle{{{q}}}{ledger_by}"),
                    Query("unmeasured", f"sum:gpufarm.ledger.gpus.unmeasured{{{q}}}{ledger_by}"),
                ],
                [
                    Formula("held", "allocated GPUs"),
                    Formula("used", "used (busy)"),
                    Formula("idle", "idle"),
                    Formula("unmeasured", "unmeasured (no metrics)"),
                ],
            ),
            table(
                "Used now: busy devices per team, environment and model (node agents)",
                [Query("busy", f"sum:gpufarm.gpu.idle_state{{{scope(q, 'state:busy', LEASED)}}}{by}")],
                [Formula("busy", "busy devices")],
            ),
            _budget_table(scope(TEAM)),
            timeseries(
                "Allocated vs entitled per team",
                [
                    Query("entitled", f"sum:gpufarm.quota.entitled{{{q}}} by {{team}}"),
                    Query("allocated", f"sum:gpufarm.quota.allocated{{{q}}} by {{team}}"),
                ],
                [Formula("entitled", "entitled"), Formula("allocated", "allocated")],
            ),
            table(
                "Inventory per environment and model",
                [
                    Query(
                        "total", f"sum:gpufarm.inventory.gpus.total{{{scope(ENV, MODEL)}}} by {{environment,gpu_model}}"
                    ),
                    Query(
                        "free", f"sum:gpufarm.inventory.gpus.free{{{scope(ENV, MODEL)}}} by {{environment,gpu_model}}"
                    ),
                ],
                [Formula("total", "total GPUs"), Formula("free", "free GPUs")],
            ),
            toplist(
                "Unattributed usage: busy GPUs no lease claims, per host and team (the sync's ledger)",
                Query("a", f"sum:gpufarm.ledger.gpus.unattributed{{{scope(ENV)}}} by {{host,team}}"),
                "busy GPUs",
            ),
            toplist(
                "Unattributed usage now: busy devices no lease holds, per host (node agents)",
                Query("a", f"sum:gpufarm.gpu.idle_state{{{scope(ENV, 'state:busy', 'gpu_ir:none')}}} by {{host}}"),
                "busy devices",
            ),
        ],
    }


def _budget_table(where: str) -> Widget:
    """GPU-hour budgets of the current period: budget, burned, remaining (gpufarm.budget.*; project `all` is a
    team's own budget)."""
    by = " by {team,project,period}"
    return table(
        "GPU-hour budgets: burned vs budget this period",
        [
            Query("budget", f"sum:gpufarm.budget.gpu_hours{{{where}}}{by}"),
            Query("burned", f"sum:gpufarm.budget.burned{{{where}}}{by}"),
            Query("remaining", f"sum:gpufarm.budget.remaining{{{where}}}{by}"),
        ],
        [
            Formula("budget", "budget (GPU-hours)"),
            Formula("burned", "burned"),
            Formula("remaining", "remaining"),
            Formula("100 * burned / budget", "% burned"),
        ],
    )


BUILDERS = {
    "farm-overview": farm_overview,
    "project": project,
    "node": nodes,
    "slicing": slicing,
    "quota-ledger": quota_ledger,
}
