"""What the holder of an idle lease is told: the warning with Keep and Release, and a lease shrunk or busy again
in part."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from gpufarm.core.chat.amounts import count_amount, gpu_amount, host_amount
from gpufarm.core.chat.block_kit import ACTION_KEEP, Message, actions, button, linked, release_button, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.messages import _what, _when
from gpufarm.core.config.farm import IdleKind, IdlePolicy, PartialIdle
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IdleScope


def idle_warning(
    alloc: Allocation,
    policy: IdlePolicy,
    warned_at: datetime,
    scope: IdleScope | None = None,
    links: Links | None = None,
    *,
    partial: PartialIdle | None = None,
) -> Message:
    """To the requester: which of the lease's GPUs look idle, how, since when, when they go back, and what Keep does.

    Without a scope (an `ir:`-only alert from a hand-made monitor) the whole lease is said to look idle. `partial`
    (the pool's idle.partial) says the idle part is only part of the lease: it alone goes back, or is only warned.
    """
    reclaim_at = warned_at + timedelta(minutes=policy.grace_minutes)
    if partial is PartialIdle.RECLAIM:
        fate = (
            f"*Reclaim:* these GPUs go back to the pool at {_when(reclaim_at)} (the lease's {policy.grace_minutes} "
            "min grace) unless they get busy again or you keep them; the lease keeps its busy hosts. "
            "Release gives the whole lease back now."
        )
    elif partial is PartialIdle.WARN:
        fate = (
            "*Reclaim:* not while the rest of the lease is busy (this pool only warns about a partly idle lease); "
            f"if every host is idle past the {policy.grace_minutes} min grace the whole lease is reclaimed."
        )
    else:
        fate = (
            f"*Reclaim:* at {_when(reclaim_at)} (the lease's {policy.grace_minutes} min grace) unless it gets busy "
            "again or you keep it; Release gives the GPUs back now."
        )
    lines = [
        f":zzz: *{alloc.ir_label}* ({_what(alloc)}) has been idle: {_idle_where(alloc, scope)}.",
        f"*Seen:* {_idle_how(policy, scope)}.",
        fate,
        # The idle monitors re-notify every grace period while a group stays in alert (gpufarm.setup.monitors).
        f"*Keep:* clears this warning; it holds until the monitors see it idle again (within {policy.grace_minutes} "
        "min if the GPUs stay idle).",
    ]
    summary = (
        f"part of {alloc.ir_label} is idle and goes back at {_when(reclaim_at)} unless you keep it"
        if partial is PartialIdle.RECLAIM
        else f"part of {alloc.ir_label} is idle"
        if partial is PartialIdle.WARN
        else f"{alloc.ir_label} is idle and will be reclaimed at {_when(reclaim_at)} unless you keep it"
    )
    message = Message(
        summary,
        [
            section("\n".join(lines)),
            actions(
                f"idle:{alloc.ir}",
                button("Keep", ACTION_KEEP, alloc.ir_label, "primary"),
                release_button(alloc),
            ),
        ],
    )
    return linked(alloc, message, links)


def partly_reclaimed(
    alloc: Allocation, given: Mapping[str, int], hosts_gone: Sequence[str], grace: int, links: Links | None = None
) -> Message:
    """To the requester and the operators: which idle hosts (or devices) left a lease, and what it keeps."""
    parts = _named(f"`{inert(p)}` ({n} GPU{'s' if n != 1 else ''})" for p, n in sorted(given.items()))
    gpus = sum(given.values())
    kept = _named(f"`{inert(h)}` ({host_amount(alloc, h)})" for h in alloc.hosts) or "no host"
    gone = _named(f"`{inert(h)}`" for h in hosts_gone)
    untagged = f" Its `{alloc.ir_tag}` tag is removed from {gone}." if hosts_gone else ""
    text = (
        f":recycle: *{alloc.ir_label}* gave back {parts}: idle past the {grace} min grace while the rest of the lease "
        f"was busy; {gpus} GPU{'s' if gpus != 1 else ''} are back in `{inert(alloc.environment)}`.{untagged}\n"
        f"The lease stays open with {kept}: {gpu_amount(alloc)}, "
        f"until {_when(alloc.expires_at)}."
    )
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


def partly_busy_again(
    alloc: Allocation, cleared: Sequence[str], still_idle: Sequence[str], links: Links | None = None
) -> Message:
    """To the requester: some warned parts are busy again; the warning stands for the rest."""
    text = (
        f"{alloc.ir_label}: {_named(map(inert, cleared))} busy again, its idle warning cleared; "
        f"still idle: {_named(map(inert, still_idle))}."
    )
    return linked(alloc, Message(text, [section(text)]), links)


# The few names a warning lists before it says how many more (a section holds 3000 characters).
_MAX_NAMED = 8


def _idle_where(alloc: Allocation, scope: IdleScope | None) -> str:
    """`host gpu-a-01 (8 GPUs)`, `devices GPU-1234…, …`, or the whole lease when the alert named neither."""
    if scope is not None and scope.devices:
        noun = "device" if len(scope.devices) == 1 else "devices"
        names = _named(f"`{inert(d)}`" for d in scope.devices)
        on = f" on {_named(f'`{inert(h)}`' for h in scope.hosts)}" if scope.hosts else ""
        return f"{noun} {names}{on}"
    if scope is not None and scope.hosts:
        noun = "host" if len(scope.hosts) == 1 else "hosts"
        held = {h.lower(): n for h, n in alloc.host_gpus.items()}
        return f"{noun} " + _named(
            f"`{inert(h)}` ({held[h.lower()]} GPUs)" if held.get(h.lower()) else f"`{inert(h)}`" for h in scope.hosts
        )
    where = f" on {_named(f'`{inert(h)}`' for h in alloc.hosts)}" if alloc.hosts else ""
    return f"the whole lease looks idle ({count_amount(alloc)}{where})"


def _named(items: Iterable[str]) -> str:
    names = list(items)
    shown = ", ".join(names[:_MAX_NAMED])
    return shown + (f" and {len(names) - _MAX_NAMED} more" if len(names) > _MAX_NAMED else "")


def _idle_how(policy: IdlePolicy, scope: IdleScope | None) -> str:
    """The idle kind in words with the measured value and the window: `no process on the GPUs (0 processes...)`."""
    kind = _idle_kind(scope.kind if scope is not None else None)
    window = scope.window_minutes if scope is not None and scope.window_minutes else None
    if window is None and kind is not None:
        window = policy.kinds[kind].window_minutes
    over = f"over the last {window} min" if window else "over the monitor's window"
    value = scope.value if scope is not None else None
    if kind is IdleKind.IDLE:
        measured = f"{value:g} compute processes" if value is not None else "no compute process"
        return f"no process on the GPUs ({measured} {over})"
    if kind is IdleKind.IDLE_HELD:
        return f"memory held but the SMs idle (every sample {over})"
    if kind is IdleKind.LOW_UTILIZATION:
        threshold = policy.kinds[kind].threshold_percent
        below = f"utilisation below {threshold:g} %" if threshold is not None else "low utilisation"
        measured = f"{value:.3g} % mean" if value is not None else "the mean"
        return f"{below} ({measured} {over})"
    measured = f"value {value:g} " if value is not None else ""
    return f"an idle monitor fired ({measured}{over})"


def _idle_kind(name: str | None) -> IdleKind | None:
    try:
        return IdleKind(name) if name else None
    except ValueError:
        return None
