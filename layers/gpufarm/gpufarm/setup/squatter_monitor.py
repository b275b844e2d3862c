"""gpufarm's squatter monitor: a device busy with processes (or pods) of no lease, or of another lease than the
device's, as the node agent reports it (`gpufarm.gpu.squatters`, gpufarm_node.squatters); pure: no calls.

One Datadog metric monitor over the environments whose nodes run gpufarm-node (the Datadog Agent's GPU check does
not see whose process runs where):

    max(last_5m):max:gpufarm.gpu.squatters{gpufarm:managed AND environment IN (...)} by {host,gpu_uuid,gpu_ir} >= 1

The agent writes the count every cycle for every healthy device, 0 when clean, so a group alerts at the first
evaluation that sees a squatter's point and recovers five minutes after the last one: each group's alert and
recovery bound one squatting episode on one device, and `gpu_ir` names the lease it hurts (`none`: a device no
lease holds). It is made, updated and pruned with the idle monitors (gpufarm.setup.monitors: the same managed and
key tags), and validated by Datadog before apply writes it. It notifies the idle webhook, which hands its
alerts to gpufarm.handlers.squatter_alert; where a pool stops squatters (gpufarm.core.config.squatters) it
re-notifies every RENOTIFY_MINUTES while a group stays in alert, so the grace is judged again.
"""

from __future__ import annotations

from gpufarm.core.config.farm import FarmConfig, MetricsSource
from gpufarm.core.kernel.hosts import ENVIRONMENT_KEY, MANAGED_TAG, SQUATTER_MONITOR_TAG
from gpufarm.setup.monitors import (
    DEVICE_KEY,
    HOST_KEY,
    KEY_TAG_KEY,
    LEASE_KEY,
    MESSAGE_VALUE_MARK,
    NAME_PREFIX,
    IdleMonitor,
    window_text,
)
from gpufarm.setup.monitors import desired_monitors as idle_monitors
from gpufarm.setup.webhooks import IDLE_HANDLE

METRIC = "gpufarm.gpu.squatters"
KEY = "squatter"
# Its groups name the lease a squatter hurts, not an idle one: the idle webhook leaves them out (handlers.idle_alert).
KIND_TAG = SQUATTER_MONITOR_TAG
WINDOW_MINUTES = 5
# Where a pool stops squatters after a grace, the monitor re-notifies this often while a group stays in alert: the
# re-notification past the grace is what decides the stop (gpufarm.core.squatters.alerts).
RENOTIFY_MINUTES = 5


def squatter_monitors(farm: FarmConfig) -> list[IdleMonitor]:
    """The squatter monitor over the farm's gpufarm-node environments; none when no environment runs the agent."""
    envs = sorted(name for name, env in farm.environments.items() if env.metrics_source is MetricsSource.GPUFARM_NODE)
    if not envs:
        return []
    where = f"{ENVIRONMENT_KEY}:{envs[0]}" if len(envs) == 1 else f"{ENVIRONMENT_KEY} IN ({', '.join(envs)})"
    by = "by {" + ",".join([HOST_KEY, DEVICE_KEY, LEASE_KEY]) + "}"
    query = f"max({window_text(WINDOW_MINUTES)}):max:{METRIC}{{{MANAGED_TAG} AND {where}}} {by} >= 1"
    group = "{{host.name}} device {{gpu_uuid.name}}"
    message = (
        f"{{{{#is_alert}}}}gpufarm: {MESSAGE_VALUE_MARK}{{{{value}}}} process(es) not of lease "
        f"{{{{{LEASE_KEY}.name}}}} run on {group} "
        "(none: a device no lease holds). The node agent's gpufarm.process.squatter series name each one: pid, "
        f"user, claimed lease, pod. {IDLE_HANDLE}{{{{/is_alert}}}}"
        f"{{{{#is_recovery}}}}gpufarm: {group} is clear of squatters. {IDLE_HANDLE}{{{{/is_recovery}}}}"
    )
    options: dict[str, object] = {
        "thresholds": {"critical": 1.0},
        "notify_no_data": False,
        "require_full_window": False,
        "include_tags": True,
    }
    if any(farm.environments[name].squatters.stops for name in envs):
        options |= {"renotify_interval": RENOTIFY_MINUTES, "renotify_statuses": ["alert"]}
    body = {
        "name": f"{NAME_PREFIX}squatters ({', '.join(envs)})"[:200],
        "type": "query alert",
        "query": query,
        "message": message,
        "tags": sorted([MANAGED_TAG, f"{KEY_TAG_KEY}:{KEY}", KIND_TAG]),
        "options": options,
    }
    return [IdleMonitor(KEY, None, body)]


def farm_monitors(farm: FarmConfig) -> list[IdleMonitor]:
    """Every monitor gpufarm keeps for the farm: the idle monitors of its policy, then the squatter monitor."""
    return [*idle_monitors(farm), *squatter_monitors(farm)]
