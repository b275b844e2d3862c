"""What gpufarm's dashboards share: the template variables as queries name them, a dashboard's frame, the farm's
values for the variables, and the GPU-hour budget table (the project and quota ledger dashboards both show it).

The lease template variable is the agent's per-device `gpu_ir` tag (exact on shared hosts, where a host carries
several `ir:` tags); model values are lower-case, as Datadog stores tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufarm.core.config.farm import FarmConfig, PoolKind
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.setup.dashboards_widgets import Chart, Formula, Series, Widget, built

# Template variables, as they appear in queries.
ENV, MODEL, TEAM, PROJECT, LEASE, HOST = "$environment", "$gpu_model", "$team", "$project", "$ir", "$host"
LEASED = "!gpu_ir:none"  # devices a lease holds (the agent tags the rest gpu_ir:none)
PER_LEASE = " by {gpu_ir}"


def dashboard(title: str, variables: list[dict[str, Any]], widgets: Sequence[Widget | Chart]) -> dict[str, Any]:
    """One dashboard's JSON: an ordered, auto-reflowed layout of the widgets (chart specs built here).

    The description, with the ownership marker, is gpufarm.setup.dashboards's to add.
    """
    return {
        "title": title,
        "layout_type": "ordered",
        "reflow_type": "auto",
        "template_variables": variables,
        "widgets": built(widgets),
    }


def env_values(farm: FarmConfig) -> list[str]:
    """The environment variable's values: the farm's environments."""
    return sorted(farm.environments)


def model_values(farm: FarmConfig) -> list[str]:
    """The gpu_model variable's values: every model of the farm, as Datadog stores the tag's value."""
    return sorted({_tag_value(m) for env in farm.environments.values() for m in env.gpu_models})


def _tag_value(value: str) -> str:
    return normalize_tag(f"k:{value}").split(":", 1)[1]


def shared_pools(farm: FarmConfig) -> list[str]:
    """The farm's shared environments (MIG slices and shared whole GPUs), sorted."""
    return sorted(name for name, env in farm.environments.items() if env.kind is PoolKind.SHARED)


def one_of(key: str, values: Sequence[str]) -> str:
    """A scope term matching any of `values` for a tag key (`key:v` for one, `key IN (...)`), empty for none."""
    if not values:
        return ""
    return f"{key}:{values[0]}" if len(values) == 1 else f"{key} IN ({', '.join(values)})"


def budget_table(where: str) -> Chart:
    """GPU-hour budgets of the current period: budget, burned, remaining (gpufarm.budget.*; project `all` is a
    team's own budget)."""
    return Chart(
        "table",
        "GPU-hour budgets: burned vs budget this period",
        [
            Series("budget", "sum:gpufarm.budget.gpu_hours", "budget (GPU-hours)"),
            Series("burned", "sum:gpufarm.budget.burned", "burned"),
            Series("remaining", "sum:gpufarm.budget.remaining", "remaining"),
        ],
        where=where,
        by=" by {team,project,period}",
        formulas=[Formula("100 * burned / budget", "% burned")],
    )
