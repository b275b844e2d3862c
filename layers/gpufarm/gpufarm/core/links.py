"""Links gpufarm's messages carry: a lease's incident and the page that shows its GPUs' metrics; pure, no calls.

The base is the Datadog app of the configured site (`https://app.<site>`), or GPUFARM_PUBLIC_URL where the
deployment sets it as the base of links (`gpufarm local` points it at the sandbox). The lease's metrics page is the
metrics explorer scoped to the lease's `gpu_ir` tag and grouped by host until the project dashboard exists
(docs/design.md); `Links.dashboard` is the one place that changes when it does. On a pool whose nodes run the
Datadog Agent's GPU check (`metrics_source: datadog-agent`) it shows the check's `gpu.sm_active` scoped to the
host's `ir` tag instead, the series that pool's idle monitors read (`Links.for_environment`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlencode

from gpufarm.core.farm import FarmConfig, MetricsSource
from gpufarm.core.ir import ir_tag_value

DEFAULT_APP_URL = "https://app.datadoghq.com"
# The node agent's per-device utilisation series, tagged with the lease as `gpu_ir` (spec/metrics.yaml).
DASHBOARD_METRIC = "gpufarm.gpu.utilization"
DEVICE_IR_KEY = "gpu_ir"
# The Datadog Agent GPU check's SM activity per device; the lease is the host's `ir` tag on its series.
AGENT_DASHBOARD_METRIC = "gpu.sm_active"
AGENT_IR_KEY = "ir"


@dataclass(frozen=True)
class Links:
    """URLs under one base (no trailing slash)."""

    base: str = DEFAULT_APP_URL
    metrics_source: MetricsSource = MetricsSource.GPUFARM_NODE

    @classmethod
    def for_site(cls, site: str, public_url: str | None = None) -> Links:
        """The public URL when set, else the Datadog app of `site` (`datadoghq.eu` -> https://app.datadoghq.eu)."""
        if public_url:
            return cls(public_url.rstrip("/"))
        return cls(f"https://app.{site.strip().strip('/')}")

    def for_environment(self, farm: FarmConfig, environment: str | None) -> Links:
        """These links with the metrics of the pool's source (an unknown pool keeps the node agent's)."""
        env = farm.environments.get(environment or "")
        return replace(self, metrics_source=env.metrics_source) if env is not None else self

    def incident(self, ir: int) -> str:
        """The lease's incident page (Datadog's incident URLs use the public id, the number after IR-)."""
        return f"{self.base}/incidents/{ir}"

    def dashboard(self, ir: int) -> str:
        """The lease's GPUs' utilisation per host (the metrics explorer until the project dashboard exists)."""
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
