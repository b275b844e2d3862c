"""The Azure Retail Prices API as a price list: a VM size's pay-as-you-go Linux price per hour, and its GPUs.

One query per key, `GET https://prices.azure.com/api/retail/prices` with `$filter` serviceName 'Virtual Machines',
armRegionName, armSkuName and priceType 'Consumption', and `currencyCode` the rate card's currency (the API
converts; an answer in another currency is refused). Of the meters it lists, Windows, Spot and Low Priority ones are
skipped; what is left is the Linux price per `1 Hour` (a size listed in several meter regions keeps its primary
one's). The API needs no credential.

Bounded: `NextPageLink` followed only to the same API (https, prices.azure.com, the same path), at most MAX_PAGES
pages of at most MAX_BODY_BYTES each. Retried: 429, 5xx and connection errors, within the attempts and the time
budget (gpufarm.adapters.bounded_retry), on azure-core's pipeline (no retry policy of its own). Validated: no price,
prices that disagree, a price that is not a finite non-negative number, or a size whose GPUs gpufarm does not know
(GPUS_PER_SIZE) leave the key unreadable, never zero.

GPUs per size: the Azure inventory source learns them from the Resource SKUs API per subscription and location
(gpufarm.adapters.azure_inventory), which needs credentials this API does not; so this adapter keeps its own table
of the GPU sizes, whole GPUs only (a size holding a fraction of a GPU, NVadsA10 v5 below 36 vCPUs, is not priced
per GPU).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from gpufarm.adapters import time_budget
from gpufarm.adapters.bounded_retry import retried
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.price_codec import price_value
from gpufarm.core.money.prices import PriceReading

log = logging.getLogger(__name__)

HOST = "prices.azure.com"
PATH = "/api/retail/prices"
URL = f"https://{HOST}{PATH}"
API_VERSION = "2023-01-01-preview"
MAX_PAGES = 10
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_ITEMS = 1000
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

# GPUs of each Azure GPU VM size gpufarm prices (whole GPUs; from Azure's size pages).
GPUS_PER_SIZE: Mapping[str, int] = {
    "Standard_ND96isr_H200_v5": 8,
    "Standard_ND96isr_H100_v5": 8,
    "Standard_ND96is_MI300X_v5": 8,
    "Standard_ND96amsr_A100_v4": 8,
    "Standard_ND96asr_v4": 8,
    "Standard_ND40rs_v2": 8,
    "Standard_NC40ads_H100_v5": 1,
    "Standard_NC80adis_H100_v5": 2,
    "Standard_NC24ads_A100_v4": 1,
    "Standard_NC48ads_A100_v4": 2,
    "Standard_NC96ads_A100_v4": 4,
    "Standard_NC4as_T4_v3": 1,
    "Standard_NC8as_T4_v3": 1,
    "Standard_NC16as_T4_v3": 1,
    "Standard_NC64as_T4_v3": 4,
    "Standard_NC6s_v3": 1,
    "Standard_NC12s_v3": 2,
    "Standard_NC24s_v3": 4,
    "Standard_NC24rs_v3": 4,
    "Standard_NV36ads_A10_v5": 1,
    "Standard_NV36adms_A10_v5": 1,
    "Standard_NV72ads_A10_v5": 2,
}


class Unreadable(Exception):
    """A key whose answer gives no usable price (the message is the kind, safe to tell)."""


class RetryableStatus(Exception):
    """An answer worth another try (429, 5xx)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def query(key: PriceKey, currency: str) -> dict[str, str]:
    """The query of one VM size's consumption prices in one location."""
    odata = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{key.region}' "
        f"and armSkuName eq '{key.sku}' and priceType eq 'Consumption'"
    )
    return {"api-version": API_VERSION, "currencyCode": f"'{currency}'", "$filter": odata}


class AzurePriceList:
    """PriceLists over the Azure Retail Prices API (see the module docstring); reads Azure keys only."""

    def __init__(
        self,
        *,
        transport: Any = None,
        attempts: int = 4,
        http_timeout: float = 10.0,
        clock: Callable[[], datetime] | None = None,
        sleeper: Callable[[float], None] = time.sleep,
    ) -> None:
        self._transport = transport
        self._client: Any = None
        self.attempts = attempts
        self._http_timeout = http_timeout
        self._clock = clock or (lambda: datetime.now(UTC))
        self._sleeper = sleeper
        self.calls = 0

    def read(self, keys: Sequence[PriceKey], currency: str) -> PriceReading:
        """Each Azure key's list price in `currency`; a key not read is a failure with its kind."""
        prices: dict[PriceKey, CloudPrice] = {}
        failures: dict[PriceKey, str] = {}
        for key in keys:
            if key.cloud is not Cloud.AZURE:
                failures[key] = "not an azure price"
                continue
            if not time_budget.allows(0):
                failures[key] = "out of time"
                continue
            try:
                prices[key] = self._one(key, currency)
            except Unreadable as exc:
                failures[key] = str(exc)
            except RetryableStatus as exc:
                failures[key] = str(exc)
            except Exception as exc:  # noqa: BLE001 - whatever azure-core raised, this key is unreadable
                failures[key] = type(exc).__name__
            if key in failures:
                log.warning("azure price %s unreadable: %s", key.label(), failures[key])
        return PriceReading(prices, failures)

    def _one(self, key: PriceKey, currency: str) -> CloudPrice:
        gpus = GPUS_PER_SIZE.get(key.sku)
        if gpus is None:
            raise Unreadable("a VM size whose GPUs gpufarm does not know")
        items: list[Mapping[str, Any]] = []
        url = URL
        params: dict[str, str] | None = query(key, currency)
        for _ in range(MAX_PAGES):
            page = retried(
                partial(self._get, url, params),
                attempts=self.attempts,
                retryable=_retryable,
                sleeper=self._sleeper,
            )
            found = page.get("Items")
            if not isinstance(found, list):
                raise Unreadable("an answer without Items")
            items += [i for i in found if isinstance(i, Mapping)]
            if len(items) > MAX_ITEMS:
                raise Unreadable(f"more than {MAX_ITEMS} meters")
            following = page.get("NextPageLink")
            if not following:
                break
            url, params = _same_api(following), None
        else:
            raise Unreadable(f"more than {MAX_PAGES} pages")
        return CloudPrice(linux_price(items, key, currency), gpus, currency, self._clock())

    def _get(self, url: str, params: Mapping[str, str] | None) -> Mapping[str, Any]:
        from azure.core.rest import HttpRequest

        self.calls += 1
        request = HttpRequest("GET", url, params=dict(params) if params else None)
        response = self._pipeline().send_request(
            request, connection_timeout=min(5.0, self._http_timeout), read_timeout=self._http_timeout
        )
        try:
            if response.status_code in _RETRY_STATUSES:
                raise RetryableStatus(response.status_code)
            if response.status_code != 200:
                raise Unreadable(f"HTTP {response.status_code}")
            body = response.body()
        finally:
            response.close()
        if len(body) > MAX_BODY_BYTES:
            raise Unreadable("an answer larger than gpufarm reads")
        try:
            page = json.loads(body, parse_float=Decimal)
        except ValueError:
            raise Unreadable("an answer that is not JSON") from None
        if not isinstance(page, Mapping):
            raise Unreadable("an answer that is not an object")
        return page

    def _pipeline(self) -> Any:
        if self._client is None:
            from azure.core import PipelineClient
            from azure.core.pipeline.policies import HeadersPolicy, UserAgentPolicy

            policies = [HeadersPolicy({"Accept": "application/json"}), UserAgentPolicy("gpufarm")]
            options: dict[str, Any] = {"policies": policies}
            if self._transport is not None:
                options["transport"] = self._transport
            self._client = PipelineClient(URL, **options)
        return self._client


def linux_price(items: Sequence[Mapping[str, Any]], key: PriceKey, currency: str) -> Decimal:
    """The Linux pay-as-you-go price per hour among a size's meters (see the module docstring)."""
    kept = [
        (item.get("isPrimaryMeterRegion") is not False, _amount(item, currency)) for item in items if _linux(item, key)
    ]
    if not kept:
        raise Unreadable("no Linux consumption price")
    primary = {amount for is_primary, amount in kept if is_primary} or {amount for _, amount in kept}
    if len(primary) > 1:
        raise Unreadable("several Linux consumption prices")
    return primary.pop()


def _linux(item: Mapping[str, Any], key: PriceKey) -> bool:
    """Whether a meter is the size's Linux pay-as-you-go hour in the key's location."""
    if item.get("armSkuName") != key.sku or str(item.get("armRegionName", "")).lower() != key.region:
        return False
    if item.get("type") != "Consumption" or item.get("unitOfMeasure") != "1 Hour":
        return False
    names = " ".join(str(item.get(k, "")) for k in ("productName", "skuName", "meterName"))
    return not ("Windows" in names or "Spot" in names or "Low Priority" in names)


def _amount(item: Mapping[str, Any], currency: str) -> Decimal:
    """A meter's price, in the card's currency only."""
    if item.get("currencyCode") != currency:
        raise Unreadable(f"prices in {str(item.get('currencyCode'))[:3]}, not {currency}")
    try:
        return price_value(item.get("retailPrice"))
    except ValueError:
        raise Unreadable("a price that is not a finite non-negative number") from None


def _same_api(link: Any) -> str:
    """A NextPageLink, followed only to the same API."""
    if not isinstance(link, str) or len(link) > 4096:
        raise Unreadable("a NextPageLink that is not a URL")
    parts = urlsplit(link)
    if parts.scheme != "https" or parts.hostname != HOST or parts.path != PATH or parts.port not in (None, 443):
        raise Unreadable("a NextPageLink to another place")
    return link


def _retryable(exc: Exception) -> bool:
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError

    return isinstance(exc, RetryableStatus | ServiceRequestError | ServiceResponseError)
