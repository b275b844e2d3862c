"""Links from every message about a lease (gpufarm.core.chat.links, gpufarm.core.chat.messages.lease_links).

The lease's project dashboard link (Datadog's template-variable URL form, the fallbacks), the runtime's cached
lookup of the dashboard's id, and then every kind of lease message, driven through the service, the executor and
the Slack worker on the unit fakes: each message builder's output is checked while the flows run (a spy on every
builder that takes a lease and returns a Message), every builder must have run, and every message sent that
names a lease carries both of its links.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.adapters import datadog_dashboards as dd
from gpufarm.config import Settings
from gpufarm.core.chat import block_kit, cards, messages
from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.chat.links import Links
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.idle import keeps
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op, ProfileScope
from gpufarm.core.leases import notices, profile_runs
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import slack_worker
from gpufarm.handlers.slack_events import Job
from gpufarm_sandbox.emulator.slack_blockkit import block_errors

pytestmark = pytest.mark.unit

BASE = "https://app.datadoghq.eu"
DASHBOARD = "abc-def-ghi"
USER = "U0000000001"
OPS = "U0000000OPS"
OPS_CHANNEL = "C0000000001"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
DEVICES = ("gpu-0a1b2c3d-0000-4000-8000-00000000000a", "gpu-0a1b2c3d-0000-4000-8000-00000000000b")
_ids = itertools.count(1)


# -- the links themselves ----------------------------------------------------------------------------------------


def test_the_dashboard_link_is_the_project_dashboard_scoped_to_the_lease() -> None:
    links = Links.for_site("datadoghq.eu", project_dashboard=lambda: DASHBOARD)
    assert links.dashboard(12, "nlp", "llm-ko") == (
        f"{BASE}/dashboard/{DASHBOARD}?tpl_var_team=nlp&tpl_var_project=llm-ko&tpl_var_ir=ir-12"
    )
    # Tag values as Datadog stores them; what a team or project lacks is left out, the lease is always there.
    assert links.dashboard(3, "NLP", None).endswith("?tpl_var_team=nlp&tpl_var_ir=ir-3")
    assert links.line(12, "nlp", "llm-ko") == (
        f"<{BASE}/incidents/12|Incident IR-12> · <{links.dashboard(12, 'nlp', 'llm-ko')}|Project dashboard>"
    )
    # An id is a path segment: anything odd in it is quoted, never passed through.
    assert Links("http://x", project_dashboard=lambda: "a/b?c").dashboard(1).startswith("http://x/dashboard/a%2Fb%3Fc?")


def test_without_a_dashboard_and_on_agent_pools_the_link_is_the_metrics_explorer() -> None:
    explorer = f"{BASE}/metric/explorer?exp_metric=gpufarm.gpu.utilization&exp_scope=gpu_ir:ir-7&exp_group=host"
    for links in (Links(BASE), Links(BASE, project_dashboard=lambda: None)):
        assert links.dashboard(7, "nlp", "p") == explorer
        assert links.line(7, "nlp", "p").endswith(f"<{explorer}|GPU metrics>")
    farm = parse_farm(
        FARM_YAML.replace("cloud: {kind: dedicated,", "cloud: {metrics_source: datadog-agent, kind: dedicated,")
    )
    agent = Links(BASE, project_dashboard=lambda: DASHBOARD).for_environment(farm, "cloud")
    # The project dashboard reads the node agent's series; the Agent check's are the explorer's.
    assert agent.dashboard(7, "nlp", "p") == (
        f"{BASE}/metric/explorer?exp_metric=gpu.sm_active&exp_scope=ir:ir-7&exp_group=host"
    )
    assert agent.dashboard_label() == "GPU metrics"
    node = Links(BASE, project_dashboard=lambda: DASHBOARD).for_environment(farm, "hpc")
    assert node.dashboard_label() == "Project dashboard" and f"/dashboard/{DASHBOARD}?" in node.dashboard(7)


class _Api:
    """DashboardsApi.list_dashboards with a raw answer, or a failure."""

    def __init__(self, dashboards: list[dict[str, Any]]) -> None:
        self.dashboards = dashboards
        self.fail = False
        self.calls = 0

    def list_dashboards(self) -> Any:
        self.calls += 1
        if self.fail:
            raise UpstreamError("datadog list dashboards failed: 503")
        import json

        body = json.dumps({"dashboards": self.dashboards}).encode()
        return type("Raw", (), {"data": body, "release_conn": lambda self: None})()


def _lookup(api: _Api, now: list[float]) -> dd.ProjectDashboard:
    lookup = dd.ProjectDashboard(Settings(dd_api_key="k", dd_app_key="a"), monotonic=lambda: now[0])
    lookup.__dict__["_api"] = api  # the cached client, as the first call would build it
    return lookup


def test_the_dashboard_id_is_read_once_per_container_and_asked_again_only_after_a_while() -> None:
    theirs = {"id": "zzz-zzz-zzz", "title": "someone's", "description": "not gpufarm's"}
    api = _Api([theirs])
    now = [1000.0]
    lookup = _lookup(api, now)
    assert lookup() is None and lookup() is None and api.calls == 1  # none yet: not asked again at once
    api.dashboards = [
        theirs,
        {"id": "new-new-new", "description": "[gpufarm-dashboard:project]", "created_at": "2026-03-02T00:00:00Z"},
        {"id": "old-old-old", "description": "x [gpufarm-dashboard:project]", "created_at": "2026-03-01T00:00:00Z"},
        {"id": "nod-nod-nod", "description": "[gpufarm-dashboard:node]", "created_at": "2026-01-01T00:00:00Z"},
    ]
    now[0] += dd.RETRY_S
    # The oldest of two (apply keeps that one and reports the other a duplicate).
    assert lookup() == "old-old-old" and api.calls == 2
    now[0] += 10 * dd.RETRY_S
    assert lookup() == "old-old-old" and api.calls == 2  # found: kept for the container's life


def test_a_failed_lookup_falls_back_and_is_retried_later() -> None:
    api = _Api([{"id": "old-old-old", "description": "[gpufarm-dashboard:project]"}])
    api.fail = True
    now = [0.0]
    lookup = _lookup(api, now)
    links = Links(BASE, project_dashboard=lookup)
    assert "/metric/explorer?" in links.dashboard(5) and "/metric/explorer?" in links.line(5)
    assert api.calls == 1  # one failed read, not one per link
    api.fail = False
    now[0] += dd.RETRY_S
    assert links.dashboard(5).startswith(f"{BASE}/dashboard/old-old-old?") and api.calls == 2


# -- every message about a lease -------------------------------------------------------------------------------

MODULES: tuple[ModuleType, ...] = (messages, notices, cards, keeps, profile_runs)


def _builders() -> dict[str, tuple[ModuleType, str]]:
    """Every function of the message modules that takes a lease (`alloc: Allocation`) and returns a Message."""
    out: dict[str, tuple[ModuleType, str]] = {}
    for module in MODULES:
        for name, fn in vars(module).items():
            if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            sig = inspect.signature(fn)
            alloc = sig.parameters.get("alloc")
            if alloc is not None and alloc.annotation == "Allocation" and sig.return_annotation == "Message":
                out[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = (module, name)
    return out


BUILDERS = _builders()


@dataclass
class Spy:
    """Records each builder's results, with the lease each was about."""

    seen: dict[str, list[tuple[Allocation, block_kit.Message]]] = field(default_factory=dict)

    def wrap(self, key: str, fn: Callable[..., block_kit.Message]) -> Callable[..., block_kit.Message]:
        sig = inspect.signature(fn)

        def spied(*args: Any, **kwargs: Any) -> block_kit.Message:
            message = fn(*args, **kwargs)
            alloc = sig.bind(*args, **kwargs).arguments["alloc"]
            self.seen.setdefault(key, []).append((alloc, message))
            return message

        return spied


def expected_line(alloc: Allocation) -> str:
    dashboard = f"{BASE}/dashboard/{DASHBOARD}?tpl_var_team={alloc.team}&tpl_var_project={alloc.project}"
    dashboard += f"&tpl_var_ir=ir-{alloc.ir}"
    return f"<{BASE}/incidents/{alloc.ir}|Incident {alloc.ir_label}> · <{dashboard}|Project dashboard>"


def assert_linked(alloc: Allocation, blocks: list[Any], what: str) -> None:
    """The message carries the lease's links block, well formed, and is valid Block Kit."""
    assert block_errors(blocks) == [], (what, blocks)
    found = [b for b in blocks if b.get("block_id") == f"{block_kit.LINKS_BLOCK}:{alloc.ir}"]
    assert len(found) == 1, (what, blocks)
    assert found[0]["type"] == "context" and found[0]["elements"][0]["text"] == expected_line(alloc), what


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    clock: FakeClock
    spy: Spy

    def lease(self, count: int = 8, env: str = "hpc", team: str = "nlp", model: str = "H100") -> int:
        """A request as the worker hands it on, decided (and allocated when granted) at once: no queue."""
        values = {"gpu_count": str(count), "gpu_model": model, "environment": env, "team": team, "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=USER, channel=None, request_id=f"l-{next(_ids):06d}"
        )
        assert executor.request(self.svc.context, request, response_url=URL, origin=request.request_id) is None
        ir = max(a.ir for a in self.svc.context.live())
        self.svc.allocate_waiting(env)
        return ir

    def job(self, text: str, user: str = USER) -> Job:
        return Job(kind="command", user=user, response_url=URL, command=parse_command(text).to_payload())

    def say(self, text: str, user: str = USER) -> None:
        """A slash command through the Slack worker; its answer is what the worker replies."""
        message = slack_worker.dispatch(self.svc, self.job(text, user))
        if message is not None:
            self.chat.respond(URL, message.text, message.blocks)

    def run(self, op: Op, ir: int, actor: str = USER, **extra: Any) -> None:
        """An incident command run twice: once, then as the queue's redelivery (answered from the ledger)."""
        body = {"op": op, "ir": ir, "actor": actor, "response_url": URL, "origin": f"o-{next(_ids)}", **extra}
        cmd = IncidentCommand.model_validate(body)
        executor.execute(self.svc.context, cmd)
        executor.execute(self.svc.context, cmd)

    def reclaim_resolved(self) -> None:
        for a in list(self.svc.context.incidents.search(IncidentQuery.where({State.RESOLVED}))):  # type: ignore[attr-defined]
            self.svc.process(a.id)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    spy = Spy()
    for key, (module, name) in BUILDERS.items():
        monkeypatch.setattr(module, name, spy.wrap(key, getattr(module, name)))
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    hosts.seed("slice-0", "A100", 8, "slices")
    chat = FakeChat(operators=frozenset({OPS}))
    farm = parse_farm(FARM_YAML + "keeps: {max_keeps: 1, keep_hours: 1}\n")
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=chat,
        clock=clock,
        farm=farm,
        links=Links.for_site("datadoghq.eu", project_dashboard=lambda: DASHBOARD),
    )
    yield World(svc, chat, clock, spy)


def _flows(w: World) -> None:
    """Every lease message kind: requests decided by policy and by operators, allocation, waiting and withdrawal,
    status and list, extension, release and reclaim, idle warnings whole and partial, busy again, partial reclaim,
    keeps and their refusal, an exemption, the expiry reminder and expiry, a profiler run, and the answers the
    executor gives a redelivered command."""
    svc = w.svc
    # Within quota: approved by policy (the operators' card says so), allocated.
    first = w.lease()
    w.say(f"status IR-{first}")
    w.say("list mine")
    w.say(f"release IR-{first}")  # the confirmation with its button
    w.run(Op.EXTEND, first, days=2)
    # Beyond quota: the operators' card, approved by an operator; the second host is taken.
    second = w.lease(count=8)
    w.run(Op.APPROVE, second, actor=OPS)
    svc.allocate_waiting("hpc")
    # Two beyond another team's quota: one approved, nothing free, it waits (then is withdrawn); one rejected.
    third = w.lease(count=8, team="vision")
    fourth = w.lease(count=8, team="vision")
    w.run(Op.APPROVE, third, actor=OPS)
    svc.allocate_waiting("hpc")
    assert svc.allocation(third).phase is Phase.WAITING
    w.run(Op.REJECT, fourth, actor=OPS, reason="not this week")
    w.run(Op.DECIDE, fourth)  # decided already, and ended
    # Refused when decided: over the hard limit by then (vision may hold 8 in hpc; the up-front check is skipped).
    request = build_request(
        {"gpu_count": "16", "gpu_model": "H100", "environment": "hpc", "team": "vision", "project": "p"},
        svc.context.farm,
        requester=USER,
        channel=None,
        request_id="links-refused-01",
    )
    refused, _ = svc.create_request(request)
    svc.decide_request(refused.ir)
    svc.decide_request(refused.ir)  # asked again: it has ended
    # Idle: the whole lease, then busy again; its host, then busy again.
    svc.idle_triggered(first, None)
    svc.idle_recovered(first, None)
    svc.idle_triggered(second, IdleScope(hosts=("hpc-1",), kind="idle"))
    svc.idle_recovered(second, IdleScope(hosts=("hpc-1",), kind="idle"))
    svc.idle_triggered(first, IdleScope(hosts=("hpc-0",), kind="idle"))
    # Kept (the one keep allowed); warned again once the keep's hour is over, the next keep is refused.
    w.run(Op.KEEP, first)
    w.clock.advance(hours=2)
    svc.idle_triggered(first, IdleScope(hosts=("hpc-0",), kind="idle"))
    w.run(Op.KEEP, first)
    # An operator exempts it; a keep then has nothing to keep.
    w.run(Op.EXEMPT, first, actor=OPS, days=2, reason="conference deadline")
    w.run(Op.KEEP, first)
    # A profiler run recorded on the lease.
    scope = ProfileScope(run="run-1", summary="5 steps", link="https://pages.example/profiles/ir-1/run-1?sig=0")
    w.run(Op.PROFILE, first, profile=scope.model_dump())
    # The waiting request is withdrawn past its limit; the holder is reminded of the end a day before it.
    w.clock.advance(hours=80)
    svc.expire(third)
    w.reclaim_resolved()
    w.clock.advance(hours=80)
    svc.remind(second)
    # A shared lease of two devices: both idle, one busy again, the other past the grace goes back alone.
    shared = w.lease(count=2, env="slices", model="A100")
    assert svc.allocation(shared).phase is Phase.ALLOCATED
    one, other = (IdleScope(hosts=("slice-0",), devices=(d,), kind="idle") for d in DEVICES)
    svc.idle_triggered(shared, one)
    svc.idle_triggered(shared, other)
    svc.idle_recovered(shared, one)
    w.clock.advance(hours=2)
    svc.idle_triggered(shared, other)
    assert svc.allocation(shared).gpu_count == 1
    # Released by its holder (the executor's answer, then the reclaim's message to both).
    w.run(Op.RELEASE, second)
    w.reclaim_resolved()
    w.run(Op.FORCE_RECLAIM, first, actor=OPS, reason="maintenance")
    w.reclaim_resolved()
    w.clock.advance(days=30)
    svc.expire(shared)
    w.reclaim_resolved()


def test_every_lease_message_carries_its_incident_and_project_dashboard(world: World) -> None:
    _flows(world)
    # Each builder's every message, as it was built, for the lease it was about.
    for key, results in world.spy.seen.items():
        for alloc, message in results:
            assert_linked(alloc, message.blocks, key)
    # Every message kind ran: a builder added without a flow (or without links) fails here.
    assert len(BUILDERS) > 25
    missing = sorted(set(BUILDERS) - set(world.spy.seen))
    assert not missing, f"message kinds no flow of this test produced: {missing}"


def test_every_message_sent_that_names_a_lease_links_to_it(world: World) -> None:
    _flows(world)
    incidents: FakeIncidents = world.svc.context.incidents  # type: ignore[assignment]
    leases = {r.public_id: Allocation.from_record(r) for r in incidents.records.values()}
    checked = 0
    for sent in world.chat.sent:
        if sent.kind not in ("dm", "post", "update", "respond") or sent.text.startswith(":warning:"):
            continue
        # The lease a message is about is the first it names (a card also names the team's other leases); a list
        # names each of its leases first on its row.
        rows = re.findall(r"^• IR-([0-9]+) ", sent.text, re.MULTILINE)
        first = re.search(r"\bIR-([0-9]+)\b", sent.text)
        for ir in {int(n) for n in rows} or ({int(first.group(1))} if first else set()):
            alloc = leases[ir]
            lines = _link_lines(list(sent.blocks), ir)
            assert lines, (sent.kind, sent.text)
            assert all(line == expected_line(alloc) or line.endswith(_row_tail(alloc)) for line in lines), lines
            checked += 1
    assert checked > 40, checked


def _link_lines(blocks: list[Any], ir: int) -> list[str]:
    """The lease's link lines in a message: its links block, or its row of a list."""
    out = [str(b["elements"][0]["text"]) for b in blocks if b.get("block_id") == f"{block_kit.LINKS_BLOCK}:{ir}"]
    for block in blocks:
        text = str((block.get("text") or {}).get("text", ""))
        out += [row for row in text.split("\n") if row.startswith(f"• *IR-{ir}* ")]
    return out


def _row_tail(alloc: Allocation) -> str:
    return f" — {expected_line(alloc)}"


def test_a_list_links_every_lease_and_stays_within_slacks_limits(world: World) -> None:
    fields = {"state": "stable", "phase": "allocated", "team": "nlp", "project": "p", "environment": "hpc"}
    many = [Allocation(incident_id=f"i{n}", ir=n, title="t", **fields) for n in range(900, 0, -1)]  # type: ignore[arg-type]
    message = messages.list_message("All live allocations", many, None, world.svc.context.links_for)
    assert block_errors(message.blocks) == [] and len(message.blocks) == block_kit.MAX_MESSAGE_BLOCKS
    rows = [row for b in message.blocks for row in b["text"]["text"].split("\n") if row.startswith("• ")]
    assert all(row.endswith(_row_tail(a)) for row, a in zip(rows, many, strict=False))
    # Newest first; what does not fit is counted, never cut mid-row.
    last = message.blocks[-1]["text"]["text"].split("\n")[-1]
    assert last.startswith("… and ") and len(rows) + int(last.split()[2]) == 900
    # The fallback text stays one line per lease, without the links.
    assert "/incidents/" not in message.text and message.text.count("\n") == 900


# -- the sandbox opens the link -----------------------------------------------------------------------------------


def test_the_sandbox_opens_a_messages_dashboard_link_at_datadogs_path_with_its_variables() -> None:
    from werkzeug.test import Client

    from gpufarm.setup.dashboards import desired_dashboards
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

    sb = Sandbox()
    client = Client(sb)
    [body] = [d.body for d in desired_dashboards(parse_farm(FARM_YAML)) if d.key == "project"]
    keys = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
    created = client.post("/api/v1/dashboard", json=body, headers=keys)
    assert created.status_code == 200
    listed = client.get("/api/v1/dashboard", headers=keys).get_json()["dashboards"]
    assert dd.marked(listed) == created.get_json()["id"]
    link = Links("http://sandbox.local", project_dashboard=lambda: dd.marked(listed)).dashboard(12, "nlp", "llm-ko")
    page = client.get(link.removeprefix("http://sandbox.local"))
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "gpufarm: project" in text
    assert '<option value="nlp" selected>' in text
    assert 'name="project" value="llm-ko"' in text and 'name="ir" value="ir-12"' in text
    # Datadog's spelling of a variable's first value, and a value that is not a tag value (refused, never run).
    first = client.get(f"/dashboard/{created.get_json()['id']}?tpl_var_ir[0]=ir-3")
    assert first.status_code == 200 and 'name="ir" value="ir-3"' in first.get_data(as_text=True)
    bad = client.get(f"/dashboard/{created.get_json()['id']}?tpl_var_ir=%3Cb%3E")
    assert bad.status_code == 400 and "<b>" not in bad.get_data(as_text=True).split("<body>")[1]
