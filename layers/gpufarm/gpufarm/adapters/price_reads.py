"""What both clouds' price-list readers share: a key whose answer gives no price, and reading keys one by one
within the step's time budget, each failure kept as its kind (safe to tell) and the rest still read."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpufarm.adapters import time_budget
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import PriceReading

log = logging.getLogger(__name__)


class Unreadable(Exception):
    """A key whose answer gives no usable price (the message is the kind, safe to tell)."""


def read_each(
    keys: Sequence[PriceKey],
    cloud: Cloud,
    one: Callable[[PriceKey], CloudPrice],
    kind_of: Callable[[Exception], str],
) -> PriceReading:
    """Each of `cloud`'s keys read by `one`; a key of another cloud, one past the time budget, or one whose read
    failed is a failure with its kind (`Unreadable`'s message, else `kind_of(exc)`: never the exception's text)."""
    prices: dict[PriceKey, CloudPrice] = {}
    failures: dict[PriceKey, str] = {}
    for key in keys:
        if key.cloud is not cloud:
            failures[key] = f"not an {cloud.value} price"
            continue
        if not time_budget.allows(0):
            failures[key] = "out of time"
            continue
        try:
            prices[key] = one(key)
        except Unreadable as exc:
            failures[key] = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever the client raised, this key is unreadable
            failures[key] = kind_of(exc)
        if key in failures:
            log.warning("%s price %s unreadable: %s", cloud.value, key.label(), failures[key])
    return PriceReading(prices, failures)
