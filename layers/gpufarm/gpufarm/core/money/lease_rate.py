"""What one of a lease's GPU-hours costs: its pool's rate for its model, scaled by the MIG share of its units.

A lease's GPU-hours count its units (gpufarm.core.kernel.accrued): a whole GPU or a MIG slice is one unit, so
an hour of a slice is priced at the slice's share of the GPU (gpufarm.core.money.card.mig_fraction). A lease on
several kinds of unit gets the mean of their rates, as its hours are spread evenly over its units. A dedicated
lease (no units recorded) holds whole GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from gpufarm.core.kernel.hosts import GpuUnit
from gpufarm.core.money.card import Rate, RateCard


def unit_profiles(devices: Sequence[str]) -> list[str | None]:
    """The MIG profile of each unit a lease records (`host=<unit>` entries; None for a whole GPU)."""
    profiles: list[str | None] = []
    for entry in devices:
        _, sep, value = entry.partition("=")
        unit = GpuUnit.parse(value) if sep else None
        if unit is not None:
            profiles.append(unit.profile if unit.gi is not None else None)
    return profiles


def lease_rate(card: RateCard, environment: str | None, model: str | None, devices: Sequence[str] = ()) -> Rate | None:
    """The price of one of the lease's GPU-hours, or None when its pool's model is unpriced."""
    if not environment or not model:
        return None
    whole = card.rate(environment, model)
    if whole is None:
        return None
    profiles = unit_profiles(devices)
    if not profiles or all(p is None for p in profiles):
        return whole
    rates = [card.slice_rate(environment, model, p) for p in profiles]
    total = sum((r.per_gpu_hour for r in rates if r is not None), Decimal(0))
    return Rate(total / len(rates), whole.currency, whole.source, whole.as_of, whole.stale)
