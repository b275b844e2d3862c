"""What gpufarm tells people in Slack, as plain Block Kit dicts (no Slack SDK here, so the core stays pure): replies
to commands and buttons, notices to the requester, a lease's status, lists and quotas, and the help text."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufarm.core.chat.amounts import gpu_amount, host_amount
from gpufarm.core.chat.block_kit import (
    ACTION_EXTEND,
    MAX_MESSAGE_BLOCKS,
    MAX_SECTION_TEXT,
    Message,
    actions,
    button,
    context,
    linked,
    release_button,
    section,
)
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.replies import HELP as HELP  # noqa: PLC0414
from gpufarm.core.chat.replies import error_text, help_text, working_text
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.hosts import GpuUnit
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.units import cuda_visible_devices, kubernetes_resources, lease_devices, nvml_uuid

POD_LABEL = "gpufarm.io/ir"


# -- building blocks --------------------------------------------------------------------------------


# -- the request modal --------------------------------------------------------------------------------


# -- messages ------------------------------------------------------------------------------------------


def _what(alloc: Allocation) -> str:
    """`8x H100 in `pool` for `team/project``, every name inert (incident fields may be edited by hand)."""
    where, owner = inert(alloc.environment), inert(f"{alloc.team}/{alloc.project}")
    return f"{gpu_amount(alloc)} in `{where}` for `{owner}`"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "unknown"


def help_message(unknown: str | None = None) -> Message:
    """The help text; names the word that was not understood. Inert as a whole: its `<reason>` is a placeholder,
    not a link, and the word is what someone typed."""
    text = help_text(unknown)
    return Message(text, [section(text)])


def error_message(text: str) -> Message:
    """A user error, said plainly; inert as a whole (errors quote what people typed and carry no markup)."""
    line = error_text(text)
    return Message(line, [section(line)])


def approved_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To the operator who approved (and to a redelivery of that approval)."""
    if alloc.is_quota_override:
        return linked(alloc, Message(f"{alloc.ir_label} approved; the quota change is in effect."), links)
    return linked(alloc, Message(f"{alloc.ir_label} approved; allocating hosts now."), links)


def rejected_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To the operator who rejected (and to a redelivery of that rejection)."""
    return linked(alloc, Message(f"{alloc.ir_label} rejected."), links)


def releasing_reply(alloc: Allocation, reason: str | None, links: Links | None = None) -> Message:
    """To whoever released or reclaimed: the incident is resolved, the webhook frees the hosts."""
    why = f" ({inert(reason)})" if reason else ""
    return linked(alloc, Message(f"{alloc.ir_label} is being released{why}; its hosts are freed shortly."), links)


def lease_note(alloc: Allocation, text: str, links: Links | None = None) -> Message:
    """A one-line answer or notice about a lease ('IR-n extended ...', 'IR-n is busy again ...'), with its links."""
    return linked(alloc, Message(text), links)


def ended_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To an action on a lease that has ended: what it ended as."""
    return lease_note(alloc, f"{alloc.ir_label} has ended ({alloc.phase.value}).", links)


def busy_again(alloc: Allocation, links: Links | None = None) -> Message:
    """To the requester: the lease's GPUs are busy again, its idle warning cleared."""
    return lease_note(alloc, f"{alloc.ir_label} is busy again; the idle warning is cleared.", links)


def extended_reply(alloc: Allocation, days: int | None, links: Links | None = None) -> Message:
    """To whoever extended a lease (and, without the days, to a redelivery of that extension)."""
    ends = isoformat(alloc.expires_at) if alloc.expires_at else "later"
    by = f" by {days} days" if days else ""
    return lease_note(alloc, f"{alloc.ir_label} extended{by}; it now ends {ends}.", links)


def policy_refused(alloc: Allocation, reason: str, links: Links | None = None) -> Message:
    """To the requester: a request the policy refused when it was decided; its incident is closed."""
    text = f":no_entry: {alloc.ir_label} refused: {inert(reason)}. The request is closed; nothing was allocated."
    return linked(alloc, Message(text, [section(text)]), links)


def working(text: str) -> Message:
    """The immediate ack while the worker does the slow part."""
    return Message(working_text(text))


def request_created(alloc: Allocation, *, approved: bool, reason: str, links: Links | None = None) -> Message:
    """To the requester: the IR number and what happens next."""
    nxt = "Approved by policy; allocating hosts now." if approved else "Sent to the GPU operators for approval."
    text = f"*{alloc.ir_label}* created: {_what(alloc)}, {alloc.duration_days} days. {nxt}"
    return linked(alloc, Message(text.replace("*", ""), [section(text), context(inert(reason))]), links)


def refused(reason: str) -> Message:
    """To the requester: a request over a hard limit, not created."""
    text = f":no_entry: Request refused: {inert(reason)}. Nothing was created."
    return Message(text, [section(text)])


def approved_notice(alloc: Allocation, operator: str, links: Links | None = None) -> Message:
    """To the requester: an operator approved."""
    text = f"*{alloc.ir_label}* was approved by {mention(operator)}; allocating hosts now."
    return linked(alloc, Message(text.replace("*", ""), [section(text)]), links)


def rejected_notice(alloc: Allocation, operator: str, reason: str | None, links: Links | None = None) -> Message:
    """To the requester: an operator rejected."""
    text = f":x: *{alloc.ir_label}* ({_what(alloc)}) was rejected by {mention(operator)}"
    text += f": {inert(reason)}" if reason else "."
    return linked(alloc, Message(text.replace("*", ""), [section(text)]), links)


def allocated(alloc: Allocation, links: Links | None = None, submit: str | None = None) -> Message:
    """To the requester: which hosts, how to carry the IR in code and, on an enforced pool, how to `submit`."""
    hosts = "\n".join(f"• `{inert(h)}` ({host_amount(alloc, h)}){_units_of(alloc, h)}" for h in alloc.hosts)
    text = (
        f":white_check_mark: *{alloc.ir_label}* is allocated: {_what(alloc)}, until {_when(alloc.expires_at)}.\n"
        f"{hosts}\n"
        f"Carry the IR in your jobs so usage is attributed: `export GPUFARM_IR={alloc.ir_label}` "
        f"or the pod label `{POD_LABEL}: {alloc.ir_tag.split(':', 1)[1]}`.\n"
        # The hint, never the token: this DM may be forwarded or read over a shoulder; the token comes ephemeral.
        f"To upload profiler runs, get a token with `/gpu profile-token {alloc.ir_label}`."
        + (f"\n{submit}" if submit else "")
    )
    devices = lease_devices(alloc)
    use = inert("; ".join(f"{h}: CUDA_VISIBLE_DEVICES={cuda_visible_devices(u)}" for h, u in devices.items()))
    message = Message(
        f"{alloc.ir_label} is allocated on {inert(', '.join(alloc.hosts))}. Use GPUFARM_IR={alloc.ir_label}"
        + (f" ({use})"[:1000] if use else ""),
        [section(text), _owner_buttons(alloc)],
    )
    return linked(alloc, message, links)


# The units a message names one by one on a host before it says how many more (a section holds 3000 characters).
_MAX_UNITS_NAMED = 14


def _units_of(alloc: Allocation, host: str) -> str:
    """`: MIG slices 0.1, 0.2 (1g.10gb)` and how to use them (CUDA_VISIBLE_DEVICES, the Kubernetes resource)."""
    units = lease_devices(alloc).get(host, ())
    if not units:
        return ""
    shown, more = units[:_MAX_UNITS_NAMED], len(units) - _MAX_UNITS_NAMED
    rest = f" and {more} more (the incident's GPU devices field lists them all)" if more > 0 else ""
    what = _units_named(shown)
    # The Kubernetes resources count every unit the lease holds there, not only the ones named.
    resources = ", ".join(f"`{inert(name)}: {n}`" for name, n in kubernetes_resources(units).items())
    kube = f" · Kubernetes: {resources}" if resources else ""
    return f": {what}{rest}\n   `CUDA_VISIBLE_DEVICES={inert(cuda_visible_devices(shown))}`{kube}"


def _units_named(shown: Sequence[GpuUnit]) -> str:
    """`MIG slices 0.1, 0.2 (1g.10gb), UUIDs …; GPUs 1` for a host with slices, else `GPUs 0, 1`."""
    slices = [u for u in shown if u.is_mig]
    if not slices:
        return f"GPU{'s' if len(shown) != 1 else ''} {inert(', '.join(u.label for u in shown))}"
    what = _slices_named(slices)
    whole = [u for u in shown if not u.is_mig]
    if whole:
        what += f"; GPUs {inert(', '.join(u.label for u in whole))}"
    return what


def _slices_named(slices: Sequence[GpuUnit]) -> str:
    """`MIG slices 0.1, 0.2 (1g.10gb), UUIDs …`: the labels, their profiles once each, and the NVML uuids to use."""
    profiles = inert(", ".join(sorted({u.profile or "?" for u in slices})))
    uuids = ", ".join(f"`{inert(nvml_uuid(u.uuid))}`" for u in slices if u.uuid)
    return f"MIG slices {inert(', '.join(u.label for u in slices))} ({profiles}), UUIDs {uuids}"


def reclaimed(alloc: Allocation, reason: str, hosts: Sequence[str], links: Links | None = None) -> Message:
    """To the requester and the operators: the GPUs are back in the pool."""
    where = f" from {', '.join(f'`{inert(h)}`' for h in hosts)}" if hosts else ""
    text = f":recycle: *{alloc.ir_label}* ({_what(alloc)}) was reclaimed{where}: {inert(reason)}."
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


def _lease_span(alloc: Allocation) -> str:
    """`7 days from <allocation>, expires <end>`, or, while it waits for hosts, that its days have not started."""
    if alloc.phase.value in ("approved", "waiting"):
        since = f", waiting since {_when(alloc.waiting_since)}" if alloc.waiting_since else ""
        return f"{alloc.duration_days} days from when its hosts are allocated{since}"
    start = f" from {_when(alloc.allocated_at)}" if alloc.allocated_at else ""
    return f"{alloc.duration_days} days{start}, expires {_when(alloc.expires_at)}"


def status_message(alloc: Allocation, links: Links | None = None, submit: str | None = None) -> Message:
    """One allocation in detail; while it holds hosts on an enforced pool, how to `submit` into them."""
    lines = [
        f"*{alloc.ir_label}* — {inert(alloc.title)}",
        f"Phase: `{alloc.phase.value}` (incident {alloc.state.value}); requester {mention(alloc.requester)}",
        f"{_what(alloc)}, {_lease_span(alloc)}",
    ]
    if alloc.hosts:
        lines.append("Hosts: " + ", ".join(f"`{inert(h)}` ({alloc.host_gpus.get(h, 0)})" for h in alloc.hosts))
        lines += [f"`{inert(h)}`:{_units_of(alloc, h).removeprefix(':')}" for h in lease_devices(alloc)]
    lines += _holding(alloc, [submit] if submit else [])
    lines += _decided(alloc) + _held_off(alloc)
    if alloc.purpose:
        lines.append(f">{inert(alloc.purpose)}")
    text = "\n".join(lines)
    blocks = [section(text)]
    trail = history_lines(alloc)
    blocks.extend(section(chunk) for chunk in _chunks(trail, MAX_SECTION_TEXT - 100, MAX_MESSAGE_BLOCKS - 3))
    if alloc.phase.value in ("allocated", "idle-warned"):
        blocks.append(_owner_buttons(alloc))
    full = "\n".join([text, *trail])
    return linked(alloc, Message(full.replace("*", ""), blocks), links)


def _decided(alloc: Allocation) -> list[str]:
    """Who approved it, why it ended, and the reason on record."""
    lines = []
    if alloc.approved_by:
        who = "policy" if alloc.approved_by == "policy" else mention(alloc.approved_by)
        lines.append(f"Approved by {who}")
    if alloc.reclaim_reason:
        lines.append(f"Reclaim reason: {alloc.reclaim_reason.value}")
    why = reason_trail.latest(alloc)
    if why is not None:
        lines.append(f"Why: {inert(why.line())} (`/gpu why {alloc.ir_label}` explains it now)")
    return lines


def _held_off(alloc: Allocation) -> list[str]:
    """The keeps used and an operator's exemption from idle reclaim."""
    lines = []
    if alloc.keep_count:
        held = f", idle reclaim held off until {_when(alloc.kept_until)}" if alloc.kept_until else ""
        lines.append(f"Keeps used: {alloc.keep_count}{held}")
    if alloc.exempt_until:
        by = f" (granted by {mention(alloc.exempt_by)})" if alloc.exempt_by else ""
        lines.append(f"Exempt from idle reclaim until {_when(alloc.exempt_until)}{by}")
    return lines


def _holding(alloc: Allocation, lines: list[str]) -> list[str]:
    """`lines` while the lease holds its hosts, else none (how to submit says nothing once it has ended)."""
    return lines if alloc.phase.value in ("allocated", "idle-warned") else []


def history_lines(alloc: Allocation) -> list[str]:
    """`History (n entries):` and one line per step, oldest first, as `/gpu status` prints them."""
    if not alloc.history:
        return []
    return [
        f"*History* ({len(alloc.history)} entries):",
        *(f"• {line}" for line in history.shown(alloc.history, inert, mention)),
    ]


def _chunks(lines: Sequence[str], limit: int, most: int) -> list[str]:
    """Lines packed into at most `most` texts of at most `limit` characters (the oldest dropped, said so)."""
    out: list[str] = []
    current: list[str] = []
    for line in lines:
        if current and sum(len(x) + 1 for x in current) + len(line) > limit:
            out.append("\n".join(current))
            current = []
        current.append(line[:limit])
    if current:
        out.append("\n".join(current))
    if len(out) > most:
        note = f"({len(out) - most + 1} sections of older entries are in the incident's history field)"
        out = [note, *out[-most + 1 :]]
    return out


def list_message(
    title: str,
    allocations: Sequence[Allocation],
    positions: Mapping[int, object] | None = None,
    links: Callable[[Allocation], Links] | None = None,
    hidden: int = 0,
) -> Message:
    """Allocations, one line each, newest first, each with its links; a waiting one says where it stands in its
    queue (`positions`). `links` gives each lease's links (its pool's, gpufarm.core.chat.links). `hidden` counts
    the leases of other teams the asker may not see (gpufarm.core.governance.visibility): counted, never shown."""
    others = f" ({hidden} more of other teams, shown to their members and the GPU operators)" if hidden else ""
    if not allocations:
        return Message(f"{inert(title)}: none.{others}", [section(f"*{inert(title)}*: none.{others}")])
    places = positions or {}
    rows = [
        f"• *{a.ir_label}* `{a.phase.value}` {gpu_amount(a)} `{inert(a.environment)}` "
        f"{inert(f'{a.team}/{a.project}')} {mention(a.requester)}"
        + (f" on {inert(', '.join(a.hosts))}" if a.hosts else "")
        + (f" ({inert(places[a.ir])})" if a.ir in places else "")
        for a in allocations
    ]
    head = f"*{inert(title)}* ({len(allocations)}){others}"
    # The links go in the blocks only: the fallback text (notifications) stays one short line per lease.
    linked_rows = [
        f"{row} — {(links(a) if links else Links()).line(a.ir, a.team, a.project)}"
        for row, a in zip(rows, allocations, strict=True)
    ]
    text = head + "\n" + "\n".join(rows)
    return Message(text.replace("*", "").replace("`", ""), [section(t) for t in _packed(head, linked_rows)])


def _packed(head: str, rows: Sequence[str]) -> list[str]:
    """The head and rows in at most MAX_MESSAGE_BLOCKS sections of whole rows; rows past those are counted."""
    out: list[str] = []
    current = [head]
    for i, row in enumerate(rows):
        if sum(len(x) + 1 for x in current) + len(row) > MAX_SECTION_TEXT - 100:
            if len(out) == MAX_MESSAGE_BLOCKS - 1:
                current.append(f"… and {len(rows) - i} more (narrow it: `/gpu list mine`, `/gpu list team <name>`)")
                break
            out.append("\n".join(current))
            current = []
        current.append(row[: MAX_SECTION_TEXT - 100])
    out.append("\n".join(current))
    return out


@dataclass(frozen=True)
class QuotaRow:
    """One line of `/gpu quota`."""

    team: str
    environment: str
    gpu_model: str
    entitled: int
    hard_limit: int | None
    used: int


def quota_message(
    rows: Iterable[QuotaRow], inventory: Mapping[tuple[str, str], tuple[int, int]], ledger: Sequence[str] = ()
) -> Message:
    """Quotas and use per team, plus free/total GPUs per pool and model, then the ledger's lines."""
    lines = ["*Quotas* (used / quota, hard limit)"]
    for r in rows:
        hard = str(r.hard_limit) if r.hard_limit is not None else "pool size"
        lines.append(
            f"• `{inert(r.team)}` {inert(r.gpu_model)} in `{inert(r.environment)}`: "
            f"{r.used} / {r.entitled} (hard {hard})"
        )
    if len(lines) == 1:
        lines.append("• no quotas configured")
    lines.append("*Pools* (free / total GPUs)")
    for (env, model), (free, total) in sorted(inventory.items()):
        lines.append(f"• `{inert(env)}` {inert(model)}: {free} / {total}")
    lines += ledger
    text = "\n".join(lines)
    return Message("GPU quotas", [section(text)])


def _owner_buttons(alloc: Allocation) -> dict[str, Any]:
    return actions(
        f"owner:{alloc.ir}",
        button("Extend", ACTION_EXTEND, alloc.ir_label),
        release_button(alloc),
    )
