"""The rate card's cloud half on the local host: the scheduled sync reads the simulated AWS price list into the
host's price cache, and the example farm's cloud pool is then priced from it (its A100 by the written override):
every pool and model of the demo's farm has a price without a cloud."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from local_farm import driven

from gpufarm.adapters.price_cache import PriceCache
from gpufarm.cli.rates import card_rows
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import PriceKey, RateCard, RateSource
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration

P5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")


@pytest.fixture
def farm(local: LocalEnv) -> Iterator[LocalFarm]:
    with driven(local) as driver:
        yield driver


def test_the_sync_prices_the_cloud_pool_from_the_simulated_list(farm: LocalFarm) -> None:
    cache = PriceCache(farm.host.env["GPUFARM_PRICE_CACHE"], max_age_s=0)
    farm.post("/_sandbox/clock", {"advance": 900})
    assert farm.wait_for(lambda: P5 in cache.known(), timeout=60)
    example = parse_farm(Path(farm.host.env["GPUFARM_FARM_CONFIG"]).read_text(encoding="utf-8"))
    card = RateCard(example.rates, cache.known())
    h100 = card.rate("cloud-aws", "H100")
    assert h100 is not None and h100.source is RateSource.AWS and not h100.stale
    assert h100.per_gpu_hour == Decimal("98.32") / 8 * Decimal("0.72")  # the list, per GPU, savings plan
    a100 = card.rate("cloud-aws", "A100")
    assert a100 is not None and (a100.source, a100.per_gpu_hour) == (RateSource.FARM, Decimal("3.20"))
    # Every pool and model of the demo's farm is priced.
    assert all(not row["unpriced"] for row in card_rows(example, cache.known()))
