"""gpufarm's five dashboards, built from the farm configuration (pure: Datadog v1 dashboard JSON, no calls).

One module a dashboard:
- **Farm overview** (`overview`): per environment and GPU model, total / allocated / free GPUs, busy / idle / lost
  devices, down and agentless GPUs, waiting requests and the longest wait, idle warnings and reclaims by reason;
  cloud quota used vs limit and held by leases; inventory source errors;
- **Project** (`project`; template variables team, project, ir): GPUs held, busy and idle, utilisation, GPU-hours
  per lease, idle warnings and reclaims, budget burn;
- **Node → device → process** (`nodes`): per host its GPUs, MIG slices, containers and processes with their
  leases, health;
- **GPU slicing** (`slicing`): per shared host and MIG slice, the lease and container holding it and how busy it is;
- **Quota ledger** (`ledger`): entitled / allocated / used / idle / unmeasured per team, project, environment and
  model; budget burn; inventory; unattributed usage per host and team.

`common` holds what they share. Each data widget is a `Chart` spec that gpufarm.setup.dashboards_widgets.chart
builds.

Widgets query only what is emitted: the node agent's metrics (spec/metrics.yaml; `host`, `team`, `project`,
`environment` and `gpufarm` are host tags Datadog stamps on each point) and the gauges the scheduled sync publishes
(gpufarm.core.sync.gauges.publish_gauges: `gpufarm.quota.*` per team, environment and model, `gpufarm.inventory.*`
per environment and model, and the ledger's gauges gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES declares: down and
agentless GPUs, cloud quotas, source errors, the measured ledger, budgets), and the lifecycle metrics (spec/metrics.yaml
`lifecycle_metrics`: waiting requests, idle warnings, reclaims; gpufarm.core.leases.metrics).
tests/unit/test_dashboards.py holds every query to those declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufarm.setup.dashboards_farm.ledger import quota_ledger
from gpufarm.setup.dashboards_farm.nodes import nodes
from gpufarm.setup.dashboards_farm.overview import farm_overview
from gpufarm.setup.dashboards_farm.project import latest_runs, project
from gpufarm.setup.dashboards_farm.slicing import slicing

__all__ = ["BUILDERS", "DashboardSpec", "latest_runs"]


@dataclass(frozen=True)
class DashboardSpec:
    """One dashboard apply wants: its stable key (the ownership marker names it) and its JSON, marker included."""

    key: str
    body: dict[str, Any]


BUILDERS = {
    "farm-overview": farm_overview,
    "project": project,
    "node": nodes,
    "slicing": slicing,
    "quota-ledger": quota_ledger,
}
