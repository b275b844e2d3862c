"""Usage over time for a report's charts: the ledger gauges per team, read back from the metrics.

The sync publishes `gpufarm.ledger.gpus.allocated` (held) and `gpufarm.ledger.gpus.used` (busy) per team, project,
environment and model (gpufarm.core.accounting.series.ledger_series). A report reads both summed by team over its
period, two timeseries queries whatever the farm's size, each at most MAX_POINTS buckets per team. Metrics are
only the charts' source: the report's numbers come from the incidents, so a failed query leaves the charts empty
with a note and changes no figure.
"""

from __future__ import annotations

import logging

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ports import MetricsHistory
from gpufarm.reporting.model import UsageSeries
from gpufarm.reporting.query import ReportQuery

log = logging.getLogger(__name__)

HELD_METRIC = "gpufarm.ledger.gpus.allocated"
BUSY_METRIC = "gpufarm.ledger.gpus.used"
MAX_POINTS = 300
# Teams one chart draws at most (the farm file names the teams; a farm with more is summed beyond this many).
MAX_TEAMS = 50


def usage_queries(query: ReportQuery) -> dict[str, str]:
    """The two metrics queries, narrowed to the report's team or project."""
    scope = [normalize_tag(f"team:{query.team}")] if query.team else []
    scope += [normalize_tag(f"project:{query.project}")] if query.project else []
    where = ",".join(scope) or "*"
    return {metric: f"sum:{metric}{{{where}}} by {{team}}" for metric in (HELD_METRIC, BUSY_METRIC)}


def read_usage(metrics: MetricsHistory | None, query: ReportQuery) -> tuple[list[UsageSeries], str | None]:
    """Held and busy GPUs per team over the period, and a note when they could not be read."""
    if metrics is None:
        return [], "usage over time: no metrics configured"
    out: list[UsageSeries] = []
    try:
        for metric, text in usage_queries(query).items():
            results = metrics.timeseries(text, query.period.start, query.period.end, max_points=MAX_POINTS)
            for result in results[:MAX_TEAMS]:
                tags = dict(t.partition(":")[::2] for t in result.group_tags)
                points = tuple((p.timestamp, p.value) for p in result.points[: MAX_POINTS * 2])
                out.append(UsageSeries(tags.get("team") or "(none)", metric, points))
    except GpufarmError as exc:
        log.warning("report: usage over time could not be read: %s", exc)
        return [], f"usage over time could not be read ({exc}); the figures come from the incidents"
    return out, None
