"""How much a lease holds, in words: `8x H100` for whole GPUs, `2 x A100 1g.10gb slices` (a times sign) for MIG
slices.

A lease on a shared pool records its units (gpufarm.core.kernel.units); where they are MIG slices, messages and
dashboards call them slices of their profile, never GPUs. A lease that recorded no units (a dedicated pool, or one
still waiting) is counted in GPUs of its model. Every name is inert (incident fields may be edited by hand).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpufarm.core.chat.escape import inert
from gpufarm.core.kernel.hosts import GpuUnit
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.units import lease_devices

# Slices are counted with a times sign (`2 x A100 1g.10gb slices`), whole GPUs as `8x H100`.
TIMES = "\N{MULTIPLICATION SIGN}"


def _slices(model: str, profile: str, n: int) -> str:
    return f"{n} {TIMES} {model} {profile} slice{'' if n == 1 else 's'}"


def units_amount(model: str | None, units: Iterable[GpuUnit]) -> str | None:
    """`2 x A100 1g.10gb slices` (and `+ 1x A100` for whole GPUs beside them) when some units are MIG slices; None
    when none is (the caller counts GPUs)."""
    units = list(units)
    profiles = Counter(inert(u.profile or "MIG") for u in units if u.is_mig)
    if not profiles:
        return None
    name = inert(model or "GPU")
    parts = [_slices(name, profile, n) for profile, n in sorted(profiles.items())]
    whole = sum(1 for u in units if not u.is_mig)
    if whole:
        parts.append(f"{whole}x {name}")
    return " + ".join(parts)


def gpu_amount(alloc: Allocation) -> str:
    """What the lease holds: `2 x A100 1g.10gb slices` for slices, else `8x H100`."""
    held = [u for units in lease_devices(alloc).values() for u in units]
    return units_amount(alloc.gpu_model, held) or f"{alloc.gpu_count}x {inert(alloc.gpu_model)}"


def count_amount(alloc: Allocation) -> str:
    """What the lease holds, counted: `2 x A100 1g.10gb slices` for slices, else `16 GPUs`."""
    held = [u for units in lease_devices(alloc).values() for u in units]
    return units_amount(alloc.gpu_model, held) or f"{alloc.gpu_count} GPUs"


def host_amount(alloc: Allocation, host: str) -> str:
    """What the lease holds on one host: `2 slices` or `8 GPUs`."""
    units = lease_devices(alloc).get(host, ())
    slices = sum(1 for u in units if u.is_mig)
    if slices:
        whole = len(units) - slices
        said = f"{slices} slice{'' if slices == 1 else 's'}"
        return f"{said}, {whole} GPU{'' if whole == 1 else 's'}" if whole else said
    return f"{alloc.host_gpus.get(host, 0)} GPUs"
