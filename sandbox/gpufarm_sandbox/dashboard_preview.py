"""A small farm to look at gpufarm's dashboards on: what the dashboard browser test and the screenshots run.

On a sandbox served at `url`: `gpufarm datadog apply` with the farm configuration (the five dashboards and the
metric metadata included), simulated nodes of the three example pools running the real node agent on fake NVML, a
few leases (whole hosts on the dedicated pools, MIG slices on the shared one, each with its hosts' `ir:`, `team:`
and `project:` tags), and the quota and inventory gauges the scheduled sync publishes, every sandbox minute. For the
lifecycle panels (gpufarm.core.leases.metrics) one request waits for an operator's decision the whole run (a
live incident the sync's gauges count), and the leases are warned as idle and reclaimed at set points of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from gpufarm.config import SecretStr

if TYPE_CHECKING:
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.config import Settings
    from gpufarm.core.config.farm import FarmConfig
    from gpufarm.core.service import GpuFarm
    from gpufarm_sandbox.emulator.app import Sandbox
    from gpufarm_sandbox.simfarm import SimulatedFarm

# (host, IR, team, project, devices or None for the whole host, workload profile)
LEASES: tuple[tuple[str, int, str, str, tuple[str, ...] | None, str], ...] = (
    ("gpu-aws-001", 101, "nlp", "llm-ko", None, "busy"),
    ("gpu-hpc-002", 102, "vision", "seg-3d", None, "idle-held"),
    ("gpu-slc-003", 103, "vision", "tiny-vit", ("0/0", "0/1", "0/2"), "busy"),
    ("gpu-slc-003", 104, "nlp", "tokenizer", ("1/0", "1/1"), "idle"),
)
# (share of the run, IR, team, project, environment, model, reclaim reason or None for an idle warning, GPUs freed)
STEPS: tuple[tuple[float, int, str, str, str, str, str | None, int], ...] = (
    (0.2, 102, "vision", "seg-3d", "onprem-hpc", "H100", None, 0),
    (0.3, 104, "nlp", "tokenizer", "shared-slices", "A100", None, 0),
    (0.5, 100, "nlp", "llm-ko", "cloud-aws", "H100", "expired", 8),
    (0.6, 104, "nlp", "tokenizer", "shared-slices", "A100", "partial-idle", 1),
    (0.8, 99, "vision", "seg-3d", "onprem-hpc", "H100", "released", 8),
)
# The request that waits for an operator: vision beyond its onprem-hpc quota.
WAITING = {"gpu_count": "16", "gpu_model": "H100", "environment": "onprem-hpc", "team": "vision", "project": "seg-3d"}
SECRET = "dashboard-preview-webhook-secret-01"  # noqa: S105 - the local sandbox's throw-away webhook secret


@dataclass(frozen=True)
class Preview:
    """The dashboards made (key -> id) and how many agent cycles ran."""

    dashboards: dict[str, str]
    cycles: int


class _SandboxClock:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def now(self) -> datetime:
        return self._sandbox.clock.now_dt()


def settings_for(url: str) -> Settings:
    """Settings aimed at the sandbox at url, with its keys."""
    from gpufarm.config import Settings
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN

    return Settings(
        datadog_host=url,
        datadog_api_key=SecretStr(DEFAULT_DD_API_KEY),
        datadog_app_key=SecretStr(DEFAULT_DD_APP_KEY),
        slack_api_url=f"{url}/slack/api/",
        slack_bot_token=SecretStr(DEFAULT_SLACK_TOKEN),
        webhook_secret=SecretStr(SECRET),
        max_retries=1,
    )


def build_preview(
    sandbox: Sandbox, url: str, farm: FarmConfig, *, hosts: int = 6, cycles: int = 30, per_process: bool = True
) -> Preview:
    """Apply, simulate `hosts` nodes with the LEASES on them for `cycles` sandbox minutes, publish gauges."""
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.adapters.slack import SlackChat
    from gpufarm.cli.datadog import run_apply
    from gpufarm.core.service import GpuFarm
    from gpufarm.core.sync.gauges import publish_gauges
    from gpufarm.setup.dashboards import KIND, dashboard_key
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
    from gpufarm_sandbox.pricelists import price_book
    from gpufarm_sandbox.simfarm import start_simulated_farm

    settings = settings_for(url)
    plan = run_apply(
        settings,
        incident_webhook_url=f"{url}/fn/incident_webhook/",
        idle_webhook_url=f"{url}/fn/idle_alert/",
        farm=farm,
        env={},
    )
    made = [c for c in plan.changes if c.kind == KIND]
    gateway = DatadogGateway(settings)
    nodes = start_simulated_farm(
        hosts,
        url,
        DEFAULT_DD_API_KEY,
        DEFAULT_DD_APP_KEY,
        clock=sandbox.clock.now,
        background=False,
        per_process=per_process,
    )
    try:
        _lease(nodes, gateway, LEASES)
        svc = GpuFarm(
            incidents=gateway,
            hosts=gateway,
            chat=SlackChat.from_settings(settings),
            clock=_SandboxClock(sandbox),
            farm=farm,
            metrics=gateway,
            prices=price_book(farm),
        )
        _waiting_request(gateway, farm, svc.context.clock.now())
        for cycle in range(cycles):
            nodes.step_all()
            _steps(svc, cycle, cycles)
            publish_gauges(svc.context)
            sandbox.clock.advance(60)
    finally:
        nodes.stop()
        gateway.close()
    dashboards = {str(dashboard_key(d)): str(d["id"]) for d in sandbox.dashboards.live() if dashboard_key(d)}
    if len(dashboards) < len(made):
        raise RuntimeError(f"apply planned {len(made)} dashboards, the sandbox holds {len(dashboards)}")
    return Preview(dashboards, cycles)


def _lease(
    nodes: SimulatedFarm,
    gateway: DatadogGateway,
    leases: Sequence[tuple[str, int, str, str, tuple[str, ...] | None, str]],
) -> None:
    present = set(nodes.hosts)
    for host, ir, team, project, devices, profile in leases:
        if host not in present:
            continue
        gpus = list(devices) if devices is not None else None
        nodes.assign(host, ir, gpus=gpus)
        nodes.set_profile(host, profile, gpus=gpus)
        gateway.add_tags(host, [f"ir:ir-{ir}", f"team:{team}", f"project:{project}"])


def _waiting_request(gateway: DatadogGateway, farm: FarmConfig, now: datetime) -> None:
    """The live incident of a request awaiting an operator's decision, requested now."""
    from gpufarm.core.governance.policy import build_request
    from gpufarm.core.kernel import fields as f
    from gpufarm.core.kernel import history
    from gpufarm.core.kernel.lifecycle import Phase

    request = build_request(WAITING, farm, requester="U0000000002", channel=None, request_id="preview-waiting-1")
    asked = history.entry(now, request.requester, history.Step.REQUESTED, "16x H100 in onprem-hpc").line()
    gateway.create(request.title(), {**request.to_fields(Phase.REQUESTED, now), f.HISTORY: [asked]})


def _steps(svc: GpuFarm, cycle: int, cycles: int) -> None:
    """The STEPS due at this cycle, counted as the service counts them (after the write it would make)."""
    from gpufarm.core.kernel.lifecycle import Phase, State
    from gpufarm.core.kernel.model import Allocation
    from gpufarm.core.leases import metrics

    for share, ir, team, project, environment, model, reason, gpus in STEPS:
        if cycle != int(share * cycles):
            continue
        alloc = Allocation(
            incident_id=f"preview-{ir}",
            ir=ir,
            title=f"preview lease {ir}",
            state=State.STABLE,
            phase=Phase.ALLOCATED,
            team=team,
            project=project,
            gpu_model=model,
            environment=environment,
        )
        if reason is None:
            metrics.warned(svc.context, alloc)
        else:
            metrics.reclaimed(svc.context, alloc, reason, gpus)
