"""The sync's refresh of the list prices: at most every refresh_hours, only the card's keys, the last known price
kept (stale) when a list cannot be read, and each outage said once, across invocations (a cache file read again by
a new context each time, as a new Lambda container would)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.adapters.price_cache import PriceCache
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.rates import Cloud
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import Event
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import PriceFeed, PriceReading, PriceState
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync.prices import refresh_prices

RATES = """rates:
  currency: USD
  refresh_hours: 24
  environments:
    hpc: {per_gpu_hour: {H100: 2.10}}
    cloud: {cloud: aws, region: us-east-1, instance_types: {H100: p5.48xlarge, A100: p4d.24xlarge}}
    slices: {cloud: azure, location: eastus, vm_sizes: {A100: Standard_NC24ads_A100_v4}}
"""
P5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")
P4 = PriceKey(Cloud.AWS, "us-east-1", "p4d.24xlarge")
NC = PriceKey(Cloud.AZURE, "eastus", "Standard_NC24ads_A100_v4")
LISTED = {P5: ("98.32", 8), P4: ("32.77", 8), NC: ("3.67", 1)}


class Lists:
    """Price lists in memory: the keys in `down` are unreadable."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.down: set[PriceKey] = set()
        self.asked: list[list[PriceKey]] = []

    def read(self, keys: Sequence[PriceKey], currency: str) -> PriceReading:
        self.asked.append(list(keys))
        up = {
            k: CloudPrice(Decimal(LISTED[k][0]), LISTED[k][1], currency, self.clock.now())
            for k in keys
            if k not in self.down
        }
        return PriceReading(up, {k: "ThrottlingException 400" for k in keys if k in self.down})


class Events:
    def __init__(self) -> None:
        self.posted: list[Event] = []

    def post_event(self, event: Event) -> None:
        self.posted.append(event)


class World:
    def __init__(self, tmp: Path, rates: str = RATES) -> None:
        self.clock = FakeClock()
        self.lists = Lists(self.clock)
        self.events = Events()
        self.chat = FakeChat()
        self.path = tmp / "prices.json"
        self.farm = parse_farm(FARM_YAML + rates)

    def invocation(self) -> GpuFarm:
        """A fresh container: nothing remembered but the cache file."""
        cache = PriceCache(str(self.path))
        return GpuFarm(
            incidents=FakeIncidents(self.clock),
            hosts=FakeHosts(),
            chat=self.chat,
            clock=self.clock,
            farm=self.farm,
            events=self.events,
            prices=cache,
            price_feed=PriceFeed(self.lists, cache),
        )

    def refresh(self):  # type: ignore[no-untyped-def]
        return refresh_prices(self.invocation().context)

    def posts(self) -> list[str]:
        return [s.text for s in self.chat.sent if s.target == "C0000000001"]


def test_the_cards_keys_are_read_and_cached_and_priced(tmp_path: Path) -> None:
    world = World(tmp_path)
    report = world.refresh()
    assert (report.status, report.read, report.told) == ("refreshed", 3, [])
    assert sorted(world.lists.asked[0], key=PriceKey.label) == sorted(LISTED, key=PriceKey.label)
    card = world.invocation().context.rate_card()
    h100 = card.rate("cloud", "H100")
    assert h100 is not None and h100.per_gpu_hour == Decimal("12.29") and not h100.stale
    assert card.rate("slices", "A100") is not None and world.events.posted == [] and world.posts() == []


def test_refreshed_at_most_every_refresh_hours(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.refresh()
    world.clock.advance(hours=23)
    assert world.refresh().status == "not due" and len(world.lists.asked) == 1
    world.clock.advance(hours=1)
    assert world.refresh().status == "refreshed" and len(world.lists.asked) == 2


def test_an_unreadable_key_keeps_its_last_price_stale_and_is_said_once_across_invocations(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.refresh()
    world.lists.down = {P5}
    for day in range(3):  # three refreshes, each a new invocation, while the list stays down
        world.clock.advance(hours=24)
        report = world.refresh()
        assert report.stale == [P5.label()] and report.told == ([P5.label()] if day == 0 else [])
    assert len(world.events.posted) == 1 and len(world.posts()) == 1
    event = world.events.posted[0]
    assert event.alert_type == "warning" and "aws/us-east-1/p5.48xlarge" in event.text and "98.32" in event.text
    assert "ThrottlingException" in event.text and "p5.48xlarge" in world.posts()[0]
    card = world.invocation().context.rate_card()
    h100 = card.rate("cloud", "H100")
    assert h100 is not None and h100.stale and h100.per_gpu_hour == Decimal("12.29")  # the last known, never zero
    assert card.stale_keys() == [P5]
    # Back: said once, then nothing.
    world.lists.down = set()
    world.clock.advance(hours=24)
    assert world.refresh().recovered == [P5.label()]
    world.clock.advance(hours=24)
    assert world.refresh().recovered == []
    assert [e.alert_type for e in world.events.posted] == ["warning", "success"] and len(world.posts()) == 2
    fresh = world.invocation().context.rate_card().rate("cloud", "H100")
    assert fresh is not None and not fresh.stale


def test_a_key_never_read_is_unpriced_not_zero_and_said_once(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.lists.down = {NC}
    assert world.refresh().unpriced == [NC.label()]
    world.clock.advance(hours=24)
    assert world.refresh().told == []
    assert world.invocation().context.rate_card().rate("slices", "A100") is None
    assert len(world.events.posted) == 1 and "never read" in world.events.posted[0].text


def test_a_key_new_to_the_card_is_read_before_the_refresh_is_due(tmp_path: Path) -> None:
    world = World(tmp_path, RATES.replace("{H100: p5.48xlarge, A100: p4d.24xlarge}", "{H100: p5.48xlarge}"))
    world.refresh()
    world.farm = parse_farm(FARM_YAML + RATES)
    world.clock.advance(hours=1)
    assert world.refresh().status == "refreshed" and P4 in world.lists.asked[-1]


def test_a_store_that_fails_never_fails_the_sync(tmp_path: Path) -> None:
    class Broken:
        def known(self) -> dict[PriceKey, CloudPrice]:
            return {}

        def load(self) -> PriceState:
            raise UpstreamError("s3 down")

        def save(self, state: PriceState) -> None:
            raise UpstreamError("s3 down")

    world = World(tmp_path)
    svc = world.invocation()
    svc.context.price_feed = PriceFeed(world.lists, Broken())
    assert refresh_prices(svc.context).status == "cache unreadable"
    report = svc.sync()
    assert report.prices["status"] == "cache unreadable"
    no_feed = World(tmp_path).invocation()
    no_feed.context.price_feed = None
    assert no_feed.sync().prices["status"] == "not configured"


def test_a_farm_priced_only_in_writing_reads_no_list(tmp_path: Path) -> None:
    world = World(tmp_path, "rates:\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.10}}\n")
    assert world.refresh().status == "no list prices" and world.lists.asked == []


def test_a_clock_before_the_last_refresh_refreshes_again(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.refresh()
    world.clock.advance(hours=-2)  # a sandbox reset, a clock set back
    assert world.refresh().status == "refreshed" and len(world.lists.asked) == 2


def test_the_simulated_price_lists_answer_through_the_real_adapters(tmp_path: Path) -> None:
    from gpufarm_sandbox.pricelists import LIST_PRICES, SimulatedPriceLists

    simulated = SimulatedPriceLists()
    keys = [PriceKey(Cloud.AWS if "-" in r else Cloud.AZURE, r, s) for r, s in LIST_PRICES]
    simulated.down = {keys[0]}
    reading = simulated.lists().read(keys, "USD")
    assert set(reading.prices) == set(keys[1:]) and reading.failures == {keys[0]: "ServiceUnavailableException 503"}
    for key in keys[1:]:
        usd, gpus = LIST_PRICES[key.region, key.sku]
        assert (reading.prices[key].per_instance_hour, reading.prices[key].gpus) == (Decimal(usd), gpus)


def test_keys_are_read_never_read_first_then_oldest(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.lists.down = {P4, NC}
    world.refresh()  # P5 read; P4 and NC never
    world.lists.down = {NC}
    world.clock.advance(hours=24)
    world.refresh()  # P4 read now, P5 again
    world.clock.advance(hours=24)
    world.refresh()
    assert world.lists.asked[-1] == [NC, P5, P4]  # never read, then the oldest read


def test_the_simulated_price_book_prices_the_example_farms_cloud_pool() -> None:
    from gpufarm_sandbox.pricelists import price_book

    example = parse_farm((Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text())
    book = price_book(example)
    p5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")
    assert book.known()[p5].per_instance_hour == Decimal("98.32") and book.known() is book.known()
