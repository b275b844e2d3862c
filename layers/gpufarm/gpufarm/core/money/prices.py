"""The port through which the core reads the clouds' list prices last read (the rate card's cloud half).

The sync refreshes them through the clouds' adapters and keeps them in a cache; every other use case only reads
the cache through this port, so no Slack answer or report waits on a cloud's price list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpufarm.core.money.card import CloudPrice, PriceKey


class PriceBook(Protocol):
    """The list prices last read, the last known ones where a read failed (`CloudPrice.stale`)."""

    def known(self) -> Mapping[PriceKey, CloudPrice]:
        """Every cached list price by its key; empty when none was ever read."""
        ...
