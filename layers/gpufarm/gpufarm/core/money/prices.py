"""The ports through which the core reads the clouds' list prices last read (the rate card's cloud half).

The sync refreshes them through the clouds' adapters (`PriceLists`) and keeps them in a cache (`PriceStore`,
gpufarm.core.sync.prices); every other use case only reads the cache through `PriceBook`, so no Slack answer or
report waits on a cloud's price list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gpufarm.core.money.card import CloudPrice, PriceKey


class PriceBook(Protocol):
    """The list prices last read, the last known ones where a read failed (`CloudPrice.stale`)."""

    def known(self) -> Mapping[PriceKey, CloudPrice]:
        """Every cached list price by its key; empty when none was ever read."""
        ...


# The most list prices one cache holds: far above any card (a price per pool and model), a guard against a cache
# or a card that never ends.
MAX_PRICE_KEYS = 2000


@dataclass(frozen=True, slots=True)
class PriceEntry:
    """One list price as the cache keeps it: the price last read (None: never read) and whether its outage was told."""

    price: CloudPrice | None
    # True while the key is unreadable and the operators were told so: the outage is said once, across invocations.
    told: bool = False


@dataclass(frozen=True, slots=True)
class PriceState:
    """The whole cache: when the lists were last refreshed, and every key's entry."""

    refreshed_at: datetime | None = None
    entries: Mapping[PriceKey, PriceEntry] = field(default_factory=dict)

    def known(self) -> dict[PriceKey, CloudPrice]:
        """The prices in it, the last known ones marked stale."""
        return {key: entry.price for key, entry in self.entries.items() if entry.price is not None}


class PriceStore(Protocol):
    """Where the list prices last read persist between invocations (a cache, never lease state)."""

    def load(self) -> PriceState:
        """The cache as last saved; empty when there is none or it is unreadable as a cache (corrupt).
        UpstreamError when the store cannot be reached."""
        ...

    def save(self, state: PriceState) -> None:
        """Replace the cache; UpstreamError when the store refuses."""
        ...


@dataclass(frozen=True, slots=True)
class PriceReading:
    """What one read of the clouds' price lists gave: a price per key read, and why each other key was not."""

    prices: Mapping[PriceKey, CloudPrice] = field(default_factory=dict)
    # key -> the kind of failure (an error class or a short reason, never an answer's text).
    failures: Mapping[PriceKey, str] = field(default_factory=dict)


class PriceLists(Protocol):
    """The clouds' price lists (AWS Price List API, Azure Retail Prices API)."""

    def read(self, keys: Sequence[PriceKey], currency: str) -> PriceReading:
        """The list price of each key, in `currency` where the cloud lists it; a key not read is a failure.
        Never raises for a cloud's fault: that key is a failure."""
        ...


@dataclass(frozen=True, slots=True)
class PriceFeed:
    """What the sync refreshes the cached list prices with: the clouds' lists and the cache they persist in."""

    lists: PriceLists
    store: PriceStore
