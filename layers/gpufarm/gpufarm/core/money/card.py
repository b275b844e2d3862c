"""The rate card: the price of one GPU-hour (or one MIG slice-hour) of a model in a pool, in the card's currency.

Built from the farm file's `rates:` (gpufarm.core.config.rates, or any record of its terms:
gpufarm.core.config.rate_terms, as the reports' farm view gives them) and the cloud list prices last read
(`CloudPrice`, keyed by `PriceKey`; read by the sync through the clouds' adapters and kept in a cache). Pure: it reads
nothing. The order for a model in a pool: the pool's own `per_gpu_hour` (written by the operators: on-prem
amortised cost, or an override of the list), else the cloud's list price of the model's instance type or VM size
divided by its GPUs, times the pool's discount factor. A list price read earlier and not readable now is still used
(`stale`); a model with no price at all has no rate: its money is unpriced, never zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from gpufarm.core.config.rate_terms import Cloud, Purchase, RateTerms

# A MIG profile's compute slices out of a GPU's seven (A100, H100, H200, B200).
MIG_SLICES = 7
_SLICES_RE = re.compile(r"^([0-9]{1,2})g\.")
CENT = Decimal("0.01")


class RateSource(StrEnum):
    """Where a rate came from."""

    FARM = "farm"  # written in the farm file (on-prem, or an override of a cloud's list)
    AWS = "aws"  # the AWS Price List API
    AZURE = "azure"  # the Azure Retail Prices API


@dataclass(frozen=True, slots=True)
class PriceKey:
    """One list price: a cloud, a region (AWS) or location (Azure), an instance type or VM size."""

    cloud: Cloud
    region: str
    sku: str

    def label(self) -> str:
        """`aws/us-east-1/p5.48xlarge`."""
        return f"{self.cloud.value}/{self.region}/{self.sku}"


@dataclass(frozen=True, slots=True)
class CloudPrice:
    """A list price as a cloud's price list gave it: per instance (or VM) hour, on demand, Linux."""

    per_instance_hour: Decimal
    gpus: int
    currency: str
    read_at: datetime
    # True when the list could not be read at the last refresh and this is the last known price.
    stale: bool = False


@dataclass(frozen=True, slots=True)
class Rate:
    """What one GPU-hour of a model costs in a pool."""

    per_gpu_hour: Decimal
    currency: str
    source: RateSource
    # The list price's read time (None for a price written in the farm file) and whether it is the last known.
    as_of: datetime | None = None
    stale: bool = False

    def cost(self, gpu_hours: float) -> Decimal:
        """The cost of these GPU-hours, unrounded."""
        return self.per_gpu_hour * Decimal(repr(gpu_hours))


def mig_fraction(settings: RateTerms, profile: str | None) -> Decimal:
    """A MIG profile's share of its GPU: the farm's `mig_fractions`, else its compute slices / 7; a whole GPU is 1."""
    if profile is None:
        return Decimal(1)
    if profile in settings.mig_fractions:
        return settings.mig_fractions[profile]
    match = _SLICES_RE.match(profile)
    if match is None:
        # A slice whose profile the driver did not name: priced as the smallest slice, never as a whole GPU.
        return Decimal(1) / MIG_SLICES
    return min(Decimal(1), Decimal(int(match.group(1))) / MIG_SLICES)


class RateCard:
    """The prices of every pool and model the farm's rate card and the cached list prices give."""

    def __init__(self, settings: RateTerms, prices: Mapping[PriceKey, CloudPrice] | None = None) -> None:
        self.settings = settings
        self.currency = settings.currency
        self._prices = dict(prices or {})
        self._rates: dict[tuple[str, str], Rate | None] = {}

    def rate(self, environment: str, model: str) -> Rate | None:
        """One whole GPU-hour of `model` in `environment`, or None when nothing prices it."""
        key = (environment, model.upper())
        if key not in self._rates:
            self._rates[key] = self._find(*key)
        return self._rates[key]

    def slice_rate(self, environment: str, model: str, profile: str | None) -> Rate | None:
        """One hour of a MIG slice of `profile` (a whole GPU when None)."""
        whole = self.rate(environment, model)
        if whole is None or profile is None:
            return whole
        fraction = mig_fraction(self.settings, profile)
        return Rate(whole.per_gpu_hour * fraction, whole.currency, whole.source, whole.as_of, whole.stale)

    def cost(self, environment: str, model: str, gpu_hours: float) -> Decimal | None:
        """What these GPU-hours cost, or None when the pool's model has no rate (unpriced, never zero)."""
        rate = self.rate(environment, model)
        return None if rate is None else rate.cost(gpu_hours)

    def price_keys(self) -> Iterator[PriceKey]:
        """Every list price the card needs read (the sync's refresh), each once."""
        seen: set[PriceKey] = set()
        for pool in self.settings.environments.values():
            if pool.cloud is None:
                continue
            region = pool.region if pool.cloud is Cloud.AWS else pool.location
            for sku in pool.listed_models().values():
                key = PriceKey(pool.cloud, region or "", sku)
                if key not in seen:
                    seen.add(key)
                    yield key

    def stale_keys(self) -> list[PriceKey]:
        """The list prices in use that are the last known ones, not read at the last refresh."""
        return sorted((k for k, p in self._prices.items() if p.stale), key=PriceKey.label)

    def unpriced(self, offered: Mapping[str, tuple[str, ...]]) -> list[tuple[str, str]]:
        """(pool, model) pairs the farm offers that nothing prices."""
        return [(env, m) for env, models in sorted(offered.items()) for m in models if self.rate(env, m) is None]

    def _find(self, environment: str, model: str) -> Rate | None:
        pool = self.settings.environments.get(environment)
        if pool is None:
            return None
        written = pool.per_gpu_hour.get(model)
        if written is not None:
            return Rate(written, self.currency, RateSource.FARM)
        sku = pool.listed_models().get(model)
        if sku is None or pool.cloud is None:
            return None
        region = pool.region if pool.cloud is Cloud.AWS else pool.location
        price = self._prices.get(PriceKey(pool.cloud, region or "", sku))
        if price is None or price.gpus < 1 or price.currency != self.currency:
            return None
        factor = self._factor(pool.purchase)
        source = RateSource.AWS if pool.cloud is Cloud.AWS else RateSource.AZURE
        return Rate(price.per_instance_hour / price.gpus * factor, self.currency, source, price.read_at, price.stale)

    def _factor(self, purchase: Purchase) -> Decimal:
        return self.settings.discounts.get(purchase, Decimal(1))


def round_cents(amount: Decimal) -> Decimal:
    """An amount rounded half-even to the cent (what every figure in money shows)."""
    return amount.quantize(CENT)
