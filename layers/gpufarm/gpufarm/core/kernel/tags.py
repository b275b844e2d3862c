"""The tags an allocation writes on its hosts and removes from them, in one place.

A lease puts `ir:ir-<N>`, `project:` and `team:` on each host it holds (gpufarm.core.kernel.hosts names the keys)
and, on a shared pool, one `gpu_assign:ir-<N>/<uuid>` per unit it records there (gpufarm.core.kernel.units).
Allocation writes them, reclaim removes exactly this lease's (keeping what another holder of a shared host put
there), and the sync's repair restores or removes them so the tags agree with the incidents. Pure functions: the
caller reads and writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpufarm.core.kernel.bounded import ascii_digits
from gpufarm.core.kernel.hosts import (
    ALLOCATION_KEYS,
    GPU_ASSIGN_KEY,
    IR_KEY,
    PROJECT_KEY,
    TEAM_KEY,
    GpuHost,
    GpuUnit,
    assign_tag,
    normalize_tag,
    parse_assign,
    tag_values,
)
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.units import lease_devices


def allocation_tags(allocs: Iterable[Allocation]) -> list[str]:
    """The ir:, project: and team: tags these allocations put on a host, normalized as Datadog stores them."""
    tags: list[str] = []
    for a in allocs:
        wanted = [a.ir_tag]
        wanted += [f"{PROJECT_KEY}:{a.project}"] if a.project else []
        wanted += [f"{TEAM_KEY}:{a.team}"] if a.team else []
        tags += [t for t in (normalize_tag(w) for w in wanted) if t not in tags]
    return tags


def is_alloc_tag(tag: str) -> bool:
    """True for the tags an allocation puts on a host (ir:, project:, team:, gpu_assign:)."""
    return tag.split(":", 1)[0] in (*ALLOCATION_KEYS, GPU_ASSIGN_KEY)


def keyed(tags: Iterable[str], keys: Iterable[str]) -> list[str]:
    """The tags whose key is one of these."""
    wanted = set(keys)
    return [t for t in tags if t.split(":", 1)[0] in wanted]


def ir_numbers(values: Iterable[str]) -> list[int]:
    """IR numbers of `ir-123` tag values (anything else skipped)."""
    out = []
    for value in values:
        number = ascii_digits(value.removeprefix("ir-"))
        if number is not None:
            out.append(number)
    return out


def untagged(current: list[str], alloc: Allocation, others: Mapping[int, Allocation]) -> list[str]:
    """A host's `user` tags without this lease's: its ir: tag and gpu_assign tags, and its project:/team: tags
    unless another live holder of the host (`others`, by IR) has them too."""
    keep = allocation_tags([others[n] for n in other_holders(current, alloc.ir) if n in others])
    mine = allocation_tags([alloc])
    return [t for t in current if t != alloc.ir_tag and (t not in mine or t in keep) and not is_assign_of(t, alloc.ir)]


def other_holders(current: Iterable[str], ir: int) -> list[int]:
    """The IRs other than `ir` whose ir: tag a host carries."""
    return [n for n in ir_numbers(tag_values(current, IR_KEY)) if n != ir]


def assign_tags(ir: int, units: Iterable[GpuUnit]) -> list[str]:
    """The `gpu_assign:ir-<N>/<uuid>` tags of a lease's units on one host.

    Units known by index only (a host whose agent publishes no units) get none: such an agent reads no assignment,
    and the incident's devices field alone says which GPUs are whose.
    """
    me = ir_tag_value(ir)
    return [assign_tag(me, u.uuid) for u in units if u.uuid]


def is_assign_of(tag: str, ir: int) -> bool:
    """True for a `gpu_assign` tag of this lease (whatever unit it names)."""
    return tag.startswith(f"{GPU_ASSIGN_KEY}:{ir_tag_value(ir)}/")


def wanted_assign_tags(
    holders: Iterable[Allocation], host: str, current: Iterable[str], settled: frozenset[Phase]
) -> list[str]:
    """The `gpu_assign` tags the host should carry for these holders.

    A holder in a settled phase (`settled`: allocated, idle-warned) has exactly the units its incident records; one
    still being allocated keeps what its allocation wrote so far (its fields follow its tags).
    """
    current = list(current)
    out: list[str] = []
    for alloc in holders:
        if alloc.phase in settled:
            out += assign_tags(alloc.ir, lease_devices(alloc).get(host, ()))
        else:
            out += [t for t in current if is_assign_of(t, alloc.ir)]
    return list(dict.fromkeys(out))


def stale_assignments(host: GpuHost, live: Mapping[int, Allocation], settled: frozenset[Phase]) -> list[str]:
    """The host's `gpu_assign` tags no live lease accounts for: its IR gone, or a settled lease without the unit."""
    out: list[str] = []
    for value in tag_values(host.tags, GPU_ASSIGN_KEY):
        parsed = parse_assign(value)
        alloc = live.get(int(parsed[0].removeprefix("ir-"))) if parsed is not None else None
        if parsed is None or alloc is None:
            stale = True
        else:
            held = {u.id for u in lease_devices(alloc).get(host.name, ())}
            stale = alloc.phase in settled and parsed[1] not in held
        if stale:
            out.append(f"{GPU_ASSIGN_KEY}:{value}")
    return out
