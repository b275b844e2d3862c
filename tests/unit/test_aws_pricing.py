"""The AWS Price List API as a price list, through botocore's `pricing` client and its Stubber on a recorded-shape
answer (moto does not implement the Price List API)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.stub import Stubber

from gpufarm.adapters import time_budget
from gpufarm.adapters.aws_pricing import AwsPriceList, filters
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import PriceKey

ANSWER = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "prices" / "aws_get_products_p5.json").read_text()
)
P5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")


@pytest.fixture
def stubbed() -> Iterator[tuple[Any, Stubber]]:
    session = botocore.session.get_session()
    client = session.create_client(
        "pricing", region_name="us-east-1", aws_access_key_id="AKIATEST", aws_secret_access_key="test"
    )
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def params(key: PriceKey = P5, token: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ServiceCode": "AmazonEC2",
        "Filters": filters(key),
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }
    return out | ({"NextToken": token} if token else {})


def product(**attributes: str) -> dict[str, Any]:
    item = json.loads(ANSWER["PriceList"][0])
    item["product"]["attributes"] |= attributes
    return item


def with_price(usd: Any) -> str:
    item = product()
    for term in item["terms"]["OnDemand"].values():
        for dimension in term["priceDimensions"].values():
            dimension["pricePerUnit"] = {"USD": usd}
    return json.dumps(item)


def test_the_on_demand_linux_price_per_hour_and_the_gpus_of_one_product(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_response("get_products", ANSWER, params())
    reading = AwsPriceList(client=client).read([P5], "USD")
    price = reading.prices[P5]
    # The OnDemand term's price, not the Reserved one the product also lists.
    assert (price.per_instance_hour, price.gpus, price.currency) == (Decimal("98.32"), 8, "USD")
    assert reading.failures == {}
    wanted = {f["Field"]: f["Value"] for f in filters(P5)}
    assert wanted == {
        "instanceType": "p5.48xlarge",
        "regionCode": "us-east-1",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }


def test_pages_are_followed_and_bounded(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [], "NextToken": "t1"}, params())
    stub.add_response("get_products", ANSWER, params(token="t1"))
    assert AwsPriceList(client=client).read([P5], "USD").prices[P5].per_instance_hour == Decimal("98.32")
    for n in range(5):
        page = {"FormatVersion": "aws_v1", "PriceList": [], "NextToken": f"n{n + 1}"}
        stub.add_response("get_products", page, params(token=f"n{n}" if n else None))
    reading = AwsPriceList(client=client).read([P5], "USD")
    assert reading.failures == {P5: "more than 5 pages"}


def test_throttling_and_5xx_are_retried_within_the_attempts(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    waits: list[float] = []
    stub.add_client_error("get_products", "ThrottlingException", http_status_code=400, expected_params=params())
    stub.add_client_error("get_products", "ServiceUnavailableException", http_status_code=503, expected_params=params())
    stub.add_response("get_products", ANSWER, params())
    reading = AwsPriceList(client=client, attempts=3, sleeper=waits.append).read([P5], "USD")
    assert P5 in reading.prices and len(waits) == 2
    for _ in range(2):
        stub.add_client_error("get_products", "ServiceUnavailableException", http_status_code=503)
    failed = AwsPriceList(client=client, attempts=2, sleeper=waits.append).read([P5], "USD")
    assert failed.failures == {P5: "ServiceUnavailableException 503"} and not failed.prices
    # A refusal is not retried.
    stub.add_client_error("get_products", "AccessDeniedException", http_status_code=400)
    denied = AwsPriceList(client=client, attempts=3, sleeper=waits.append).read([P5], "USD")
    assert denied.failures == {P5: "AccessDeniedException 400"}


def test_no_retry_waits_past_the_time_budget(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    waits: list[float] = []
    stub.add_client_error("get_products", "ThrottlingException", http_status_code=400)
    with time_budget.step(1.2):
        reading = AwsPriceList(client=client, attempts=4, sleeper=waits.append).read([P5], "USD")
    assert waits == [] and reading.failures == {P5: "ThrottlingException 400"}  # failed rather than waited
    with time_budget.step(0):
        assert AwsPriceList(client=client).read([P5], "USD").failures == {P5: "out of time"}


@pytest.mark.parametrize(
    ("price_list", "why"),
    [
        ([with_price("NaN")], "a price that is not a finite non-negative number"),
        ([with_price("-1.5")], "a price that is not a finite non-negative number"),
        ([with_price("Infinity")], "a price that is not a finite non-negative number"),
        ([json.dumps(product(gpu=""))], "no GPU count"),
        ([json.dumps(product(gpu="0"))], "no GPU count"),
        ([json.dumps(product(instanceType="p4d.24xlarge"))], "a product of another instance type or region"),
        (["{not json"], "a product that is not JSON"),
        ([], "no such product"),
        ([ANSWER["PriceList"][0], with_price("99.00")], "several products of different prices"),
    ],
)
def test_garbage_leaves_the_key_unreadable_never_zero(
    stubbed: tuple[Any, Stubber], price_list: list[str], why: str
) -> None:
    client, stub = stubbed
    stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": price_list}, params())
    reading = AwsPriceList(client=client).read([P5], "USD")
    assert reading.failures == {P5: why} and reading.prices == {}


def test_the_same_product_twice_is_one_price_and_an_azure_key_is_not_read(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    twice = copy.deepcopy(ANSWER)
    twice["PriceList"] *= 2
    stub.add_response("get_products", twice, params())
    other = PriceKey(Cloud.AZURE, "eastus", "Standard_ND96isr_H100_v5")
    reading = AwsPriceList(client=client).read([P5, other], "USD")
    assert reading.prices[P5].gpus == 8 and reading.failures == {other: "not an aws price"}


def test_a_failure_is_named_by_its_kind_never_by_the_answers_text(stubbed: tuple[Any, Stubber]) -> None:
    client, stub = stubbed
    stub.add_client_error("get_products", "<b>see https://evil.example</b>", http_status_code=400)
    reading = AwsPriceList(client=client).read([P5], "USD")
    assert reading.failures == {P5: "ClientError 400"}


def test_the_list_is_in_usd_whatever_the_card_asks_and_a_card_in_another_currency_does_not_use_it(
    stubbed: tuple[Any, Stubber],
) -> None:
    from fakes import FARM_YAML

    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.money.card import RateCard

    client, stub = stubbed
    stub.add_response("get_products", ANSWER, params())
    price = AwsPriceList(client=client).read([P5], "EUR").prices[P5]
    assert price.currency == "USD"  # the Price List API gives USD only; never relabelled
    rates = (
        "rates:\n  currency: EUR\n  environments:\n    cloud:\n      cloud: aws\n      region: us-east-1\n"
        "      instance_types: {H100: p5.48xlarge}\n      per_gpu_hour: {H100: 9.10}\n"
    )
    card = RateCard(parse_farm(FARM_YAML + rates).rates, {P5: price})
    rate = card.rate("cloud", "H100")
    assert rate is not None and rate.per_gpu_hour == Decimal("9.10") and rate.currency == "EUR"
