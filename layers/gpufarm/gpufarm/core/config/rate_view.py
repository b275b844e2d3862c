"""The farm's rate card as reports read it: its terms (gpufarm.core.config.rate_terms) from the validated farm's
JSON dump (gpufarm.core.config.farm_view), without the rate models.

Nothing here validates YAML: the dump is what RateSettings wrote (Decimals as their text, enums as their values);
a value that is not that shape raises TypeError or ValueError, and the farm view refuses the whole dump.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from gpufarm.core.config.rate_terms import Cloud, Purchase, listed_models


@dataclass(frozen=True, slots=True)
class PoolRateView:
    """One pool's prices (gpufarm.core.config.rates.PoolRates)."""

    per_gpu_hour: Mapping[str, Decimal]
    cloud: Cloud | None
    region: str | None
    location: str | None
    instance_types: Mapping[str, str]
    vm_sizes: Mapping[str, str]
    purchase: Purchase

    def listed_models(self) -> dict[str, str]:
        """Model -> the SKU whose list price prices it, for this pool's cloud."""
        return listed_models(self.cloud, self.instance_types, self.vm_sizes)


@dataclass(frozen=True, slots=True)
class RateView:
    """`rates:` (gpufarm.core.config.rates.RateSettings)."""

    currency: str
    refresh_hours: int
    discounts: Mapping[Purchase, Decimal]
    mig_fractions: Mapping[str, Decimal]
    environments: Mapping[str, PoolRateView]


def rate_view(value: Mapping[str, Any]) -> RateView:
    """The rate card's terms from RateSettings' JSON dump; TypeError or ValueError when it is not that shape."""
    hours = value["refresh_hours"]
    if isinstance(hours, bool) or not isinstance(hours, int):
        raise TypeError("refresh_hours")
    return RateView(
        _text(value["currency"]),
        hours,
        MappingProxyType({Purchase(_text(k)): amount(v) for k, v in _mapping(value["discounts"]).items()}),
        MappingProxyType({_text(k): amount(v) for k, v in _mapping(value["mig_fractions"]).items()}),
        MappingProxyType({_text(k): _pool(_mapping(v)) for k, v in _mapping(value["environments"]).items()}),
    )


def _pool(value: Mapping[str, Any]) -> PoolRateView:
    cloud = value["cloud"]
    return PoolRateView(
        MappingProxyType({_text(k): amount(v) for k, v in _mapping(value["per_gpu_hour"]).items()}),
        None if cloud is None else Cloud(_text(cloud)),
        _optional_text(value["region"]),
        _optional_text(value["location"]),
        _texts(value["instance_types"]),
        _texts(value["vm_sizes"]),
        Purchase(_text(value["purchase"])),
    )


def amount(value: Any) -> Decimal:
    """A non-negative finite Decimal as pydantic dumps one (its text); ValueError otherwise."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise TypeError("an amount")
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ValueError("an amount") from None
    if not number.is_finite() or number < 0:
        raise ValueError("an amount")
    return number


def _texts(value: Any) -> Mapping[str, str]:
    return MappingProxyType({_text(k): _text(v) for k, v in _mapping(value).items()})


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError("a mapping")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)
