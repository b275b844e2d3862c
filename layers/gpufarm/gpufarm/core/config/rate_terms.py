"""What a rate card says, without its model: the terms the card (gpufarm.core.money.card) reads.

The farm file's `rates:` are validated as gpufarm.core.config.rates.RateSettings; the card reads any record with
these terms, so a report that reads the already-validated farm (gpufarm.core.config.farm_view) prices its leases
without loading the models.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Protocol

MAX_PRICE = Decimal("100000")


class Cloud(StrEnum):
    """Where a pool's list prices come from."""

    AWS = "aws"
    AZURE = "azure"


class Purchase(StrEnum):
    """How a cloud pool's capacity is bought: on-demand at list price, or a discount factor of `rates.discounts`."""

    ON_DEMAND = "on-demand"
    RESERVED = "reserved"
    SAVINGS_PLAN = "savings-plan"
    SPOT = "spot"


class PoolRateTerms(Protocol):
    """One pool's prices: written per model, and/or the cloud list whose SKUs price its models."""

    @property
    def per_gpu_hour(self) -> Mapping[str, Decimal]: ...
    @property
    def cloud(self) -> Cloud | None: ...
    @property
    def region(self) -> str | None: ...
    @property
    def location(self) -> str | None: ...
    @property
    def purchase(self) -> Purchase: ...
    def listed_models(self) -> dict[str, str]: ...


class RateTerms(Protocol):
    """The rate card's terms: its currency, discount factors, MIG fractions and each pool's prices."""

    @property
    def currency(self) -> str: ...
    @property
    def discounts(self) -> Mapping[Purchase, Decimal]: ...
    @property
    def mig_fractions(self) -> Mapping[str, Decimal]: ...
    @property
    def environments(self) -> Mapping[str, PoolRateTerms]: ...


def listed_models(
    cloud: Cloud | None, instance_types: Mapping[str, str], vm_sizes: Mapping[str, str]
) -> dict[str, str]:
    """Model -> the SKU whose list price prices it (instance type or VM size), for the pool's cloud."""
    if cloud is Cloud.AWS:
        return dict(instance_types)
    if cloud is Cloud.AZURE:
        return dict(vm_sizes)
    return {}
