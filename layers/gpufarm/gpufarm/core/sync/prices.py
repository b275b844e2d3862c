"""The sync's refresh of the clouds' list prices: at most every `rates.refresh_hours`, only the keys the rate card
needs, the last known price kept (stale) where a list cannot be read, and each outage said once.

The cache (a `PriceStore`: gpufarm.adapters.price_cache) holds, per key, the price last read and whether its outage
was told. A refresh reads every key of `RateCard.price_keys()` through the clouds' lists (`PriceLists`, which bound
their own time: gpufarm.adapters.price_lists); a key read is fresh; a key not read keeps its last known price marked
`stale` (or stays unpriced when it was never read, never zero). Keys are read oldest first, so a refresh that runs
out of its time budget is taken up by the next where it stopped. The first refresh that finds a key unreadable tells
the operators (one Datadog event and one post to their channel for all the keys newly unreadable), and marks the
entry told in the cache it saves, so the next refreshes, in later invocations, say nothing while the key stays
unreadable; the refresh that reads it again says so once and clears the mark. Told before saved: a save that fails
leaves the old cache, and the next sync's refresh (not due-gated by a cache it could not write) may say it again,
rather than an outage never said.

Never fails the sync: a store that cannot be read or written, or anything a cloud did, is in the report.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import Event
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import MAX_PRICE_KEYS, PriceEntry, PriceState

log = logging.getLogger(__name__)

EVENT_TAG = "gpufarm:prices"
AGGREGATION_KEY = "gpufarm-price-lists"
NEVER = datetime.min.replace(tzinfo=UTC)
# Keys named in one event or post; the rest are counted.
MAX_NAMED = 20


@dataclass
class PriceRefresh:
    """What the sync's price refresh did."""

    # not configured | no list prices | not due | refreshed | cache unreadable | not saved
    status: str = "not configured"
    read: int = 0
    stale: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    told: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


def refresh_prices(ctx: LeaseContext) -> PriceRefresh:
    """Refresh the cached list prices when due (see the module docstring)."""
    report = PriceRefresh()
    feed = ctx.price_feed
    if feed is None:
        return report
    keys = list(ctx.rate_card().price_keys())[:MAX_PRICE_KEYS]
    if not keys:
        report.status = "no list prices"
        return report
    try:
        state = feed.store.load()
    except GpufarmError as exc:
        log.warning("the price cache could not be read; prices are refreshed at the next sync: %s", exc)
        report.status = "cache unreadable"
        return report
    now = ctx.now()
    if not _due(state, keys, now, timedelta(hours=ctx.farm.rates.refresh_hours)):
        report.status = "not due"
        return report
    reading = feed.lists.read(_oldest_first(keys, state), ctx.farm.rates.currency)
    entries, newly, back = _merge(keys, state, reading.prices, now, report)
    _tell_unreadable(ctx, newly, entries, reading.failures)
    _tell_recovered(ctx, back, entries)
    report.told = [k.label() for k in newly]
    report.recovered = [k.label() for k in back]
    try:
        feed.store.save(PriceState(now, entries))
    except GpufarmError as exc:
        log.warning("the price cache could not be saved; the next sync refreshes again: %s", exc)
        report.status = "not saved"
        return report
    report.status = "refreshed"
    return report


def _due(state: PriceState, keys: Sequence[PriceKey], now: datetime, due_after: timedelta) -> bool:
    """Due after refresh_hours, for a key the card added since, and when the clock stands before the last refresh."""
    since = now - state.refreshed_at if state.refreshed_at is not None else None
    return not (since is not None and timedelta(0) <= since < due_after and set(keys) <= set(state.entries))


def _merge(
    keys: Sequence[PriceKey],
    state: PriceState,
    fresh_prices: Mapping[PriceKey, CloudPrice],
    now: datetime,
    report: PriceRefresh,
) -> tuple[dict[PriceKey, PriceEntry], list[PriceKey], list[PriceKey]]:
    """The cache's new entries, the keys newly unreadable (to tell) and those readable again (to tell)."""
    entries: dict[PriceKey, PriceEntry] = {}
    newly: list[PriceKey] = []
    back: list[PriceKey] = []
    for key in keys:
        before = state.entries.get(key)
        fresh = fresh_prices.get(key)
        if fresh is not None:
            if before is not None and before.told:
                back.append(key)
            entries[key] = PriceEntry(replace(fresh, read_at=now, stale=False), told=False)
            report.read += 1
            continue
        last = before.price if before is not None else None
        if before is None or not before.told:
            newly.append(key)
        entries[key] = PriceEntry(replace(last, stale=True) if last is not None else None, told=True)
        (report.stale if last is not None else report.unpriced).append(key.label())
    return entries, newly, back


def _oldest_first(keys: Sequence[PriceKey], state: PriceState) -> list[PriceKey]:
    """The keys never read first, then the longest unread: a refresh whose time budget ends before the last key
    (a card larger than one refresh reads) starts the next one where it stopped."""

    def read_at(key: PriceKey) -> datetime:
        entry = state.entries.get(key)
        return entry.price.read_at if entry is not None and entry.price is not None else NEVER

    return sorted(keys, key=read_at)


def _line(key: PriceKey, price: CloudPrice | None, why: str | None) -> str:
    if price is None:
        last = "never read: its pool's model is unpriced"
    else:
        when = f"{price.read_at:%Y-%m-%d %H:%M} UTC"
        last = f"last known {price.per_instance_hour} {price.currency} per instance-hour, read {when}"
    return f"{key.label()}: {last}" + (f" ({why})" if why else "")


def _named(lines: Sequence[str]) -> list[str]:
    named = [f"- {line}" for line in lines[:MAX_NAMED]]
    if len(lines) > MAX_NAMED:
        named.append(f"- and {len(lines) - MAX_NAMED} more")
    return named


def _tell_unreadable(
    ctx: LeaseContext, keys: Sequence[PriceKey], entries: dict[PriceKey, PriceEntry], failures: Mapping[PriceKey, str]
) -> None:
    if not keys:
        return
    lines = [_line(k, entries[k].price, failures.get(k)) for k in keys]
    title = f"gpufarm could not read {len(keys)} cloud list price(s)"
    text = (
        "The price lists did not give these prices; the last known price is used (marked stale) until they do, "
        "and a price never read leaves its pool's model unpriced, never zero. This is said once per outage.\n"
        + "\n".join(_named(lines))
    )
    _tell(ctx, Event(title, text, (EVENT_TAG,), AGGREGATION_KEY, "warning", int(ctx.now().timestamp())), title, lines)


def _tell_recovered(ctx: LeaseContext, keys: Sequence[PriceKey], entries: dict[PriceKey, PriceEntry]) -> None:
    if not keys:
        return
    lines = []
    for key in keys:
        price = entries[key].price
        amount = f"{price.per_instance_hour} {price.currency} per instance-hour" if price is not None else "read"
        lines.append(f"{key.label()}: {amount}")
    title = f"gpufarm reads {len(keys)} cloud list price(s) again"
    text = "The price lists give these prices again; they are no longer stale.\n" + "\n".join(_named(lines))
    _tell(ctx, Event(title, text, (EVENT_TAG,), AGGREGATION_KEY, "success", int(ctx.now().timestamp())), title, lines)


def _tell(ctx: LeaseContext, event: Event, title: str, lines: Sequence[str]) -> None:
    """One event and one post to the operators' channel; a failure of either is logged, never raised."""
    if ctx.events is not None:
        try:
            ctx.events.post_event(event)
        except GpufarmError as exc:
            log.warning("price list event not posted: %s", exc)
    text = f":money_with_wings: {inert(title)}\n" + "\n".join(inert(line) for line in _named(lines))
    ctx.post_operators(Message(text))
