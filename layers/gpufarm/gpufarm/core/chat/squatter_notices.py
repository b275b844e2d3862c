"""What the operators and a lease's holder are told about a squatter: once when an episode starts, when its
squatter is stopped, and (to the operators) when a device no lease holds is squatted. Every name in them came from
a host or a process (a process's user, a pod's name, a host name) and is made inert (gpufarm.core.chat.escape)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpufarm.core.chat.block_kit import Message, section
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.messages import _what, _when
from gpufarm.core.kernel.model import Allocation

# At most this many squatters are named in one post; the rest are counted.
MAX_NAMED = 5


@dataclass(frozen=True)
class SquatterSeen:
    """One squatting process (or pod) as the node agent's `gpufarm.process.squatter` series names it."""

    pid: str | None = None
    user: str | None = None
    claimed_ir: str | None = None
    pod: str | None = None  # `namespace/name`

    def describe(self) -> str:
        """`pid 4242 (user bob, claims ir-7)` or `pod ns/name (claims none)`, every value inert."""
        what = f"pod `{inert(self.pod)}`" if self.pod else f"pid {inert(self.pid)}" if self.pid else "a process"
        how = [f"user `{inert(self.user)}`" if self.user else "", f"claims `{inert(self.claimed_ir or 'none')}`"]
        return f"{what} ({', '.join(h for h in how if h)})"


@dataclass(frozen=True)
class SquatterFacts:
    """What a squatter post says: where, since when, who (as far as the series say), and the stop it faces."""

    host: str
    device: str
    since: datetime
    seen: Sequence[SquatterSeen] = ()
    count: int | None = None  # the monitor's value: how many squatters the device has
    stop_at: datetime | None = None  # stop-after: when the squatter is stopped; None: report only
    exempt: bool = False  # the host is exempt from stops (gpufarm_exempt:squatters)


# How the host's agent stops a squatter (gpufarm_node.squatter_stops; a pod through the Kubernetes step's eviction).
HOW = "SIGTERM to a process, eviction of a pod"


def _who(facts: SquatterFacts) -> str:
    named = [s.describe() for s in facts.seen[:MAX_NAMED]]
    total = max(len(facts.seen), facts.count or 0)
    more = total - len(named)
    if not named:
        return f"{total} process(es)" if total else "a process of no lease"
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _where(facts: SquatterFacts, links: Links | None) -> str:
    host = inert(facts.host)
    shown = f"<{links.host(facts.host)}|{host}>" if links is not None else f"`{host}`"
    return f"{shown} device `{inert(facts.device)}`"


def _fate(facts: SquatterFacts) -> str:
    if facts.exempt:
        return "*Stop:* none: an operator exempted this host from squatter stops."
    if facts.stop_at is None:
        return "*Stop:* none: this pool only reports squatters."
    return f"*Stop:* it will be stopped ({HOW}) at {_when(facts.stop_at)} unless it ends before."


def squatter_to_operators(alloc: Allocation | None, facts: SquatterFacts, links: Links | None = None) -> Message:
    """The operators' post of a new episode: on a lease's device (the lease named), or on a device no lease holds."""
    lease = (
        f"*{alloc.ir_label}* ({_what(alloc)}, held by {mention(alloc.requester)})"
        if alloc is not None and alloc.requester
        else f"*{alloc.ir_label}*"
        if alloc is not None
        else "no lease"
    )
    lines = [
        f":rotating_light: Squatter on {_where(facts, links)}, a device of {lease}.",
        f"*Who:* {_who(facts)}.",
        f"*Since:* {_when(facts.since)}.",
        _fate(facts),
    ]
    if alloc is not None and links is not None:
        lines.append(links.line(alloc.ir, alloc.team, alloc.project))
    text = f"squatter on {inert(facts.host)} device {inert(facts.device)} ({alloc.ir_label if alloc else 'no lease'})"
    return Message(text=text, blocks=[section("\n".join(lines))])


def squatter_to_holder(alloc: Allocation, facts: SquatterFacts, links: Links | None = None) -> Message:
    """The holder's DM of a new episode: someone else runs on a device of their lease."""
    lines = [
        f":rotating_light: Something not of *{alloc.ir_label}* ({_what(alloc)}) runs on {_where(facts, links)}.",
        f"*Who:* {_who(facts)}.",
        f"*Since:* {_when(facts.since)}. The GPU operators are told too.",
        _fate(facts),
    ]
    if links is not None:
        lines.append(links.line(alloc.ir, alloc.team, alloc.project))
    text = f"a squatter runs on {inert(facts.host)}, a host of {alloc.ir_label}"
    return Message(text=text, blocks=[section("\n".join(lines))])


def squatter_stopped(
    alloc: Allocation, facts: SquatterFacts, grace_minutes: int, links: Links | None = None
) -> Message:
    """To the operators and the holder: the squatter outlasted the grace and its stop was published on the host."""
    lines = [
        f":octagonal_sign: The squatter on {_where(facts, links)} ({alloc.ir_label}) ran past its {grace_minutes} min "
        f"grace: gpufarm asked the host's agent to stop it ({HOW}) at {_when(facts.stop_at)}.",
        f"*Who:* {_who(facts)}.",
    ]
    if links is not None:
        lines.append(links.line(alloc.ir, alloc.team, alloc.project))
    text = f"stopping the squatter on {inert(facts.host)} ({alloc.ir_label})"
    return Message(text=text, blocks=[section("\n".join(lines))])
