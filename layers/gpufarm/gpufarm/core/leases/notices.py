"""Messages of lease semantics and membership: queue position, withdrawal, the expiry reminder, release confirmation.

Plain Block Kit dicts, as gpufarm.core.chat.messages; kept apart so the lease rules (gpufarm.core.leases.terms) and
their words change together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpufarm.core.chat.amounts import gpu_amount
from gpufarm.core.chat.block_kit import ACTION_EXTEND, Message, actions, button, linked, release_button, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.chat.links import Links
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases.terms import Position


def owner_buttons(alloc: Allocation) -> dict[str, Any]:
    """Extend and a confirmed Release."""
    return actions(f"owner:{alloc.ir}", button("Extend", ACTION_EXTEND, alloc.ir_label), release_button(alloc))


def release_confirm(alloc: Allocation, links: Links | None = None) -> Message:
    """The answer to `/gpu release IR-n`: what would be given back, and the confirmed button that does it."""
    held = f" on {', '.join(f'`{inert(h)}`' for h in alloc.hosts)}" if alloc.hosts else ""
    text = f"Release *{alloc.ir_label}* ({_gpus(alloc)}{held})? Click Release to give the GPUs back."
    message = Message(
        f"Release {alloc.ir_label}? Click Release to confirm.",
        [section(text), actions(f"release:{alloc.ir}", release_button(alloc))],
    )
    return linked(alloc, message, links)


def waiting(alloc: Allocation, position: Position, deadline: datetime | None, links: Links | None = None) -> Message:
    """To the requester: approved, the pool is full; where it stands and how long it may wait."""
    limit = f" If no hosts free by {_when(deadline)} it is withdrawn." if deadline else ""
    text = (
        f":hourglass: *{alloc.ir_label}* is approved but `{inert(alloc.environment)}` has no room for "
        f"{alloc.gpu_count}x {inert(alloc.gpu_model)} right now: it is {inert(position)}. "
        f"Its {_days(alloc.duration_days)} when its hosts are allocated.{limit}"
    )
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


def withdrawn(alloc: Allocation, hours: int, links: Links | None = None) -> Message:
    """To the requester and the operators: a waiting request that got no hosts within its waiting limit."""
    text = (
        f":hourglass_flowing_sand: *{alloc.ir_label}* ({_gpus(alloc)} "
        f"for `{inert(f'{alloc.team}/{alloc.project}')}`) waited {hours} h without `{inert(alloc.environment)}` "
        "freeing room for it and "
        "was withdrawn. It never held a host and nothing was charged; request again, or ask the GPU operators."
    )
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


def expiry_reminder(alloc: Allocation, links: Links | None = None) -> Message:
    """To the holder, once before the end: when the lease ends, with Extend and a confirmed Release."""
    hosts = f" on {', '.join(f'`{inert(h)}`' for h in alloc.hosts)}" if alloc.hosts else ""
    text = (
        f":alarm_clock: *{alloc.ir_label}* ({_gpus(alloc)}{hosts}) "
        f"ends {_when(alloc.expires_at)}. Extend keeps it longer (within the team's limit); Release gives the GPUs "
        "back now. At the end its hosts are reclaimed."
    )
    message = Message(
        f"{alloc.ir_label} ends {_when(alloc.expires_at)}: extend or release it", [section(text), owner_buttons(alloc)]
    )
    return linked(alloc, message, links)


def _gpus(alloc: Allocation) -> str:
    """`8x H100 in `pool`` (or `2 x A100 1g.10gb slices`), its names inert (incident fields may be edited by hand)."""
    return f"{gpu_amount(alloc)} in `{inert(alloc.environment)}`"


def _days(days: int | None) -> str:
    return "1 day starts" if days == 1 else f"{days} days start"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "unknown"
