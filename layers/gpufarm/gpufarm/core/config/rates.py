"""The farm file's rate card: what a GPU-hour costs, per pool and model, in one currency.

    rates:
      currency: USD                 # every figure in money is in this currency (ISO 4217)
      refresh_hours: 24             # the clouds' price lists are re-read at most this often
      discounts:                    # factors on the clouds' list prices, per way of buying
        reserved: 0.62
        savings-plan: 0.72
        spot: 0.35
      mig_fractions: {}             # a MIG profile's share of its GPU; default: its compute slices / 7
      environments:
        onprem-hpc:                 # amortised cost, written by the operators
          per_gpu_hour: {H100: 2.10}
        cloud-aws:                  # from the AWS Price List API (one instance type per model)
          cloud: aws
          region: us-east-1
          instance_types: {H100: p5.48xlarge, A100: p4d.24xlarge}
          purchase: savings-plan    # on-demand (the default), reserved, savings-plan or spot
          per_gpu_hour: {A100: 3.20}  # an override wins over the price list for that model
        azure-nd:                   # from the Azure Retail Prices API (one VM size per model)
          cloud: azure
          location: eastus
          vm_sizes: {H100: Standard_ND96isr_H100_v5}

Refused at load: a negative price, a currency that is not the card's, a model the pool does not offer, a pool the
farm does not define, a cloud pool without its region or location, a discount outside (0, 1]. A pool with no rate
is allowed: its money is *unpriced* wherever it is shown (never zero). The card itself is gpufarm.core.money.card.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpufarm.core.config.rate_terms import MAX_PRICE as MAX_PRICE  # noqa: PLC0414 - its home before
from gpufarm.core.config.rate_terms import Cloud as Cloud  # noqa: PLC0414 - its home before
from gpufarm.core.config.rate_terms import Purchase as Purchase  # noqa: PLC0414 - its home before
from gpufarm.core.config.rate_terms import listed_models
from gpufarm.core.kernel.model import GPU_MODEL_PATTERN, Name

_CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$")
_LOCATION_RE = re.compile(r"^[a-z][a-z0-9]{1,39}$")
_INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]{0,15}\.[a-z0-9-]{1,20}$")
_VM_SIZE_RE = re.compile(r"^Standard_[A-Za-z0-9_]{2,60}$")
_PROFILE_RE = re.compile(r"^[0-9]{1,2}g\.[0-9a-z._]{1,30}$")
_MODEL_RE = re.compile(GPU_MODEL_PATTERN)


def _currency(value: str) -> str:
    if not _CURRENCY_RE.match(value):
        raise ValueError(f"'{value[:10]}' is not an ISO 4217 currency code (three capital letters, e.g. USD)")
    return value


def _matches(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"'{value[:64]}' is not {what}")
        return value

    return AfterValidator(check)


def _model(text: str) -> str:
    value = text.strip().upper()
    if not _MODEL_RE.match(value):
        raise ValueError(f"'{text[:40]}' is not a GPU model name (letters, digits, '-', '_', '.')")
    return value


ModelName = Annotated[str, AfterValidator(_model)]
Currency = Annotated[str, AfterValidator(_currency)]
Price = Annotated[Decimal, Field(ge=0, le=MAX_PRICE, max_digits=12, decimal_places=6, allow_inf_nan=False)]
Factor = Annotated[Decimal, Field(gt=0, le=1, max_digits=7, decimal_places=6, allow_inf_nan=False)]
InstanceType = Annotated[str, _matches(_INSTANCE_TYPE_RE, "an EC2 instance type (p5.48xlarge)")]
VmSize = Annotated[str, _matches(_VM_SIZE_RE, "an Azure VM size (Standard_ND96isr_H100_v5)")]
MigProfile = Annotated[str, _matches(_PROFILE_RE, "a MIG profile (1g.10gb)")]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolRates(_Strict):
    """One pool's prices: written per model (on-prem, or overrides), and/or read from a cloud's price list."""

    currency: Currency | None = None
    per_gpu_hour: dict[ModelName, Price] = Field(default_factory=dict)
    cloud: Cloud | None = None
    region: Annotated[str, _matches(_REGION_RE, "an AWS region (us-east-1)")] | None = None
    location: Annotated[str, _matches(_LOCATION_RE, "an Azure location (eastus)")] | None = None
    instance_types: dict[ModelName, InstanceType] = Field(default_factory=dict)
    vm_sizes: dict[ModelName, VmSize] = Field(default_factory=dict)
    purchase: Purchase = Purchase.ON_DEMAND

    def listed_models(self) -> dict[str, str]:
        """Model -> the SKU whose list price prices it (instance type or VM size), for this pool's cloud."""
        return listed_models(self.cloud, self.instance_types, self.vm_sizes)

    def problems(self, where: str, card_currency: str, offered: Collection[str]) -> list[str]:
        """What is wrong with this pool's rates."""
        found: list[str] = []
        if self.currency is not None and self.currency != card_currency:
            found.append(f"{where}.currency: {self.currency} is not the rate card's currency {card_currency}")
        for key, models in (
            ("per_gpu_hour", self.per_gpu_hour),
            ("instance_types", self.instance_types),
            ("vm_sizes", self.vm_sizes),
        ):
            found += [f"{where}.{key}: the pool offers no '{m}'" for m in models if m not in offered]
        found += self._cloud_problems(where, card_currency)
        return found

    def _cloud_problems(self, where: str, card_currency: str) -> list[str]:
        found: list[str] = []
        if self.cloud is Cloud.AWS:
            found += self._aws_problems(where, card_currency)
        elif self.cloud is Cloud.AZURE:
            if self.location is None:
                found.append(f"{where}.location: an azure pool names the location its prices are read for")
            if self.instance_types or self.region:
                found.append(f"{where}: instance_types and region are for aws pools")
        elif self.instance_types or self.vm_sizes or self.region or self.location:
            found.append(f"{where}: instance_types, vm_sizes, region and location need cloud: aws or azure")
        if self.purchase is not Purchase.ON_DEMAND and self.cloud is None:
            found.append(f"{where}.purchase: a discount applies to a cloud's list price; write the price itself")
        return found

    def _aws_problems(self, where: str, card_currency: str) -> list[str]:
        found: list[str] = []
        if self.region is None:
            found.append(f"{where}.region: an aws pool names the region its prices are read for")
        if self.vm_sizes or self.location:
            found.append(f"{where}: vm_sizes and location are for azure pools")
        unpriced = set(self.instance_types) - set(self.per_gpu_hour)
        if card_currency != "USD" and unpriced:
            found.append(
                f"{where}: the AWS price list is in USD, not {card_currency}; give per_gpu_hour for "
                + ", ".join(sorted(unpriced))
            )
        return found


class RateSettings(_Strict):
    """`rates:` in the farm file."""

    currency: Currency = "USD"
    refresh_hours: int = Field(default=24, ge=1, le=24 * 31)
    discounts: dict[Purchase, Factor] = Field(default_factory=dict)
    mig_fractions: dict[MigProfile, Factor] = Field(default_factory=dict)
    environments: dict[Name, PoolRates] = Field(default_factory=dict, max_length=500)

    def problems(self, offered: Mapping[str, Collection[str]]) -> list[str]:
        """What is wrong with the card against the farm's pools and the models each offers."""
        found: list[str] = []
        for name, pool in self.environments.items():
            where = f"rates.environments.{name}"
            if name not in offered:
                found.append(f"{where}: '{name}' is not an environment")
                continue
            found += pool.problems(where, self.currency, offered[name])
            if pool.purchase not in (Purchase.ON_DEMAND, *self.discounts):
                found.append(f"{where}.purchase: rates.discounts has no factor for {pool.purchase.value}")
        return found
