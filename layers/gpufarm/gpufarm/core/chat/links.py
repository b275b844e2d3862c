"""Links gpufarm's messages carry: a lease's incident and its project dashboard; pure, no calls.

The base is the Datadog app of the configured site, or GPUFARM_PUBLIC_URL where the
deployment sets it as the base of links (`gpufarm local` points it at the sandbox, which serves the same paths).

A lease's dashboard link is gpufarm's project dashboard (the one `gpufarm datadog apply` marks
`[gpufarm-dashboard:project]`) scoped to the lease by its template variables, as Datadog's own dashboard URLs
carry them: `<base>/dashboard/<id>?tpl_var_team=<team>&tpl_var_project=<project>&tpl_var_ir=ir-<n>`. The dashboard's
id is only known once apply has created it, so the runtime looks it up (`project_dashboard`, a callable the
handlers wire to Datadog's dashboard list, read once per container and cached); until one exists, or when the
lookup fails, the link is the metrics explorer scoped to the lease's `gpu_ir` tag and grouped by host.

On a pool whose nodes run the Datadog Agent's GPU check (`metrics_source: datadog-agent`) the project dashboard
has no series for the lease (it reads the node agent's `gpufarm.ir.*`), so the link is the explorer of the check's
`gpu.sm_active` scoped to the host's `ir` tag, the series that pool's idle monitors read (`Links.for_environment`).

Every message about a lease renders both links through `Links.line` (gpufarm.core.chat.messages.lease_links puts it in a
context block), so their words and form are the same in every message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlencode

from gpufarm.core.config.farm import FarmConfig, MetricsSource
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ir import format_ir, ir_tag_value

DEFAULT_APP_URL = "https://app.datadoghq.com"
# The node agent's per-device utilisation series, tagged with the lease as `gpu_ir` (spec/metrics.yaml).
DASHBOARD_METRIC = "gpufarm.gpu.utilization"
DEVICE_IR_KEY = "gpu_ir"
# The Datadog Agent GPU check's SM activity per device; the lease is the host's `ir` tag on its series.
AGENT_DASHBOARD_METRIC = "gpu.sm_active"
AGENT_IR_KEY = "ir"
# The key of gpufarm's project dashboard (its ownership marker, gpufarm.setup.dashboards) and how Datadog's
# dashboard URLs name a template variable's value.
PROJECT_DASHBOARD_KEY = "project"
TEMPLATE_VARIABLE_PREFIX = "tpl_var_"
# The project dashboard's template variables (gpufarm.setup.dashboards_farm.project) a lease's link sets.
TEAM_VARIABLE, PROJECT_VARIABLE, IR_VARIABLE = "team", "project", "ir"
# The words of the two links.
DASHBOARD_LABEL = "Project dashboard"
METRICS_LABEL = "GPU metrics"

# Returns the project dashboard's id, or None when there is none (yet) or it cannot be read now.
DashboardLookup = Callable[[], "str | None"]


@dataclass(frozen=True)
class Links:
    """URLs under one base (no trailing slash)."""

    base: str = DEFAULT_APP_URL
    metrics_source: MetricsSource = MetricsSource.GPUFARM_NODE
    # The project dashboard's id, looked up by the runtime (cached there); None: the metrics explorer instead.
    project_dashboard: DashboardLookup | None = field(default=None, compare=False)

    @classmethod
    def for_site(
        cls, site: str, public_url: str | None = None, project_dashboard: DashboardLookup | None = None
    ) -> Links:
        """The public URL when set, else the Datadog app of `site` (app_url)."""
        if public_url:
            return cls(public_url.rstrip("/"), project_dashboard=project_dashboard)
        return cls(app_url(site), project_dashboard=project_dashboard)

    def for_environment(self, farm: FarmConfig, environment: str | None) -> Links:
        """These links with the metrics of the pool's source (an unknown pool keeps the node agent's)."""
        env = farm.environments.get(environment or "")
        return replace(self, metrics_source=env.metrics_source) if env is not None else self

    def incident(self, ir: int) -> str:
        """The lease's incident page (Datadog's incident URLs use the public id, the number after IR-)."""
        return f"{self.base}/incidents/{ir}"

    def host(self, host: str) -> str:
        """The host in Datadog's infrastructure list."""
        return f"{self.base}/infrastructure?{urlencode({'host': host})}"

    def dashboard(self, ir: int, team: str | None = None, project: str | None = None) -> str:
        """The lease's project dashboard, its template variables set to the lease (and its team and project).

        The metrics explorer of the lease's GPUs per host where the project dashboard cannot show them: none
        exists yet, its id cannot be read now, or the pool's metrics come from the Datadog Agent's GPU check.
        """
        dashboard_id = self._dashboard_id()
        if dashboard_id is None:
            return self.explorer(ir)
        variables = [(TEAM_VARIABLE, team), (PROJECT_VARIABLE, project), (IR_VARIABLE, ir_tag_value(ir))]
        # Tag values as Datadog stores them (lowercase), so the variables match the series' tags.
        query = urlencode(
            [(f"{TEMPLATE_VARIABLE_PREFIX}{name}", normalize_tag(value)) for name, value in variables if value]
        )
        return f"{self.base}/dashboard/{quote(dashboard_id, safe='')}?{query}"

    def dashboard_label(self) -> str:
        """What the dashboard link is called: the project dashboard, or the GPU metrics it falls back to."""
        return DASHBOARD_LABEL if self._dashboard_id() is not None else METRICS_LABEL

    def explorer(self, ir: int) -> str:
        """The metrics explorer of the lease's GPUs' utilisation per host (the pool's metrics source's series)."""
        agent = self.metrics_source is MetricsSource.DATADOG_AGENT
        metric, key = (AGENT_DASHBOARD_METRIC, AGENT_IR_KEY) if agent else (DASHBOARD_METRIC, DEVICE_IR_KEY)
        query = urlencode(
            {
                "exp_metric": metric,
                "exp_scope": f"{key}:{ir_tag_value(ir)}",
                "exp_group": "host",
            },
            safe=":",
        )
        return f"{self.base}/metric/explorer?{query}"

    def line(self, ir: int, team: str | None = None, project: str | None = None) -> str:
        """`<incident|Incident IR-n> · <dashboard|Project dashboard>`: both links of a lease, in Slack mrkdwn."""
        dashboard = f"<{self.dashboard(ir, team, project)}|{self.dashboard_label()}>"
        return f"<{self.incident(ir)}|Incident {format_ir(ir)}> · {dashboard}"

    def _dashboard_id(self) -> str | None:
        """The project dashboard's id when it can show this pool's leases, else None."""
        if self.project_dashboard is None or self.metrics_source is MetricsSource.DATADOG_AGENT:
            return None
        return self.project_dashboard()


def app_url(site: str) -> str:
    """The Datadog app of a site, as Datadog's site list gives it: `app.` before the sites named by their domain
    alone (`datadoghq.com`, `datadoghq.eu`, `ddog-gov.com`); a regional site's name is its app's host
    (`us5.datadoghq.com` -> https://us5.datadoghq.com, `us2.ddog-gov.com` -> https://us2.ddog-gov.com)."""
    host = site.strip().strip("/")
    return f"https://{host}" if host.count(".") > 1 else f"https://app.{host}"
