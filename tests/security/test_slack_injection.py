"""Text from people is inert in Slack (docs/security.md, "Threat model", "Text from people in Slack").

Slack reads `<!channel>`, `<!here>`, `<!everyone>`, `<@U…>`, `<!subteam^S…>` and `<url|words>` in message text as
broadcasts, pings and links whose words hide where they go. Every free-text field a person, a cloud or a hand edit
in Datadog can fill (a request's purpose, reasons for a rejection, a reclaim or an exemption, a profiler run's
summary and link, words typed after a command, and the incident fields project, team, title, pool, hosts,
requester, approver and history) is filled with every token kind, and the flows of every lease message kind run on
the unit fakes: request, the operators' card and its decision, allocation, waiting, status, list, quota, release,
extension, idle warnings whole and partial, keeps and their refusal, exemption, profiler runs, expiry, reclaim, the
digest and `/gpu report`. Every message builder is spied (as tests/unit/test_links.py does), every builder that
takes a lease must have run, and no message built or sent (its text and its blocks, every string in them) holds a
`<…>` token but gpufarm's own: mentions of the ids it checked, its configured user group and channel, and links
under its Datadog base.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat import block_kit, cards, idle_notices, messages
from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.commands import executor
from gpufarm.core.config.digest import DigestSettings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.digest import build as digest_build
from gpufarm.core.governance.policy import build_request
from gpufarm.core.idle import keeps
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import GpufarmError, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op, ProfileScope
from gpufarm.core.leases import notices, profile_runs
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt
from gpufarm.handlers import slack_worker
from gpufarm.handlers.slack_events import Job
from gpufarm.reporting import slack as report_slack

pytestmark = pytest.mark.security

BASE = "https://app.datadoghq.eu"
USER = "U0000000001"
OPS = "U0000000OPS"
OPS_CHANNEL = "C0000000001"
OPS_GROUP = "S0000000001"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
DEVICES = ("gpu-0a1b2c3d-0000-4000-8000-00000000000a", "gpu-0a1b2c3d-0000-4000-8000-00000000000b")
_ids = itertools.count(1)

# Every token kind Slack parses, and text that is already escaped (it must be shown as typed, not unescaped).
TOKENS = (
    "<!channel>",
    "<!here>",
    "<!everyone>",
    "<@U0000000009>",
    "<!subteam^S123>",
    "<#C0000000009>",
    "<http://evil.example/login|Approve in Datadog>",
    "&lt;b&gt;",
)
HOSTILE = " ".join(TOKENS)
# Fields with a tighter bound (a profiler run's summary: 80 characters, one line).
SHORT = "<!channel> <@U0000000009> <http://evil.example/login|Approve>"


# -- the check -----------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"<([^<>]*)>")
# The words of gpufarm's own links (gpufarm.core.chat.links, the cards' and the digest's IR links).
_OWN_WORDS = re.compile(r"^(?:Incident IR-\d+|IR-\d+|Project dashboard|GPU metrics)$")
OWN_MENTIONS = frozenset({f"@{USER}", f"@{OPS}", f"!subteam^{OPS_GROUP}", f"#{OPS_CHANNEL}"})


def strings(value: Any) -> Iterator[str]:
    """Every string in a message: its text, and every string anywhere in its blocks, recursively."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


def foreign_tokens(text: str) -> list[str]:
    """The `<…>` tokens in `text` that gpufarm did not make: anything but its checked mentions and its own links."""
    out = []
    for match in _TOKEN.finditer(text):
        token = match.group(1)
        link, _, words = token.partition("|")
        own_link = link.startswith(f"{BASE}/") and _OWN_WORDS.match(words) is not None
        if token not in OWN_MENTIONS and not own_link:
            out.append(token)
    return out


def assert_inert(text: str, blocks: Any, what: str) -> None:
    """No string of the message opens a token the input supplied; escaped input stays escaped once more."""
    for s in strings([text, blocks]):
        assert foreign_tokens(s) == [], (what, s)
        # `&lt;b&gt;` typed by someone is sent as `&amp;lt;b&amp;gt;`, so Slack shows the characters typed.
        assert "&lt;b&gt;" not in s.replace("&amp;lt;b&amp;gt;", ""), (what, s)


def test_the_helper_escapes_slacks_three_control_characters_and_nothing_else() -> None:
    assert inert("a & b < c > d *e* `f` _g_") == "a &amp; b &lt; c &gt; d *e* `f` _g_"
    assert inert("&lt;") == "&amp;lt;"  # shown as typed: not unescaped by Slack into `<`
    assert foreign_tokens(inert(HOSTILE)) == [] and "<" not in inert(HOSTILE)
    assert inert(None) == "None" and inert(3) == "3"
    assert mention(USER) == f"<@{USER}>" and mention("W0000000001") == "<@W0000000001>"
    for odd in ("<!channel>", "U1> <!here", "dana", "u0000000001", "U0000000001|x"):
        assert "<" not in mention(odd) or mention(odd).startswith("&lt;"), odd
        assert foreign_tokens(mention(odd)) == []
    assert mention(None) == "someone"


# -- the spy -------------------------------------------------------------------------------------------------------

MODULES: tuple[ModuleType, ...] = (messages, notices, cards, keeps, profile_runs, idle_notices, report_slack)


def _builders() -> dict[str, tuple[ModuleType, str]]:
    """Every public or private function of the message modules that returns a Message."""
    out: dict[str, tuple[ModuleType, str]] = {}
    for module in MODULES:
        for name, fn in vars(module).items():
            own = inspect.isfunction(fn) and fn.__module__ == module.__name__
            if own and inspect.signature(fn).return_annotation == "Message":
                out[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = (module, name)
    return out


BUILDERS = _builders()
# The builders about one lease: each must run in the flows below.
LEASE_BUILDERS = frozenset(
    key
    for key, (module, name) in BUILDERS.items()
    if (p := inspect.signature(getattr(module, name)).parameters.get("alloc")) is not None
    and p.annotation == "Allocation"
)


@dataclass
class Spy:
    """Each builder's results as they were built."""

    seen: dict[str, list[block_kit.Message]] = field(default_factory=dict)

    def wrap(self, key: str, fn: Callable[..., block_kit.Message]) -> Callable[..., block_kit.Message]:
        def spied(*args: Any, **kwargs: Any) -> block_kit.Message:
            message = fn(*args, **kwargs)
            self.seen.setdefault(key, []).append(message)
            return message

        return spied


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    clock: FakeClock
    incidents: FakeIncidents
    spy: Spy

    def lease(self, count: int = 8, env: str = "hpc", team: str = "nlp", model: str = "H100") -> int:
        """A request with a hostile purpose, decided (and allocated when granted) at once."""
        values = {
            "gpu_count": str(count),
            "gpu_model": model,
            "environment": env,
            "team": team,
            "project": "p",
            "purpose": HOSTILE,
        }
        request = build_request(
            values, self.svc.context.farm, requester=USER, channel=None, request_id=f"s-{next(_ids):06d}"
        )
        assert executor.request(self.svc.context, request, response_url=URL, origin=request.request_id) is None
        ir = max(a.ir for a in self.svc.context.live())
        self.svc.allocate_waiting(env)
        return ir

    def say(self, text: str, user: str = USER) -> None:
        """A slash command through the Slack worker; its answer is what the worker replies (a command that does
        not parse is answered by the ingress's error message, as slack_ingress answers it)."""
        try:
            command = parse_command(text)
        except ValidationFailed as exc:
            refused = messages.error_message(exc.message)
            self.chat.respond(URL, refused.text, refused.blocks)
            return
        job = Job(kind="command", user=user, response_url=URL, command=command.to_payload())
        try:
            message = slack_worker.dispatch(self.svc, job)
        except GpufarmError as exc:  # as the worker answers a refused command
            message = messages.error_message(rt.describe(exc))
        if message is not None:
            self.chat.respond(URL, message.text, message.blocks)

    def run(self, op: Op, ir: int, actor: str = USER, **extra: Any) -> None:
        """An incident command run twice: once, then as the queue's redelivery (answered from the ledger)."""
        body = {"op": op, "ir": ir, "actor": actor, "response_url": URL, "origin": f"o-{next(_ids)}", **extra}
        cmd = IncidentCommand.model_validate(body)
        executor.execute(self.svc.context, cmd)
        executor.execute(self.svc.context, cmd)

    def reclaim_resolved(self) -> None:
        for a in list(self.incidents.search(IncidentQuery.where({State.RESOLVED}))):
            self.svc.process(a.id)

    def edit(self, ir: int, **values: Any) -> None:
        """Fields of IR-n changed by hand in Datadog, as the next read sees them."""
        for key, record in self.incidents.records.items():
            if record.public_id == ir:
                title = values.pop("title", record.title)
                self.incidents.records[key] = record.model_copy(
                    update={"title": title, "fields": {**record.fields, **values}}
                )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    spy = Spy()
    for key, (module, name) in BUILDERS.items():
        monkeypatch.setattr(module, name, spy.wrap(key, getattr(module, name)))
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    hosts.seed("slice-0", "A100", 8, "slices")
    chat = FakeChat(operators=frozenset({OPS}), usergroup=OPS_GROUP)
    chat.names[USER] = HOSTILE  # a display name is text people choose too
    incidents = FakeIncidents(clock)
    farm = parse_farm(FARM_YAML + "keeps: {max_keeps: 1, keep_hours: 1}\n")
    svc = GpuFarm(
        incidents=incidents,
        hosts=hosts,
        chat=chat,
        clock=clock,
        farm=farm,
        links=Links.for_site("datadoghq.eu", project_dashboard=lambda: "abc-def-ghi"),
    )
    return World(svc, chat, clock, incidents, spy)


# -- the flows -----------------------------------------------------------------------------------------------------


def _decisions(w: World) -> tuple[int, int, int]:
    """Requests decided by policy and by operators, with hostile reasons and words after the commands."""
    svc = w.svc
    first = w.lease()
    w.say(f"status IR-{first}")
    w.say("list mine")
    w.say(f"release IR-{first}")
    w.run(Op.EXTEND, first, days=2)
    second = w.lease(count=8)  # beyond quota: the operators' card, with the purpose quoted
    w.run(Op.APPROVE, second, actor=OPS)
    svc.allocate_waiting("hpc")
    third = w.lease(count=8, team="vision")
    fourth = w.lease(count=8, team="vision")
    w.run(Op.APPROVE, third, actor=OPS)
    svc.allocate_waiting("hpc")
    assert svc.allocation(third).phase is Phase.WAITING
    w.run(Op.REJECT, fourth, actor=OPS, reason=HOSTILE)
    w.run(Op.DECIDE, fourth)
    request = build_request(
        {"gpu_count": "16", "gpu_model": "H100", "environment": "hpc", "team": "vision", "project": "p"},
        svc.context.farm,
        requester=USER,
        channel=None,
        request_id="inj-refused-01",
    )
    refused, _ = svc.create_request(request)
    svc.decide_request(refused.ir)
    svc.decide_request(refused.ir)
    # Words typed after a command reach its error and help texts.
    for typed in (f"status IR-{first} {HOSTILE}", f"status {TOKENS[0]}", f"list team {TOKENS[0]}", f"list {TOKENS[1]}"):
        w.say(typed)
    w.svc.context.chat.respond(URL, *_help(f"frobnicate {HOSTILE}"))
    w.say(f"reject IR-{first} {HOSTILE}")  # a researcher: refused, the reason quoted nowhere raw
    return first, second, third


def _help(unknown: str) -> tuple[str, list[Any]]:
    message = messages.help_message(unknown)
    return message.text, message.blocks


def _idle_and_keeps(w: World, first: int, second: int) -> None:
    svc = w.svc
    svc.idle_triggered(first, None)
    svc.idle_recovered(first, None)
    svc.idle_triggered(second, IdleScope(hosts=("hpc-1",), kind="idle"))
    svc.idle_recovered(second, IdleScope(hosts=("hpc-1",), kind="idle"))
    svc.idle_triggered(first, IdleScope(hosts=("hpc-0",), kind="idle"))
    w.run(Op.KEEP, first)
    w.clock.advance(hours=2)
    svc.idle_triggered(first, IdleScope(hosts=("hpc-0",), kind="idle"))
    w.run(Op.KEEP, first)
    w.run(Op.EXEMPT, first, actor=OPS, days=2, reason=HOSTILE)
    w.run(Op.KEEP, first)
    w.say(f"exempt IR-{first} 2d {HOSTILE}")  # a researcher: refused
    scope = ProfileScope(run="run-1", summary=SHORT, link="https://pages.example/p?a=1&b=<!channel>|Approve>")
    w.run(Op.PROFILE, first, profile=scope.model_dump())
    w.say(f"status IR-{first}")  # the history quotes the exemption's reason and the run


def _endings(w: World, first: int, second: int, third: int) -> None:
    svc = w.svc
    w.clock.advance(hours=80)
    svc.expire(third)
    w.reclaim_resolved()
    w.clock.advance(hours=80)
    svc.remind(second)
    shared = w.lease(count=2, env="slices", model="A100")
    one, other = (IdleScope(hosts=("slice-0",), devices=(d,), kind="idle") for d in DEVICES)
    svc.idle_triggered(shared, one)
    svc.idle_triggered(shared, other)
    svc.idle_recovered(shared, one)
    w.clock.advance(hours=2)
    svc.idle_triggered(shared, other)
    w.say("quota")
    w.run(Op.RELEASE, second)
    w.reclaim_resolved()
    w.run(Op.FORCE_RECLAIM, first, actor=OPS, reason=HOSTILE)
    w.reclaim_resolved()
    w.say(f"status IR-{first}", user=OPS)
    w.clock.advance(days=30)
    svc.expire(shared)
    w.reclaim_resolved()


def _flows(w: World) -> None:
    first, second, third = _decisions(w)
    _idle_and_keeps(w, first, second)
    _endings(w, first, second, third)


def test_every_message_built_or_sent_in_every_flow_is_inert(world: World) -> None:
    _flows(world)
    missing = sorted(LEASE_BUILDERS - set(world.spy.seen))
    assert len(LEASE_BUILDERS) > 25 and not missing, f"builders no flow produced: {missing}"
    built = 0
    for key, results in world.spy.seen.items():
        for message in results:
            assert_inert(message.text, message.blocks, key)
            built += 1
    sent = [s for s in world.chat.sent if s.kind in ("dm", "post", "update", "respond", "ephemeral")]
    for s in sent:
        assert_inert(s.text, s.blocks, f"{s.kind} to {s.target}")
    assert built > 60 and len(sent) > 40, (built, len(sent))
    # The hostile text did reach the messages, shown as typed: the card, the status and the decisions quote it.
    shown = inert(HOSTILE)
    card = [s for s in world.chat.to(OPS_CHANNEL, "post") if "needs approval" in s.text]
    assert card and any(shown in t for s in card for t in strings(s.blocks))
    everything = "\n".join(t for s in sent for t in strings([s.text, s.blocks]))
    for quoted in (
        f">{shown}",
        f"Rejected by <@{OPS}>: {shown}",
        inert(SHORT),
        "&amp;b=&lt;!channel&gt;",
    ):
        assert quoted in everything, quoted
    assert any("exempted IR-" in t and t.endswith(shown) for s in sent for t in strings(s.blocks))


# -- hand-edited incident fields -----------------------------------------------------------------------------------

EDITED = {
    f.PROJECT: HOSTILE,
    f.TEAM: "<!subteam^S123>",
    f.ENVIRONMENT: "<!here>",
    f.GPU_MODEL: "<!everyone>",
    f.PURPOSE: HOSTILE,
    f.HOSTS: ["<!channel>", "hpc-0"],
    f.HOST_GPUS: ["<!channel>=4", "hpc-0=4"],
    f.REQUESTER: "<!channel>",
    f.APPROVED_BY: "U1> <!here",
    f.EXEMPT_BY: "<@U0000000009>",
    "title": f"GPU request {HOSTILE}",
}


def test_fields_edited_by_hand_are_shown_as_data(world: World) -> None:
    held = world.lease()
    asked = world.lease(count=8)  # waits for an operator
    until = isoformat(world.clock.now() + timedelta(hours=3))
    line = f"{isoformat(world.clock.now())} {OPS} exempted: {HOSTILE}"
    for ir in (held, asked):
        history = [
            *world.svc.allocation(ir).history,
            line,
            f"<!channel> {HOSTILE}",
            "2026-01-01T00:00:00Z sync <!here>",
        ]
        world.edit(ir, **EDITED, **{f.EXEMPT_UNTIL: until, f.EXPIRES_AT: until, f.HISTORY: history})
    world.chat.sent.clear()
    for text, user in ((f"status IR-{held}", USER), (f"status IR-{asked}", OPS), ("list all", OPS), ("quota", OPS)):
        world.say(text, user)
    leases = [world.svc.allocation(ir) for ir in (held, asked)]
    facts = digest_build.DigestFacts(
        now=world.clock.now(),
        since=world.clock.now() - timedelta(days=1),
        until=world.clock.now(),
        leases=leases,
        farm=world.svc.context.farm,
        capacity={("<!here>", "<!everyone>"): (1, 2)},
        unattributed={("<!channel>", "<!here>", "<!everyone>"): 2.0},
    )
    digest = digest_build.build(facts, DigestSettings(), world.svc.context.links)
    assert digest is not None
    assert_inert(digest.message.text, digest.message.blocks, "digest")
    # A finished lease whose team and project were edited by hand: the report groups by them.
    start = world.clock.now() - timedelta(days=2)
    world.incidents.create(
        f"GPU request {HOSTILE}",
        {
            f.STATE: "resolved",
            f.PHASE: "reclaimed",
            f.TEAM: "<!subteam^S123>",
            f.PROJECT: HOSTILE,
            f.ENVIRONMENT: "hpc",
            f.GPU_COUNT: "8",
            f.HOST_GPUS: ["node-1=8"],
            f.HOSTS: ["node-1"],
            f.ALLOCATED_AT: isoformat(start),
            f.GPU_HOURS_UNTIL: isoformat(start + timedelta(days=1)),
            f.GPU_HOURS_HELD: "192.000",
            f.GPU_HOURS_BUSY: "96.000",
            f.GPU_HOURS_IDLE: "96.000",
            f.GPU_HOURS_BY_MONTH: [f"{start:%Y-%m}=192.000"],
            f.GPU_HOURS_MONTHS: [f"{start:%Y-%m}"],
            f.RECLAIM_REASON: "released",
        },
    )
    world.say("report", OPS)
    sent = [s for s in world.chat.sent if s.kind in ("dm", "post", "update", "respond", "ephemeral", "file")]
    assert len(sent) >= 5
    for s in sent:
        assert_inert(s.text, s.blocks, f"{s.kind} to {s.target}")
    everything = "\n".join(t for s in sent for t in strings([s.text, s.blocks]))
    assert inert(HOSTILE) in everything and "&lt;!channel&gt;" in everything
    # The report's rows are keyed by the edited team; the digest names the edited project and hosts.
    report = [s for s in sent if s.kind == "respond" and s.text.startswith("GPU report")]
    assert report and "&lt;!subteam^S123&gt;" in str(report[-1].blocks), report
    shown = str(digest.message.blocks)  # its lines are cut at 240 characters: the start of the edited names
    assert "&lt;!subteam^S123&gt;/&lt;!channel&gt; &lt;!here&gt;" in shown and "`&lt;!channel&gt;`" in shown
    # The lease's own links still work: its dashboard link carries the edited names URL-encoded, never raw.
    assert f"<{BASE}/incidents/{held}|Incident IR-{held}>" in everything


def test_gpufarms_own_mentions_and_links_still_work(world: World) -> None:
    world.lease()
    ir = world.lease(count=8)  # beyond quota: the operators decide
    world.run(Op.REJECT, ir, actor=OPS, reason="not this week")
    update = world.chat.to(OPS_CHANNEL, "update")[-1]
    assert update.text.endswith(f"Rejected by <@{OPS}>: not this week")
    dm = [s for s in world.chat.sent if s.kind == "dm"][-1]
    assert f"<@{OPS}>" in dm.text and f"<{BASE}/incidents/{ir}|Incident IR-{ir}>" in str(dm.blocks)
