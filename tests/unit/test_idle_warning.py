"""The idle warning people act on: which hosts or devices look idle, the kind in words, the measured value and
window, the reclaim time, what Keep does, and links to the lease's incident and GPU metrics; valid Block Kit."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.config import Settings
from gpufarm.core.chat import block_kit, idle_notices
from gpufarm.core.chat.links import Links
from gpufarm.core.config.farm import IdlePolicy, IdleSettings, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IdleScope
from gpufarm.core.service import GpuFarm
from gpufarm_sandbox.emulator.slack_blockkit import block_errors

WARNED_AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DEVICE = "gpu-0a1b2c3d-0000-4000-8000-00000000000a"
OTHER_DEVICE = "gpu-0a1b2c3d-0000-4000-8000-00000000000b"


def _farm(chat: FakeChat | None = None, links: Links | None = None) -> tuple[GpuFarm, FakeIncidents]:
    clock = FakeClock(WARNED_AT)
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for name in ("hpc-1", "hpc-2"):
        hosts.seed(name, "H100", 8, "hpc", "a")
    svc = GpuFarm(
        incidents=incidents,
        hosts=hosts,
        chat=chat or FakeChat(),
        clock=clock,
        farm=parse_farm(FARM_YAML),
        metrics=FakeMetrics(),
        links=links,
    )
    return svc, incidents


def _lease(svc: GpuFarm, incidents: FakeIncidents) -> Allocation:
    values = {"gpu_count": "16", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    request = build_request(
        values, svc.context.farm, requester="U0000000001", channel="C0000000002", request_id="req-00000001"
    )
    fields = request.to_fields(Phase.APPROVED, svc.context.clock.now())
    ir = incidents.create(request.title(), {**fields, f.APPROVED_BY: "U0000000009"}).public_id
    svc.process(incidents.by_ir(ir).id)
    alloc = Allocation.from_record(incidents.by_ir(ir))
    assert alloc.phase is Phase.ALLOCATED and sorted(alloc.hosts) == ["hpc-1", "hpc-2"], alloc
    return alloc


@pytest.fixture
def lease() -> Allocation:
    return _lease(*_farm())


POLICY: IdlePolicy = IdleSettings().policy()


def _text(message: block_kit.Message) -> str:
    assert block_errors(message.blocks) == [], message.blocks
    return str(message.blocks[0]["text"]["text"])


@pytest.mark.parametrize(
    ("scope", "says"),
    [
        (
            IdleScope(hosts=("hpc-1",), kind="idle", value=0.0, window_minutes=60),
            "no process on the GPUs (0 compute processes over the last 60 min)",
        ),
        (
            IdleScope(hosts=("hpc-1",), kind="idle_held", value=1.0, window_minutes=45),
            "memory held but the SMs idle (every sample over the last 45 min)",
        ),
        (
            IdleScope(hosts=("hpc-1",), kind="low_utilization", value=2.5, window_minutes=120),
            "utilisation below 5 % (2.5 % mean over the last 120 min)",
        ),
        # No window on the alert: the policy's window for that kind.
        (IdleScope(hosts=("hpc-1",), kind="low_utilization"), "utilisation below 5 % (the mean over the last 120 min)"),
        # A kind gpufarm does not know (a hand-made monitor's tag): said plainly, with what was measured.
        (IdleScope(hosts=("hpc-1",), kind="custom", value=3.0), "an idle monitor fired (value 3 over the monitor's"),
    ],
)
def test_each_kind_in_words_with_value_and_window(lease: Allocation, scope: IdleScope, says: str) -> None:
    text = _text(idle_notices.idle_warning(lease, POLICY, WARNED_AT, scope))
    assert f"*Seen:* {says}" in text
    assert "has been idle: host `hpc-1` (8 GPUs)." in text


def test_hosts_then_devices(lease: Allocation) -> None:
    both = _text(idle_notices.idle_warning(lease, POLICY, WARNED_AT, IdleScope(hosts=("hpc-1", "HPC-2"), kind="idle")))
    assert "hosts `hpc-1` (8 GPUs), `HPC-2` (8 GPUs)." in both
    devices = IdleScope(hosts=("hpc-2",), devices=(DEVICE, OTHER_DEVICE), kind="idle", value=0.0)
    text = _text(idle_notices.idle_warning(lease, POLICY, WARNED_AT, devices))
    assert f"has been idle: devices `{DEVICE}`, `{OTHER_DEVICE}` on `hpc-2`." in text
    one = _text(idle_notices.idle_warning(lease, POLICY, WARNED_AT, IdleScope(devices=(DEVICE,), kind="idle")))
    assert f"has been idle: device `{DEVICE}`." in one


def test_many_hosts_are_counted_not_listed(lease: Allocation) -> None:
    many = IdleScope(hosts=tuple(f"node-{i:02d}" for i in range(20)), kind="idle")
    text = _text(idle_notices.idle_warning(lease, POLICY, WARNED_AT, many))
    assert "`node-07` and 12 more." in text and "node-08" not in text


def test_no_scope_says_the_whole_lease_looks_idle(lease: Allocation) -> None:
    message = idle_notices.idle_warning(lease, POLICY, WARNED_AT, None)
    text = _text(message)
    assert "has been idle: the whole lease looks idle (16 GPUs on `hpc-1`, `hpc-2`)." in text
    assert "*Seen:* an idle monitor fired (over the monitor's window)." in text
    # The fallback text (notifications) names the lease and the reclaim time.
    assert message.text == f"{lease.ir_label} is idle and will be reclaimed at 2026-03-02 10:00 UTC unless you keep it"


def test_reclaim_time_keep_and_buttons_follow_the_policy(lease: Allocation) -> None:
    policy = IdleSettings(grace_minutes=90).policy()
    message = idle_notices.idle_warning(lease, policy, WARNED_AT, IdleScope(hosts=("hpc-1",), kind="idle"))
    text = _text(message)
    assert "*Reclaim:* at 2026-03-02 10:30 UTC (the lease's 90 min grace) unless it gets busy again" in text
    assert "*Keep:* clears this warning; it holds until the monitors see it idle again (within 90 min" in text
    buttons = message.blocks[-1]["elements"]
    assert [(b["text"]["text"], b["action_id"], b["value"]) for b in buttons] == [
        ("Keep", block_kit.ACTION_KEEP, lease.ir_label),
        ("Release", block_kit.ACTION_RELEASE, lease.ir_label),
    ]


def _links(message: block_kit.Message) -> str:
    """The lease's links line (gpufarm.core.chat.messages.lease_links), a context block before the buttons."""
    [block] = [b for b in message.blocks if str(b.get("block_id", "")).startswith(block_kit.LINKS_BLOCK)]
    return str(block["elements"][0]["text"])


def test_links_to_the_incident_and_the_leases_metrics(lease: Allocation) -> None:
    ir = lease.ir
    default = _links(idle_notices.idle_warning(lease, POLICY, WARNED_AT, None))
    assert f"<https://app.datadoghq.com/incidents/{ir}|Incident {lease.ir_label}>" in default
    explorer = (
        "https://app.datadoghq.com/metric/explorer?exp_metric=gpufarm.gpu.utilization"
        f"&exp_scope=gpu_ir:ir-{ir}&exp_group=host"
    )
    assert f"<{explorer}|GPU metrics>" in default
    eu = Links.for_site("datadoghq.eu")
    assert f"<https://app.datadoghq.eu/incidents/{ir}|" in _links(
        idle_notices.idle_warning(lease, POLICY, WARNED_AT, None, eu)
    )
    local = Links.for_site("datadoghq.com", "http://127.0.0.1:8321/")
    text = _links(idle_notices.idle_warning(lease, POLICY, WARNED_AT, None, local))
    assert f"<http://127.0.0.1:8321/incidents/{ir}|" in text
    assert (
        f"<http://127.0.0.1:8321/metric/explorer?exp_metric=gpufarm.gpu.utilization&exp_scope=gpu_ir:ir-{ir}&" in text
    )


def test_settings_pick_the_link_base() -> None:
    site = Settings(datadog_site="us5.datadoghq.com", public_url=None)
    assert Links.for_site(site.datadog_site, site.public_url).base == "https://us5.datadoghq.com"
    # Each site's app as Datadog's site list gives it: `app.` only before the sites named by their domain alone.
    apps = {
        "datadoghq.com": "https://app.datadoghq.com",
        "us3.datadoghq.com": "https://us3.datadoghq.com",
        "datadoghq.eu": "https://app.datadoghq.eu",
        "ap1.datadoghq.com": "https://ap1.datadoghq.com",
        "ap2.datadoghq.com": "https://ap2.datadoghq.com",
        "uk1.datadoghq.com": "https://uk1.datadoghq.com",
        "ddog-gov.com": "https://app.ddog-gov.com",
        "us2.ddog-gov.com": "https://us2.ddog-gov.com",
    }
    assert {s: Links.for_site(s).base for s in apps} == apps
    local = Settings(public_url="http://localhost:8321")
    assert Links.for_site(local.datadog_site, local.public_url).base == "http://localhost:8321"


def test_the_dm_carries_the_scope_and_the_services_links() -> None:
    chat = FakeChat()
    svc, incidents = _farm(chat, Links("http://sandbox.test"))
    alloc = _lease(svc, incidents)
    scope = IdleScope(hosts=("hpc-2",), kind="low_utilization", value=1.25, window_minutes=120)
    assert svc.idle_triggered(alloc.ir, scope).action.startswith("warned on hpc-2")
    # One host of two: that part alone goes back after the grace (FARM_YAML's default idle.partial: reclaim).
    dm = next(s for s in chat.sent if "is idle and goes back at" in s.text)
    message = block_kit.Message(dm.text, [dict(b) for b in dm.blocks])
    text = _text(message)
    assert "has been idle: host `hpc-2` (8 GPUs)." in text
    assert "*Seen:* utilisation below 5 % (1.25 % mean over the last 120 min)." in text
    # FARM_YAML's grace is 60 minutes from the warning, which the service records at its clock's now.
    assert "*Reclaim:* these GPUs go back to the pool at 2026-03-02 10:00 UTC (the lease's 60 min grace)" in text
    assert f"<http://sandbox.test/incidents/{alloc.ir}|Incident {alloc.ir_label}>" in _links(message)
    assert Allocation.from_record(incidents.by_ir(alloc.ir)).phase is Phase.IDLE_WARNED
