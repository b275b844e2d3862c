"""The price cache as JSON: what the cache adapters store, and the check that what they read back is a cache.

    {"version": 1, "refreshed_at": "2026-12-07T06:00:00+00:00",
     "entries": [{"cloud": "aws", "region": "us-east-1", "sku": "p5.48xlarge", "price": "98.32", "gpus": 8,
                  "currency": "USD", "read_at": "2026-12-07T06:00:00+00:00", "stale": false, "told": false}]}

An entry never read has `"price": null` (its outage may have been told). Prices are decimal strings, never floats.
Reading is strict: anything else (another version, a key the rate card could not hold, a negative or non-finite
price, more than MAX_PRICE_KEYS entries) is not a cache, and `decode` raises ValueError naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from gpufarm.core.config.rate_terms import MAX_PRICE, Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import MAX_PRICE_KEYS, PriceEntry, PriceState

VERSION = 1
# A list price per instance hour: the rate card's bound on a GPU-hour times the most GPUs an instance holds.
MAX_INSTANCE_PRICE = MAX_PRICE * 64
MAX_GPUS = 64
_MAX_TEXT = 80


class NotACache(ValueError):
    """What was read back is not a price cache this module wrote (or a price is not one)."""


def encode(state: PriceState) -> dict[str, Any]:
    """The cache as a JSON object (ValueError past MAX_PRICE_KEYS entries)."""
    if len(state.entries) > MAX_PRICE_KEYS:
        raise ValueError(f"{len(state.entries)} prices; a cache holds at most {MAX_PRICE_KEYS}")
    entries = []
    for key in sorted(state.entries, key=PriceKey.label):
        entry = state.entries[key]
        price = entry.price
        item: dict[str, Any] = {"cloud": key.cloud.value, "region": key.region, "sku": key.sku, "told": entry.told}
        if price is None:
            item["price"] = None
        else:
            item |= {
                "price": str(price.per_instance_hour),
                "gpus": price.gpus,
                "currency": price.currency,
                "read_at": price.read_at.isoformat(),
                "stale": price.stale,
            }
        entries.append(item)
    refreshed = state.refreshed_at.isoformat() if state.refreshed_at is not None else None
    return {"version": VERSION, "refreshed_at": refreshed, "entries": entries}


def decode(data: Any) -> PriceState:
    """The cache in a JSON object read back; ValueError when it is not one this module wrote."""
    if not isinstance(data, Mapping) or data.get("version") != VERSION:
        raise NotACache("not a price cache of version 1")
    entries = data.get("entries")
    if not isinstance(entries, list) or len(entries) > MAX_PRICE_KEYS:
        raise NotACache(f"entries is not a list of at most {MAX_PRICE_KEYS}")
    refreshed = data.get("refreshed_at")
    out: dict[PriceKey, PriceEntry] = {}
    for item in entries:
        key, entry = _entry(item)
        out[key] = entry
    return PriceState(None if refreshed is None else _time(refreshed), out)


def _entry(item: Any) -> tuple[PriceKey, PriceEntry]:
    if not isinstance(item, Mapping):
        raise NotACache("an entry that is not an object")
    try:
        cloud = Cloud(str(item.get("cloud")))
    except ValueError:
        raise NotACache("an entry of no known cloud") from None
    key = PriceKey(cloud, _text(item.get("region")), _text(item.get("sku")))
    told = item.get("told")
    if not isinstance(told, bool):
        raise NotACache(f"{key.label()}: told is not true or false")
    if item.get("price") is None:
        return key, PriceEntry(None, told)
    stale = item.get("stale")
    gpus = item.get("gpus")
    if not isinstance(stale, bool) or not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 < gpus <= MAX_GPUS:
        raise NotACache(f"{key.label()}: gpus or stale is not what a cache holds")
    price = CloudPrice(
        per_instance_hour=price_value(item.get("price")),
        gpus=gpus,
        currency=_currency(item.get("currency")),
        read_at=_time(item.get("read_at")),
        stale=stale,
    )
    return key, PriceEntry(price, told)


def price_value(value: Any) -> Decimal:
    """A list price per instance hour as a cloud or the cache writes it (a decimal string or number): finite,
    non-negative and within MAX_INSTANCE_PRICE, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise NotACache("a price that is not a number")
    try:
        amount = Decimal(str(value).strip()[:_MAX_TEXT])
    except InvalidOperation:
        raise NotACache("a price that is not a number") from None
    if not amount.is_finite() or amount < 0 or amount > MAX_INSTANCE_PRICE:
        raise NotACache("a price that is not a finite non-negative amount")
    return amount


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or not value.isprintable():
        raise NotACache("an entry's region or sku is not a short text")
    return value


def _currency(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 3 or not value.isalpha() or not value.isupper():
        raise NotACache("a currency that is not an ISO 4217 code")
    return value


def _time(value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise NotACache("a time that is not an ISO 8601 text")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise NotACache("a time that is not an ISO 8601 text") from None
    if moment.tzinfo is None:
        raise NotACache("a time without its zone")
    return moment
