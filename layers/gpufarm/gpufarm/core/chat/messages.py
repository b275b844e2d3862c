"""Slack messages and the request modal as plain Block Kit dicts (no Slack SDK here, so the core stays pure)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufarm.core.chat.links import Links
from gpufarm.core.config.farm import FarmConfig, IdleKind, IdlePolicy, PartialIdle, PoolKind
from gpufarm.core.kernel import history
from gpufarm.core.kernel.model import MAX_GPU_COUNT, MAX_PURPOSE, Allocation, isoformat
from gpufarm.core.kernel.serial import IdleScope
from gpufarm.core.kernel.units import cuda_visible_devices, kubernetes_resources, lease_devices, nvml_uuid

REQUEST_CALLBACK = "gpu_request"
# Block ids of the modal's inputs; they match the request field names so a ValidationFailed(field) maps to a block.
FORM_BLOCKS = ("gpu_model", "gpu_count", "environment", "team", "project", "duration_days", "purpose")

ACTION_APPROVE = "gpu_approve"
ACTION_REJECT = "gpu_reject"
ACTION_RELEASE = "gpu_release"
ACTION_EXTEND = "gpu_extend"
ACTION_KEEP = "gpu_keep"
# Operators' buttons that open a reason form first (gpufarm.core.chat.reason_form), as Reject does.
ACTION_RECLAIM = "gpu_reclaim"
ACTION_EXEMPT = "gpu_exempt"
ACTIONS = (ACTION_APPROVE, ACTION_REJECT, ACTION_RELEASE, ACTION_EXTEND, ACTION_KEEP, ACTION_RECLAIM, ACTION_EXEMPT)

MAX_MESSAGE_BLOCKS = 50
MAX_SECTION_TEXT = 3000
POD_LABEL = "gpufarm.io/ir"

HELP = """*`/gpu` — GPUs from the farm, tracked as Datadog incidents*
• `/gpu request` opens a form; or inline:
  `/gpu request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="fine-tune"`
• `/gpu list [mine | team [name] | all]` — allocations
• `/gpu status IR-123` — one allocation, its hosts, expiry and history
• `/gpu release IR-123 [now]` — give the GPUs back (a Release button confirms it unless `now`)
• `/gpu extend IR-123 [days]` — keep them longer
• `/gpu quota [team]` — quotas and what is in use
• `/gpu report [team | project]` — the last 30 days' GPU-hours (held, busy, idle), the CSV by DM
Operators: `/gpu approve IR-123`, `/gpu reject IR-123 <reason>`, `/gpu reclaim IR-123 <reason>`,
`/gpu exempt IR-123 3d <reason>` (no idle reclaim until then)."""


@dataclass(frozen=True)
class Message:
    """A Slack message: fallback text plus optional blocks."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        """Keyword arguments for chat.postMessage / response_url."""
        out: dict[str, Any] = {"text": self.text}
        if self.blocks:
            out["blocks"] = self.blocks
        return out


# -- building blocks --------------------------------------------------------------------------------


def section(text: str) -> dict[str, Any]:
    """A mrkdwn section, cut to Slack's 3000-character limit."""
    if len(text) > MAX_SECTION_TEXT:
        text = text[: MAX_SECTION_TEXT - 2] + " …"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def context(text: str) -> dict[str, Any]:
    """A small grey line."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:MAX_SECTION_TEXT]}]}


def button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    """A button whose value carries the IR."""
    out: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "action_id": action_id,
        "value": value,
    }
    if style:
        out["style"] = style
    return out


def actions(block_id: str, *buttons: dict[str, Any]) -> dict[str, Any]:
    """A row of buttons."""
    return {"type": "actions", "block_id": block_id, "elements": list(buttons)}


def release_button(alloc: Allocation) -> dict[str, Any]:
    """A Release button Slack confirms (a Block Kit confirmation dialog) before the click is sent."""
    out = button("Release", ACTION_RELEASE, alloc.ir_label, "danger")
    out["confirm"] = {
        "title": _plain(f"Release {alloc.ir_label}?"),
        "text": {
            "type": "mrkdwn",
            "text": f"The GPUs of *{alloc.ir_label}* go back to the pool now; jobs still running on them lose them.",
        },
        "confirm": _plain("Release"),
        "deny": _plain("Keep them"),
        "style": "danger",
    }
    return out


LINKS_BLOCK = "lease-links"


def lease_links(alloc: Allocation, links: Links | None = None) -> dict[str, Any]:
    """The line every message about a lease carries: its incident and its project dashboard
    (gpufarm.core.chat.links)."""
    block = context((links or Links()).line(alloc.ir, alloc.team, alloc.project))
    block["block_id"] = f"{LINKS_BLOCK}:{alloc.ir}"
    return block


def linked(alloc: Allocation, message: Message, links: Links | None = None) -> Message:
    """`message` with the lease's links: before its buttons, else last (a text-only message gets its text shown).

    A message that already carries the lease's links is returned as it is.
    """
    block_id = f"{LINKS_BLOCK}:{alloc.ir}"
    blocks = list(message.blocks) or [section(message.text)]
    if any(b.get("block_id") == block_id for b in blocks):
        return message
    at = len(blocks)
    while at > 0 and blocks[at - 1].get("type") == "actions":
        at -= 1
    if len(blocks) >= MAX_MESSAGE_BLOCKS:
        # Slack takes 50 blocks: the links take the place of the last block before the buttons.
        blocks.pop(at - 1)
        at -= 1
    return Message(message.text, [*blocks[:at], lease_links(alloc, links), *blocks[at:]])


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text[:75], "emoji": True}


def _option(value: str, text: str) -> dict[str, Any]:
    return {"text": _plain(text), "value": value}


# -- the request modal --------------------------------------------------------------------------------


def request_modal(farm: FarmConfig, *, channel: str | None, initial: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The request form; private_metadata keeps the channel the command came from."""
    init = dict(initial or {})
    models = [_option(name, f"{name} {spec.description}".strip()) for name, spec in sorted(farm.gpu_models.items())]
    envs = [
        _option(name, f"{name} ({'shared slices' if env.kind is PoolKind.SHARED else 'whole hosts'})")
        for name, env in sorted(farm.environments.items())
    ]
    teams = [_option(name, name) for name in sorted(farm.teams)]
    max_days = max((t.max_days for t in farm.teams.values()), default=farm.defaults.duration_days)
    return {
        "type": "modal",
        "callback_id": REQUEST_CALLBACK,
        "title": _plain("Request GPUs"),
        "submit": _plain("Request"),
        "close": _plain("Cancel"),
        "notify_on_close": True,
        "private_metadata": json.dumps({"channel": channel} if channel else {}),
        "blocks": [
            _select("gpu_model", "GPU model", models, init.get("gpu_model")),
            _number("gpu_count", "How many GPUs", 1, MAX_GPU_COUNT, init.get("gpu_count")),
            _select("environment", "Environment", envs, init.get("environment")),
            _select("team", "Team", teams, init.get("team")),
            _text_input("project", "Project", 63, init.get("project"), placeholder="llm-ko"),
            _number(
                "duration_days", "Days", 1, max_days, init.get("duration_days") or str(farm.defaults.duration_days)
            ),
            _text_input("purpose", "Purpose", MAX_PURPOSE, init.get("purpose"), multiline=True, optional=True),
        ],
    }


def _select(block_id: str, label: str, options: list[dict[str, Any]], initial: str | None) -> dict[str, Any]:
    element: dict[str, Any] = {"type": "static_select", "action_id": block_id, "options": options[:100]}
    chosen = next((o for o in options if o["value"] == initial), None)
    if chosen is not None:
        element["initial_option"] = chosen
    return {"type": "input", "block_id": block_id, "label": _plain(label), "element": element}


def _number(block_id: str, label: str, low: int, high: int, initial: str | None) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "number_input",
        "action_id": block_id,
        "is_decimal_allowed": False,
        "min_value": str(low),
        "max_value": str(high),
    }
    if initial:
        element["initial_value"] = initial
    return {"type": "input", "block_id": block_id, "label": _plain(label), "element": element}


def _text_input(
    block_id: str,
    label: str,
    max_length: int,
    initial: str | None,
    *,
    multiline: bool = False,
    optional: bool = False,
    placeholder: str | None = None,
) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "plain_text_input",
        "action_id": block_id,
        "max_length": max_length,
        "multiline": multiline,
    }
    if initial:
        element["initial_value"] = initial
    if placeholder:
        element["placeholder"] = _plain(placeholder)
    return {"type": "input", "block_id": block_id, "label": _plain(label), "optional": optional, "element": element}


def form_values(state_values: Mapping[str, Any]) -> dict[str, str | None]:
    """Read the modal's `view.state.values` into raw strings per field (selects give their option value)."""
    out: dict[str, str | None] = {}
    for block_id in FORM_BLOCKS:
        block = state_values.get(block_id)
        element = block.get(block_id) if isinstance(block, Mapping) else None
        if not isinstance(element, Mapping):
            out[block_id] = None
            continue
        selected = element.get("selected_option")
        value = selected.get("value") if isinstance(selected, Mapping) else element.get("value")
        out[block_id] = value if isinstance(value, str) else None
    return out


# -- messages ------------------------------------------------------------------------------------------


def _what(alloc: Allocation) -> str:
    return f"{alloc.gpu_count}x {alloc.gpu_model} in `{alloc.environment}` for `{alloc.team}/{alloc.project}`"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "unknown"


def help_message(unknown: str | None = None) -> Message:
    """The help text; names the word that was not understood."""
    lead = f"I don't know `/gpu {unknown}`.\n" if unknown else ""
    return Message(lead + HELP, [section(lead + HELP)])


def error_message(text: str) -> Message:
    """A user error, said plainly."""
    return Message(f":warning: {text}", [section(f":warning: {text}")])


def approved_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To the operator who approved (and to a redelivery of that approval)."""
    return linked(alloc, Message(f"{alloc.ir_label} approved; allocating hosts now."), links)


def rejected_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To the operator who rejected (and to a redelivery of that rejection)."""
    return linked(alloc, Message(f"{alloc.ir_label} rejected."), links)


def releasing_reply(alloc: Allocation, reason: str | None, links: Links | None = None) -> Message:
    """To whoever released or reclaimed: the incident is resolved, the webhook frees the hosts."""
    why = f" ({reason})" if reason else ""
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
    text = f":no_entry: {alloc.ir_label} refused: {reason}. The request is closed; nothing was allocated."
    return linked(alloc, Message(text, [section(text)]), links)


def working(text: str) -> Message:
    """The immediate ack while the worker does the slow part."""
    return Message(f":hourglass_flowing_sand: {text}")


def request_created(alloc: Allocation, *, approved: bool, reason: str, links: Links | None = None) -> Message:
    """To the requester: the IR number and what happens next."""
    nxt = "Approved by policy; allocating hosts now." if approved else "Sent to the GPU operators for approval."
    text = f"*{alloc.ir_label}* created: {_what(alloc)}, {alloc.duration_days} days. {nxt}"
    return linked(alloc, Message(text.replace("*", ""), [section(text), context(reason)]), links)


def refused(reason: str) -> Message:
    """To the requester: a request over a hard limit, not created."""
    text = f":no_entry: Request refused: {reason}. Nothing was created."
    return Message(text, [section(text)])


def approved_notice(alloc: Allocation, operator: str, links: Links | None = None) -> Message:
    """To the requester: an operator approved."""
    text = f"*{alloc.ir_label}* was approved by <@{operator}>; allocating hosts now."
    return linked(alloc, Message(text.replace("*", ""), [section(text)]), links)


def rejected_notice(alloc: Allocation, operator: str, reason: str | None, links: Links | None = None) -> Message:
    """To the requester: an operator rejected."""
    text = f":x: *{alloc.ir_label}* ({_what(alloc)}) was rejected by <@{operator}>"
    text += f": {reason}" if reason else "."
    return linked(alloc, Message(text.replace("*", ""), [section(text)]), links)


def allocated(alloc: Allocation, links: Links | None = None) -> Message:
    """To the requester: which hosts, and how to carry the IR in code."""
    hosts = "\n".join(f"• `{h}` ({alloc.host_gpus.get(h, 0)} GPUs){_units_of(alloc, h)}" for h in alloc.hosts)
    text = (
        f":white_check_mark: *{alloc.ir_label}* is allocated: {_what(alloc)}, until {_when(alloc.expires_at)}.\n"
        f"{hosts}\n"
        f"Carry the IR in your jobs so usage is attributed: `export GPUFARM_IR={alloc.ir_label}` "
        f"or the pod label `{POD_LABEL}: {alloc.ir_tag.split(':', 1)[1]}`."
    )
    devices = lease_devices(alloc)
    use = "; ".join(f"{h}: CUDA_VISIBLE_DEVICES={cuda_visible_devices(u)}" for h, u in devices.items())
    message = Message(
        f"{alloc.ir_label} is allocated on {', '.join(alloc.hosts)}. Use GPUFARM_IR={alloc.ir_label}"
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
    slices = [u for u in shown if u.is_mig]
    if slices:
        profiles = ", ".join(sorted({u.profile or "?" for u in slices}))
        what = f"MIG slices {', '.join(u.label for u in slices)} ({profiles})"
        uuids = ", ".join(f"`{nvml_uuid(u.uuid)}`" for u in slices if u.uuid)
        what += f", UUIDs {uuids}"
    else:
        what = f"GPU{'s' if len(shown) != 1 else ''} {', '.join(u.label for u in shown)}"
    whole = [u for u in shown if not u.is_mig]
    if slices and whole:
        what += f"; GPUs {', '.join(u.label for u in whole)}"
    resources = ", ".join(f"`{name}: {n}`" for name, n in kubernetes_resources(units).items())
    kube = f" · Kubernetes: {resources}" if resources else ""
    return f": {what}{rest}\n   `CUDA_VISIBLE_DEVICES={cuda_visible_devices(shown)}`{kube}"


def reclaimed(alloc: Allocation, reason: str, hosts: Sequence[str], links: Links | None = None) -> Message:
    """To the requester and the operators: the GPUs are back in the pool."""
    where = f" from {', '.join(f'`{h}`' for h in hosts)}" if hosts else ""
    text = f":recycle: *{alloc.ir_label}* ({_what(alloc)}) was reclaimed{where}: {reason}."
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


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
    parts = _named(f"`{p}` ({n} GPU{'s' if n != 1 else ''})" for p, n in sorted(given.items()))
    gpus = sum(given.values())
    kept = _named(f"`{h}` ({alloc.host_gpus.get(h, 0)} GPUs)" for h in alloc.hosts) or "no host"
    gone = _named(f"`{h}`" for h in hosts_gone)
    untagged = f" Its `{alloc.ir_tag}` tag is removed from {gone}." if hosts_gone else ""
    text = (
        f":recycle: *{alloc.ir_label}* gave back {parts}: idle past the {grace} min grace while the rest of the lease "
        f"was busy; {gpus} GPU{'s' if gpus != 1 else ''} are back in `{alloc.environment}`.{untagged}\n"
        f"The lease stays open with {kept}: {alloc.gpu_count}x {alloc.gpu_model}, until {_when(alloc.expires_at)}."
    )
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), links)


def partly_busy_again(
    alloc: Allocation, cleared: Sequence[str], still_idle: Sequence[str], links: Links | None = None
) -> Message:
    """To the requester: some warned parts are busy again; the warning stands for the rest."""
    text = (
        f"{alloc.ir_label}: {_named(cleared)} busy again, its idle warning cleared; still idle: {_named(still_idle)}."
    )
    return linked(alloc, Message(text, [section(text)]), links)


# The few names a warning lists before it says how many more (a section holds 3000 characters).
_MAX_NAMED = 8


def _idle_where(alloc: Allocation, scope: IdleScope | None) -> str:
    """`host gpu-a-01 (8 GPUs)`, `devices GPU-1234…, …`, or the whole lease when the alert named neither."""
    if scope is not None and scope.devices:
        noun = "device" if len(scope.devices) == 1 else "devices"
        names = _named(f"`{d}`" for d in scope.devices)
        on = f" on {_named(f'`{h}`' for h in scope.hosts)}" if scope.hosts else ""
        return f"{noun} {names}{on}"
    if scope is not None and scope.hosts:
        noun = "host" if len(scope.hosts) == 1 else "hosts"
        held = {h.lower(): n for h, n in alloc.host_gpus.items()}
        return f"{noun} " + _named(
            f"`{h}` ({held[h.lower()]} GPUs)" if held.get(h.lower()) else f"`{h}`" for h in scope.hosts
        )
    where = f" on {_named(f'`{h}`' for h in alloc.hosts)}" if alloc.hosts else ""
    return f"the whole lease looks idle ({alloc.gpu_count} GPUs{where})"


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


def _lease_span(alloc: Allocation) -> str:
    """`7 days from <allocation>, expires <end>`, or, while it waits for hosts, that its days have not started."""
    if alloc.phase.value in ("approved", "waiting"):
        since = f", waiting since {_when(alloc.waiting_since)}" if alloc.waiting_since else ""
        return f"{alloc.duration_days} days from when its hosts are allocated{since}"
    start = f" from {_when(alloc.allocated_at)}" if alloc.allocated_at else ""
    return f"{alloc.duration_days} days{start}, expires {_when(alloc.expires_at)}"


def status_message(alloc: Allocation, links: Links | None = None) -> Message:
    """One allocation in detail."""
    lines = [
        f"*{alloc.ir_label}* — {alloc.title}",
        f"Phase: `{alloc.phase.value}` (incident {alloc.state.value}); requester <@{alloc.requester}>",
        f"{_what(alloc)}, {_lease_span(alloc)}",
    ]
    if alloc.hosts:
        lines.append("Hosts: " + ", ".join(f"`{h}` ({alloc.host_gpus.get(h, 0)})" for h in alloc.hosts))
        lines += [f"`{h}`:{_units_of(alloc, h).removeprefix(':')}" for h in lease_devices(alloc)]
    if alloc.approved_by:
        who = "policy" if alloc.approved_by == "policy" else f"<@{alloc.approved_by}>"
        lines.append(f"Approved by {who}")
    if alloc.reclaim_reason:
        lines.append(f"Reclaim reason: {alloc.reclaim_reason.value}")
    if alloc.keep_count:
        held = f", idle reclaim held off until {_when(alloc.kept_until)}" if alloc.kept_until else ""
        lines.append(f"Keeps used: {alloc.keep_count}{held}")
    if alloc.exempt_until:
        by = f" (granted by <@{alloc.exempt_by}>)" if alloc.exempt_by else ""
        lines.append(f"Exempt from idle reclaim until {_when(alloc.exempt_until)}{by}")
    if alloc.purpose:
        lines.append(f">{alloc.purpose}")
    text = "\n".join(lines)
    blocks = [section(text)]
    trail = history_lines(alloc)
    blocks.extend(section(chunk) for chunk in _chunks(trail, MAX_SECTION_TEXT - 100, MAX_MESSAGE_BLOCKS - 3))
    if alloc.phase.value in ("allocated", "idle-warned"):
        blocks.append(_owner_buttons(alloc))
    full = "\n".join([text, *trail])
    return linked(alloc, Message(full.replace("*", ""), blocks), links)


def history_lines(alloc: Allocation) -> list[str]:
    """`History (n entries):` and one line per step, oldest first, as `/gpu status` prints them."""
    if not alloc.history:
        return []
    return [f"*History* ({len(alloc.history)} entries):", *(f"• {line}" for line in history.shown(alloc.history))]


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
) -> Message:
    """Allocations, one line each, newest first, each with its links; a waiting one says where it stands in its
    queue (`positions`). `links` gives each lease's links (its pool's, gpufarm.core.chat.links)."""
    if not allocations:
        return Message(f"{title}: none.", [section(f"*{title}*: none.")])
    places = positions or {}
    rows = [
        f"• *{a.ir_label}* `{a.phase.value}` {a.gpu_count}x {a.gpu_model} `{a.environment}` "
        f"{a.team}/{a.project} <@{a.requester}>"
        + (f" on {', '.join(a.hosts)}" if a.hosts else "")
        + (f" ({places[a.ir]})" if a.ir in places else "")
        for a in allocations
    ]
    head = f"*{title}* ({len(allocations)})"
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
        lines.append(f"• `{r.team}` {r.gpu_model} in `{r.environment}`: {r.used} / {r.entitled} (hard {hard})")
    if len(lines) == 1:
        lines.append("• no quotas configured")
    lines.append("*Pools* (free / total GPUs)")
    for (env, model), (free, total) in sorted(inventory.items()):
        lines.append(f"• `{env}` {model}: {free} / {total}")
    lines += ledger
    text = "\n".join(lines)
    return Message("GPU quotas", [section(text)])


def _owner_buttons(alloc: Allocation) -> dict[str, Any]:
    return actions(
        f"owner:{alloc.ir}",
        button("Extend", ACTION_EXTEND, alloc.ir_label),
        release_button(alloc),
    )
