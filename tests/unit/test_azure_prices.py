"""The Azure Retail Prices API as a price list, on a stubbed azure-core transport (a recorded-shape answer)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpufarm.adapters.azure_inventory import gpu_model_of
from gpufarm.adapters.azure_prices import GPUS_PER_SIZE, PATH, AzurePriceList
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import PriceKey
from gpufarm_sandbox.azurestub import StubTransport

PAGE = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "prices" / "azure_retail_nd96_h100.json").read_text()
)
ND = PriceKey(Cloud.AZURE, "eastus", "Standard_ND96isr_H100_v5")
Answer = tuple[int, Any, dict[str, str]]


class Recorder:
    """Answers each request in turn from a list, keeping what was asked."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, Mapping[str, str]]] = []

    def __call__(self, method: str, path: str, query: Mapping[str, str]) -> Answer:
        assert method == "GET" and path == PATH
        self.asked.append((path, dict(query)))
        return self.answers.pop(0)


def prices(recorder: Recorder, attempts: int = 3, waits: list[float] | None = None) -> AzurePriceList:
    sleeper = (waits if waits is not None else []).append
    return AzurePriceList(transport=StubTransport(recorder), attempts=attempts, sleeper=sleeper)


def page(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(PAGE)
    for item in body["Items"]:
        item.update(changes)
    return body


def test_the_linux_consumption_price_skipping_windows_spot_and_low_priority() -> None:
    recorder = Recorder((200, PAGE, {}))
    reading = prices(recorder).read([ND], "USD")
    price = reading.prices[ND]
    assert (price.per_instance_hour, price.gpus, price.currency) == (Decimal("98.32"), 8, "USD")
    _, query = recorder.asked[0]
    assert query["currencyCode"] == "'USD'"
    assert query["$filter"] == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
        "and armSkuName eq 'Standard_ND96isr_H100_v5' and priceType eq 'Consumption'"
    )


def test_next_page_links_are_followed_only_to_the_same_api_and_bounded() -> None:
    first = {**PAGE, "Items": [], "NextPageLink": "https://prices.azure.com:443/api/retail/prices?$skip=100"}
    recorder = Recorder((200, first, {}), (200, PAGE, {}))
    assert prices(recorder).read([ND], "USD").prices[ND].per_instance_hour == Decimal("98.32")
    assert recorder.asked[1][1]["$skip"] == "100"
    elsewhere = {**first, "NextPageLink": "https://prices.example.com/api/retail/prices?$skip=100"}
    assert prices(Recorder((200, elsewhere, {}))).read([ND], "USD").failures == {ND: "a NextPageLink to another place"}
    endless = Recorder(*[(200, first, {})] * 10)
    assert prices(endless).read([ND], "USD").failures == {ND: "more than 10 pages"}


def test_429_and_5xx_are_retried_within_the_attempts() -> None:
    waits: list[float] = []
    recorder = Recorder((429, {}, {"Retry-After": "1"}), (503, {}, {}), (200, PAGE, {}))
    assert ND in prices(recorder, attempts=3, waits=waits).read([ND], "USD").prices
    assert len(waits) == 2 and len(recorder.asked) == 3
    down = Recorder((503, {}, {}), (503, {}, {}))
    assert prices(down, attempts=2).read([ND], "USD").failures == {ND: "HTTP 503"}
    refused = Recorder((400, {"error": "bad filter"}, {}))
    assert prices(refused, attempts=3).read([ND], "USD").failures == {ND: "HTTP 400"}
    assert len(refused.asked) == 1  # a refusal is not retried


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (page(retailPrice="abc"), "a price that is not a finite non-negative number"),
        (page(retailPrice=-3.2), "a price that is not a finite non-negative number"),
        (page(unitOfMeasure="1/Month"), "no Linux consumption price"),
        ({"Items": "none"}, "an answer without Items"),
        ([1, 2], "an answer that is not an object"),
    ],
)
def test_garbage_leaves_the_key_unreadable_never_zero(body: Any, why: str) -> None:
    reading = prices(Recorder((200, body, {}))).read([ND], "USD")
    assert reading.failures == {ND: why} and reading.prices == {}


def test_prices_in_another_currency_than_the_cards_are_refused() -> None:
    reading = prices(Recorder((200, PAGE, {}))).read([ND], "EUR")
    assert reading.failures == {ND: "prices in USD, not EUR"}
    euros = prices(Recorder((200, page(currencyCode="EUR", retailPrice=90.1), {}))).read([ND], "EUR")
    assert euros.prices[ND].per_instance_hour == Decimal("90.1") and euros.prices[ND].currency == "EUR"


def test_disagreeing_meters_keep_the_primary_region_and_else_are_refused() -> None:
    body = copy.deepcopy(PAGE)
    extra = {**body["Items"][0], "retailPrice": 120.0, "isPrimaryMeterRegion": False}
    body["Items"].append(extra)
    assert prices(Recorder((200, body, {}))).read([ND], "USD").prices[ND].per_instance_hour == Decimal("98.32")
    extra["isPrimaryMeterRegion"] = True
    assert prices(Recorder((200, body, {}))).read([ND], "USD").failures == {ND: "several Linux consumption prices"}


def test_a_size_whose_gpus_are_unknown_is_not_asked_and_an_aws_key_is_not_read() -> None:
    recorder = Recorder()
    odd = PriceKey(Cloud.AZURE, "eastus", "Standard_NV6ads_A10_v5")
    aws = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")
    reading = prices(recorder).read([odd, aws], "USD")
    assert reading.failures == {odd: "a VM size whose GPUs gpufarm does not know", aws: "not an azure price"}
    assert recorder.asked == []


def test_the_gpu_table_is_bounded_and_names_sizes_the_inventory_knows() -> None:
    assert 0 < len(GPUS_PER_SIZE) <= 64
    for size, gpus in GPUS_PER_SIZE.items():
        assert gpu_model_of(size) is not None, size  # the inventory tells its GPU model from its name
        assert 1 <= gpus <= 8, size
