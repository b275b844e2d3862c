"""The App Home tab: what a user holds and waits for, their teams' quota and budget, and for the GPU operators the
queue and the leases warned as idle, as one Block Kit `home` view; pure (gpufarm.core.leases.home reads and
publishes it).

Every lease shows its state, hosts or devices, GPU-hours held, busy share and expiry, with the same Extend, Release
and Keep buttons (the same action ids and values) its messages carry, so a click from the Home tab takes the
existing path: the ingress hands it to the worker, which queues the incident command in the pool's group. Text
from incident fields goes through `inert`; a view holds at most Slack's 100 blocks, so each list is cut at a bound
and says how many more there are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufarm.core.chat.amounts import gpu_amount, host_amount, units_amount
from gpufarm.core.chat.block_kit import (
    ACTION_EXTEND,
    ACTION_KEEP,
    actions,
    button,
    context,
    lease_links,
    release_button,
    section,
)
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.messages import QuotaRow
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.units import lease_devices

MAX_VIEW_BLOCKS = 100
# Leases shown with their buttons (four blocks each); waiting requests and operators' rows are one line each.
MAX_LEASES = 12
MAX_LINES = 15
FIELD_LIMIT = 2000
HOME_ACTIONS = "home"


@dataclass(frozen=True)
class Waiting:
    """A request that holds nothing yet, and why: its queue position, or whose decision it waits for."""

    alloc: Allocation
    reason: str


@dataclass(frozen=True)
class HomeData:
    """Everything one user's Home shows, read by gpufarm.core.leases.home."""

    user: str
    now: datetime
    leases: Sequence[Allocation] = ()
    waiting: Sequence[Waiting] = ()
    quotas: Sequence[QuotaRow] = ()
    budgets: Sequence[str] = ()
    operator: bool = False
    queue: Sequence[Waiting] = ()
    idle_warned: Sequence[Allocation] = ()
    links: Callable[[Allocation], Links] = field(default=lambda _alloc: Links())
    notes: Sequence[str] = ()


def home_view(data: HomeData) -> dict[str, Any]:
    """The `home` view of `views.publish`."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Your GPUs", "emoji": True}},
        context(
            f"{mention(data.user)} · as of {_when(data.now)} · ask with `/gpu request`, "
            "see everything with `/gpu list` and `/gpu status IR-n`"
        ),
    ]
    blocks += _leases(data)
    blocks += _waiting(data.waiting, "Waiting requests", "Nothing waiting.")
    blocks += _team(data)
    if data.operator:
        blocks += _waiting(data.queue, "Queue (all teams)", "Nobody is waiting.")
        blocks += _idle(data)
    blocks += [context(inert(note)) for note in data.notes[:3]]
    if len(blocks) > MAX_VIEW_BLOCKS:
        blocks = [*blocks[: MAX_VIEW_BLOCKS - 1], context("… more than a Home tab holds: see `/gpu list`")]
    return {"type": "home", "callback_id": HOME_ACTIONS, "blocks": blocks}


def _leases(data: HomeData) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "divider"}, section(f"*Live leases* ({len(data.leases)})")]
    if not data.leases:
        return [*out, context("You hold no GPUs now.")]
    for alloc in data.leases[:MAX_LEASES]:
        out += _lease(alloc, data.links(alloc))
    if len(data.leases) > MAX_LEASES:
        out.append(context(f"… and {len(data.leases) - MAX_LEASES} more: `/gpu list mine`"))
    return out


def _lease(alloc: Allocation, links: Links) -> list[dict[str, Any]]:
    head = (
        f"*{alloc.ir_label}* {gpu_amount(alloc)} in `{inert(alloc.environment)}` "
        f"for `{inert(f'{alloc.team}/{alloc.project}')}`"
    )
    fields = [
        _field("State", _state(alloc)),
        _field("Hosts or devices", held_where(alloc)),
        _field("GPU-hours held", f"{alloc.hours_held:,.1f}"),
        _field("Busy share", busy_share(alloc)),
        _field("Expires", _when(alloc.expires_at)),
    ]
    buttons = [button("Extend", ACTION_EXTEND, alloc.ir_label)]
    if alloc.phase is Phase.IDLE_WARNED:
        buttons.append(button("Keep", ACTION_KEEP, alloc.ir_label, "primary"))
    buttons.append(release_button(alloc))
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": head}, "fields": fields},
        actions(f"{HOME_ACTIONS}:{alloc.ir}", *buttons),
        lease_links(alloc, links),
    ]


def _state(alloc: Allocation) -> str:
    if alloc.phase is Phase.IDLE_WARNED:
        since = f" since {_when(alloc.idle_warned_at)}" if alloc.idle_warned_at else ""
        return f":warning: warned as idle{since}: Keep, or it is reclaimed"
    if alloc.kept_until:
        return f"allocated, kept until {_when(alloc.kept_until)}"
    return alloc.phase.value


def held_where(alloc: Allocation) -> str:
    """`hpc-a-01 (8 GPUs)`, or a shared host's units: `k8s-a100-01: 2 x A100 1g.10gb slices (0.1, 0.2)` (the
    words of gpufarm.core.chat.amounts, as every message says them)."""
    devices = lease_devices(alloc)
    parts = []
    for host in alloc.hosts:
        units = devices.get(host, ())
        sliced = units_amount(alloc.gpu_model, units)
        if sliced:
            parts.append(f"`{inert(host)}`: {sliced} ({inert(', '.join(u.label for u in units))})")
        elif units:
            parts.append(f"`{inert(host)}`: GPUs {inert(', '.join(u.label for u in units))}")
        else:
            parts.append(f"`{inert(host)}` ({host_amount(alloc, host)})")
    return "\n".join(parts) or "none yet"


def busy_share(alloc: Allocation) -> str:
    """The share of the measured GPU-hours that were busy; what was not measured is said, never counted idle."""
    measured = alloc.hours_busy + alloc.hours_idle
    unmeasured = f", {alloc.hours_unmeasured:,.1f} h unmeasured" if alloc.hours_unmeasured else ""
    if measured <= 0:
        return "not measured yet" + unmeasured
    return f"{alloc.hours_busy / measured:.0%} of {measured:,.1f} measured h{unmeasured}"


def _waiting(rows: Sequence[Waiting], title: str, empty: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "divider"}, section(f"*{title}* ({len(rows)})")]
    if not rows:
        return [*out, context(empty)]
    lines = [
        f"• *{w.alloc.ir_label}* {gpu_amount(w.alloc)} in `{inert(w.alloc.environment)}` "
        f"for `{inert(f'{w.alloc.team}/{w.alloc.project}')}` {mention(w.alloc.requester)}: {inert(w.reason)}"
        for w in rows[:MAX_LINES]
    ]
    if len(rows) > MAX_LINES:
        lines.append(f"… and {len(rows) - MAX_LINES} more: `/gpu list all`")
    return [*out, section("\n".join(lines))]


def _team(data: HomeData) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "divider"}, section("*Your teams' quota and budget*")]
    lines = [
        f"• `{inert(r.team)}` {inert(r.gpu_model)} in `{inert(r.environment)}`: {r.used} / {r.entitled} GPUs "
        f"(hard limit {r.hard_limit if r.hard_limit is not None else 'pool size'})"
        for r in data.quotas[:MAX_LINES]
    ]
    if len(data.quotas) > MAX_LINES:
        lines.append(f"… and {len(data.quotas) - MAX_LINES} more: `/gpu quota`")
    lines += list(data.budgets)
    if not lines:
        return [*out, context("No team of yours has a quota or a budget.")]
    return [*out, section("\n".join(lines))]


def _idle(data: HomeData) -> list[dict[str, Any]]:
    rows = data.idle_warned
    out: list[dict[str, Any]] = [{"type": "divider"}, section(f"*Warned as idle* ({len(rows)})")]
    if not rows:
        return [*out, context("No lease is warned as idle.")]
    lines = [
        f"• *{a.ir_label}* {gpu_amount(a)} in `{inert(a.environment)}` "
        f"{mention(a.requester)}, warned {_when(a.idle_warned_at)}, keeps used {a.keep_count}"
        for a in rows[:MAX_LINES]
    ]
    if len(rows) > MAX_LINES:
        lines.append(f"… and {len(rows) - MAX_LINES} more")
    return [*out, section("\n".join(lines))]


def _field(name: str, value: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": f"*{name}*\n{value}"[:FIELD_LIMIT]}


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "not set"
