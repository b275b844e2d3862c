"""The clouds' price lists as one `PriceLists`: each key read by its cloud's list, the whole read a bounded step.

The sync's refresh reads every key the rate card needs through this, inside a time budget of its own
(REFRESH_BUDGET_S, and never past the invocation's: gpufarm.adapters.time_budget.step): a key still unread when the
budget is spent is a failure ("out of time") and keeps its last known price, so a slow or throttled list never
makes the sync run out of its Timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufarm.adapters import time_budget
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import PriceLists, PriceReading

# The refresh's own share of the sync's Timeout (120 s in template.yaml).
REFRESH_BUDGET_S = 30.0


class CloudPriceLists:
    """Every cloud's list, each reading its own keys, within one time budget."""

    def __init__(self, lists: dict[Cloud, PriceLists], *, budget_s: float = REFRESH_BUDGET_S) -> None:
        self.lists = dict(lists)
        self.budget_s = budget_s

    def read(self, keys: Sequence[PriceKey], currency: str) -> PriceReading:
        """Each key through its cloud's list, within the budget."""
        prices: dict[PriceKey, CloudPrice] = {}
        failures: dict[PriceKey, str] = {}
        with time_budget.step(self.budget_s):
            for cloud in Cloud:
                wanted = [k for k in keys if k.cloud is cloud]
                if not wanted:
                    continue
                reader = self.lists.get(cloud)
                if reader is None:
                    failures |= dict.fromkeys(wanted, f"no {cloud.value} price list")
                    continue
                reading = reader.read(wanted, currency)
                prices |= {k: v for k, v in reading.prices.items() if k in wanted}
                failures |= {k: reading.failures.get(k, "not read") for k in wanted if k not in reading.prices}
        return PriceReading(prices, failures)


def cloud_price_lists(*, attempts: int, http_timeout: float) -> CloudPriceLists:
    """The production lists: the AWS Price List API and the Azure Retail Prices API (clients built on first read)."""
    from gpufarm.adapters.aws_pricing import AwsPriceList
    from gpufarm.adapters.azure_prices import AzurePriceList

    return CloudPriceLists(
        {
            Cloud.AWS: AwsPriceList(attempts=attempts, http_timeout=http_timeout),
            Cloud.AZURE: AzurePriceList(attempts=attempts, http_timeout=http_timeout),
        }
    )
