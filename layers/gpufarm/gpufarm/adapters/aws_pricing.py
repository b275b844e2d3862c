"""The AWS Price List API as a price list: an EC2 instance type's On-Demand Linux price per hour, and its GPUs.

One `GetProducts` per key, through botocore's `pricing` client on the API's endpoint in us-east-1 (the API answers
there for every region's prices), service `AmazonEC2`, filtered to one product: instanceType, regionCode,
operatingSystem Linux, tenancy Shared, preInstalledSw NA, capacitystatus Used. Each `PriceList` item is a JSON
document (product attributes and terms); the price is the OnDemand term's price dimension in `Hrs`, its
`pricePerUnit` in USD (the only currency the list gives), and the GPUs are the product's `gpu` attribute.

Bounded: at most MAX_PAGES pages of at most PAGE_SIZE items, each item at most MAX_ITEM_BYTES. Retried: throttling,
5xx and connection errors, the deployment's attempts (GPUFARM_MAX_RETRIES + 1, as the other AWS adapters), never a
wait past the time budget (gpufarm.adapters.bounded_retry). Validated: a key whose answer has no product, several
products of different prices, no USD price per Hrs, a price that is not a finite non-negative number, or no GPU
count is unreadable, never zero; the failure is named by its kind, never by the answer's text.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

from gpufarm.adapters import time_budget
from gpufarm.adapters.bounded_retry import retried
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.price_codec import MAX_GPUS, price_value
from gpufarm.core.money.prices import PriceReading

log = logging.getLogger(__name__)

ENDPOINT_REGION = "us-east-1"
SERVICE_CODE = "AmazonEC2"
CURRENCY = "USD"
PAGE_SIZE = 100
MAX_PAGES = 5
MAX_ITEM_BYTES = 512 * 1024
_CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]{0,63}$")
_FIXED = (("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))
_RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalError",
        "InternalErrorException",
        "InternalFailure",
    }
)


class Unreadable(Exception):
    """A key whose answer gives no usable price (the message is the kind, safe to tell)."""


def filters(key: PriceKey) -> list[dict[str, str]]:
    """The GetProducts filters that select one EC2 product."""
    pairs = (("instanceType", key.sku), ("regionCode", key.region), *_FIXED)
    return [{"Type": "TERM_MATCH", "Field": name, "Value": value} for name, value in pairs]


class AwsPriceList:
    """PriceLists over the AWS Price List API (see the module docstring); reads AWS keys only."""

    def __init__(
        self,
        *,
        client: Any = None,
        attempts: int = 4,
        http_timeout: float = 10.0,
        clock: Callable[[], datetime] | None = None,
        sleeper: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self.attempts = attempts
        self._http_timeout = http_timeout
        self._clock = clock
        self._sleeper = sleeper
        self.calls = 0

    def read(self, keys: Sequence[PriceKey], currency: str) -> PriceReading:
        """Each AWS key's list price (USD); a key not read is a failure with its kind."""
        prices: dict[PriceKey, CloudPrice] = {}
        failures: dict[PriceKey, str] = {}
        for key in keys:
            if key.cloud is not Cloud.AWS:
                failures[key] = "not an aws price"
                continue
            if not time_budget.allows(0):
                failures[key] = "out of time"
                continue
            try:
                prices[key] = self._one(key)
            except Unreadable as exc:
                failures[key] = str(exc)
            except Exception as exc:  # noqa: BLE001 - whatever botocore raised, this key is unreadable
                failures[key] = error_kind(exc)
            if key in failures:
                log.warning("aws price %s unreadable: %s", key.label(), failures[key])
        return PriceReading(prices, failures)

    def _one(self, key: PriceKey) -> CloudPrice:
        found: set[tuple[Decimal, int]] = set()
        token: str | None = None
        for _ in range(MAX_PAGES):
            args: dict[str, Any] = {
                "ServiceCode": SERVICE_CODE,
                "Filters": filters(key),
                "FormatVersion": "aws_v1",
                "MaxResults": PAGE_SIZE,
            }
            if token:
                args["NextToken"] = token
            call = partial(self._call, args)
            page = retried(call, attempts=self.attempts, retryable=retryable, sleeper=self._sleeper)
            items = page.get("PriceList")
            if not isinstance(items, list) or len(items) > PAGE_SIZE:
                raise Unreadable("an answer without a PriceList")
            found |= {product_price(item, key) for item in items}
            next_token = page.get("NextToken")
            if not next_token:
                break
            if not isinstance(next_token, str) or next_token == token:
                raise Unreadable("a page token that repeats")
            token = next_token
        else:
            raise Unreadable(f"more than {MAX_PAGES} pages")
        if not found:
            raise Unreadable("no such product")
        if len(found) > 1:
            raise Unreadable("several products of different prices")
        amount, gpus = found.pop()
        return CloudPrice(amount, gpus, CURRENCY, self._now())

    def _call(self, args: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls += 1
        answer = self._pricing().get_products(**args)
        if not isinstance(answer, Mapping):
            raise Unreadable("an answer that is not an object")
        return answer

    def _pricing(self) -> Any:
        if self._client is None:
            import botocore.session
            from botocore.config import Config

            config = Config(
                connect_timeout=min(5.0, self._http_timeout),
                read_timeout=self._http_timeout,
                retries={"total_max_attempts": 1},  # retried here, within the time budget (bounded_retry)
            )
            session = botocore.session.get_session()
            self._client = session.create_client("pricing", region_name=ENDPOINT_REGION, config=config)
        return self._client

    def _now(self) -> datetime:
        if self._clock is not None:
            return self._clock()
        from datetime import UTC

        return datetime.now(UTC)


def product_price(item: Any, key: PriceKey) -> tuple[Decimal, int]:
    """(USD per hour, GPUs) of one PriceList item (a JSON text, as the API gives it, or its object)."""
    if isinstance(item, str):
        if len(item) > MAX_ITEM_BYTES:
            raise Unreadable("a product larger than gpufarm reads")
        try:
            item = json.loads(item)
        except ValueError:
            raise Unreadable("a product that is not JSON") from None
    if not isinstance(item, Mapping):
        raise Unreadable("a product that is not an object")
    attributes = _obj(_obj(item.get("product")).get("attributes"))
    if attributes.get("instanceType") != key.sku or attributes.get("regionCode", key.region) != key.region:
        raise Unreadable("a product of another instance type or region")
    gpus = _gpus(attributes.get("gpu"))
    on_demand = _obj(_obj(item.get("terms")).get("OnDemand"))
    hourly: set[Decimal] = set()
    for term in on_demand.values():
        for listed in _obj(_obj(term).get("priceDimensions")).values():
            dimension = _obj(listed)
            if dimension.get("unit") != "Hrs":
                continue
            usd = _obj(dimension.get("pricePerUnit")).get(CURRENCY)
            try:
                hourly.add(price_value(usd))
            except ValueError:
                raise Unreadable("a price that is not a finite non-negative number") from None
    if not hourly:
        raise Unreadable("no On-Demand USD price per hour")
    if len(hourly) > 1:
        raise Unreadable("several On-Demand prices per hour")
    return hourly.pop(), gpus


def _gpus(value: Any) -> int:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not text.isdigit() or not 0 < int(text) <= MAX_GPUS:
        raise Unreadable("no GPU count")
    return int(text)


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and isinstance(response.get("Error"), Mapping):
        return str(response["Error"].get("Code", ""))
    return ""


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    meta = response.get("ResponseMetadata") if isinstance(response, Mapping) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, Mapping) else None
    return status if isinstance(status, int) else 0


def retryable(exc: Exception) -> bool:
    """Throttling, a 5xx or a connection failure: worth another try."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ReadTimeoutError

    if isinstance(exc, BotoConnectionError | ReadTimeoutError):
        return True
    return _code(exc) in _RETRYABLE_CODES or _status(exc) == 429 or _status(exc) >= 500


def error_kind(exc: BaseException) -> str:
    """A failure by its kind (an AWS error code and status, or the exception's class), never its text."""
    code = _code(exc)
    if not _CODE_RE.match(code):
        code = ""  # an answer's code is the cloud's text: only a plain error code is repeated
    status = _status(exc)
    return f"{code or type(exc).__name__}{f' {status}' if status else ''}"
