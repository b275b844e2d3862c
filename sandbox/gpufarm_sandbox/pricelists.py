"""Simulated clouds' price lists: gpufarm's own AWS and Azure price list adapters, their requests answered in this
process from a table of list prices, in the shapes the APIs answer (tests/fixtures/prices holds a recorded one of
each), so `gpufarm local`, the demo and benchmarks/prices.py price cloud pools without a cloud.

- AWS: a botocore `pricing` client whose `GetProducts` requests are answered at botocore's `before-send` event
  (the request body's instanceType and regionCode filters pick the product), so botocore parses the answer as it
  parses the API's; nothing is patched process-wide.
- Azure: the Retail Prices API through azure-core on the stubbed transport (gpufarm_sandbox.azurestub), Linux,
  Windows and Spot meters for each size, so the adapter's choice among them is exercised too.

`price_book(farm)` is a `PriceBook` of the farm's list prices read once through them (a tool that builds a
`GpuFarm` itself: gpufarm_sandbox.dashboard_preview). `down` makes the keys it holds answer 503 (the "said once" of
an outage, locally); `latency_s` makes each answer take that long (the benchmark's stand-in for a round trip).
"""

from __future__ import annotations

import io
import json
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpufarm.adapters.aws_pricing import AwsPriceList
from gpufarm.adapters.azure_prices import AzurePriceList
from gpufarm.adapters.price_lists import CloudPriceLists
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard
from gpufarm_sandbox.azurestub import StubTransport

ACCESS_KEY = "AKIAGPUFARMLOCAL0001"
SECRET_KEY = "gpufarm-local-not-a-secret"  # noqa: S105 - a stand-in credential

# (region or location, SKU) -> (price per instance hour in USD, GPUs): list prices of the kind the clouds publish.
LIST_PRICES: dict[tuple[str, str], tuple[str, int]] = {
    ("us-east-1", "p5.48xlarge"): ("98.32", 8),
    ("us-east-1", "p4d.24xlarge"): ("32.7726", 8),
    ("us-west-2", "p5.48xlarge"): ("98.32", 8),
    ("us-west-2", "p4d.24xlarge"): ("32.7726", 8),
    ("eastus", "Standard_ND96isr_H100_v5"): ("98.32", 8),
    ("eastus", "Standard_NC24ads_A100_v4"): ("3.673", 1),
}


class _Raw(io.BytesIO):
    """The raw body botocore reads an answer from."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        """The whole body at once."""
        yield self.getvalue()


@dataclass
class SimulatedPriceLists:
    """Both clouds' price lists over `prices` (see the module docstring)."""

    prices: Mapping[tuple[str, str], tuple[str, int]] = field(default_factory=lambda: dict(LIST_PRICES))
    down: set[PriceKey] = field(default_factory=set)
    latency_s: float = 0.0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lists(self, *, attempts: int = 2) -> CloudPriceLists:
        """gpufarm's price lists on these simulated APIs (retries without waiting: the clouds here answer at once)."""
        aws = AwsPriceList(client=self._pricing_client(), attempts=attempts, sleeper=lambda _: None)
        azure = AzurePriceList(transport=StubTransport(self._azure), attempts=attempts, sleeper=lambda _: None)
        return CloudPriceLists({Cloud.AWS: aws, Cloud.AZURE: azure})

    # -- AWS -----------------------------------------------------------------------------------------------------

    def _pricing_client(self) -> Any:
        import botocore.session
        from botocore.config import Config

        session = botocore.session.get_session()
        client = session.create_client(
            "pricing",
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"total_max_attempts": 1}),
        )
        client.meta.events.register("before-send.pricing.GetProducts", self._aws)
        return client

    def _aws(self, request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse, HTTPHeaders

        self._tick()
        asked = json.loads(request.body or b"{}")
        terms = {f.get("Field"): f.get("Value") for f in asked.get("Filters", [])}
        region, sku = str(terms.get("regionCode")), str(terms.get("instanceType"))
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.1"
        if PriceKey(Cloud.AWS, region, sku) in self.down:
            body = json.dumps({"__type": "ServiceUnavailableException", "Message": "down"}).encode()
            return AWSResponse(request.url, 503, headers, _Raw(body))
        listed = self.prices.get((region, sku))
        items = [json.dumps(aws_product(region, sku, *listed))] if listed else []
        body = json.dumps({"FormatVersion": "aws_v1", "PriceList": items}).encode()
        return AWSResponse(request.url, 200, headers, _Raw(body))

    # -- Azure ---------------------------------------------------------------------------------------------------

    def _azure(self, method: str, path: str, query: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        self._tick()
        odata = query.get("$filter", "")
        location = _quoted_after(odata, "armRegionName eq ")
        sku = _quoted_after(odata, "armSkuName eq ")
        currency = query.get("currencyCode", "'USD'").strip("'")
        if PriceKey(Cloud.AZURE, location, sku) in self.down:
            return 503, {"error": "down"}, {}
        listed = self.prices.get((location, sku))
        items = azure_meters(location, sku, Decimal(listed[0]), currency) if listed else []
        return 200, {"BillingCurrency": currency, "Items": items, "NextPageLink": None, "Count": len(items)}, {}

    def _tick(self) -> None:
        with self._lock:
            self.calls += 1
        if self.latency_s:
            time.sleep(self.latency_s)


class SimulatedPriceBook:
    """The PriceBook of a farm's list prices, read once through the simulated lists on first use."""

    def __init__(self, farm: FarmConfig) -> None:
        self.farm = farm
        self._known: dict[PriceKey, CloudPrice] | None = None

    def known(self) -> Mapping[PriceKey, CloudPrice]:
        """The farm's list prices the simulated lists give."""
        if self._known is None:
            keys = list(RateCard(self.farm.rates).price_keys())
            self._known = dict(SimulatedPriceLists().lists().read(keys, self.farm.rates.currency).prices)
        return self._known


def price_book(farm: FarmConfig) -> SimulatedPriceBook:
    """A PriceBook for `farm` from the simulated lists."""
    return SimulatedPriceBook(farm)


def aws_product(region: str, sku: str, usd: str, gpus: int) -> dict[str, Any]:
    """One EC2 product of the Price List API (its attributes and OnDemand term), as GetProducts lists it."""
    code = f"SIM{zlib.crc32(f'{region}/{sku}'.encode()):010d}"
    term = f"{code}.JRTCKXETXF"
    attributes = {
        "instanceType": sku,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "gpu": str(gpus),
        "instanceFamily": "GPU instance",
        "servicecode": "AmazonEC2",
    }
    dimension = {"unit": "Hrs", "pricePerUnit": {"USD": usd}, "description": f"${usd} per On Demand Linux {sku} Hour"}
    return {
        "product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": code},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {term: {"priceDimensions": {f"{term}.6YS6EN2CT7": dimension}, "sku": code}}},
    }


def azure_meters(location: str, sku: str, price: Decimal, currency: str) -> list[dict[str, Any]]:
    """A size's consumption meters as the Retail Prices API lists them: Linux, Windows and Spot."""
    base = {
        "currencyCode": currency,
        "armRegionName": location,
        "armSkuName": sku,
        "serviceName": "Virtual Machines",
        "unitOfMeasure": "1 Hour",
        "type": "Consumption",
        "isPrimaryMeterRegion": True,
    }
    name = sku.removeprefix("Standard_").replace("_", " ")
    return [
        base | {"retailPrice": float(price), "productName": f"Virtual Machines {name} Series", "skuName": name},
        base | {"retailPrice": float(price * Decimal("1.2")), "productName": f"Virtual Machines {name} Series Windows"},
        base | {"retailPrice": float(price * Decimal("0.4")), "skuName": f"{name} Spot", "meterName": f"{name} Spot"},
    ]


def _quoted_after(text: str, marker: str) -> str:
    start = text.find(marker + "'")
    if start < 0:
        return ""
    rest = text[start + len(marker) + 1 :]
    return rest.split("'", 1)[0]
