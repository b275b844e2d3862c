"""A squatter's names are inert in Slack (docs/security.md, "Text from people in Slack"): a process's user, a pod's
namespace and name and the lease it claims come from whoever started it, and reach the operators' channel and the
holder's DM (gpufarm.core.chat.squatter_notices). Filled with every token kind, the posts of a new episode, of a
stop and of a device no lease holds carry no `<…>` token but gpufarm's own: the holder's checked mention and links
under its Datadog base."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, ask_hpc

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.kernel.serial import IncidentCommand, Op, SquatterScope
from gpufarm.core.service import GpuFarm

HOLDER = "U0000000002"
DEVICE = "gpu-00000000-0000-4000-8000-000000000001"
HOSTILE = "<!channel><!here><@U0000000009><!subteam^S0000000001><#C0000000001><https://evil.example|click>&"
_TOKEN = re.compile(r"<([^>]*)>")
_OURS = re.compile(r"^(@U0000000002|https://app\.datadoghq\.com/[^|]*(\|[^<>]*)?)$")


class HostileSquatters:
    """The device's squatters as the series name them, every value hostile (Datadog keeps such tag values)."""

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        tags = (f"pid:{HOSTILE}", f"user:{HOSTILE}", f"claimed_ir:{HOSTILE}", f"kube_namespace:{HOSTILE}")
        return [ScalarResult((*tags, f"pod_name:{HOSTILE}"), 1.0), ScalarResult((f"user:{HOSTILE}", "pid:7"), 1.0)]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_hostile_squatter_names_reach_slack_inert() -> None:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc", "a")
    chat = FakeChat(operators=frozenset({"U0000000009"}))
    farm = parse_farm(FARM_YAML.replace("gpu_models: [H100]}", "gpu_models: [H100], squatters: stop-after}", 1))
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=FakeMetrics())
    svc.context.usage = HostileSquatters()
    assert ask_hpc(svc, incidents, HOLDER, 8, 7) == 1
    before = len(chat.sent)
    scope = SquatterScope(host="hpc-1", device=DEVICE, value=2)
    executor.execute(svc.context, IncidentCommand(op=Op.SQUATTER, ir=1, origin="a", squatter=scope))
    clock.advance(minutes=11)
    executor.execute(svc.context, IncidentCommand(op=Op.SQUATTER, ir=1, origin="b", squatter=scope))
    unheld = SquatterScope(host="hpc-9", device=DEVICE)
    executor.execute(svc.context, IncidentCommand(op=Op.SQUATTER, origin="c", squatter=unheld))
    sent = chat.sent[before:]
    assert [s.kind for s in sent] == ["post", "dm", "post", "dm", "post"]
    assert any("&lt;!channel&gt;" in str(s.blocks) for s in sent)
    for message in sent:
        for text in [message.text, *_strings(message.blocks)]:
            foreign = [t for t in _TOKEN.findall(text) if not _OURS.match(t)]
            assert foreign == [], text
