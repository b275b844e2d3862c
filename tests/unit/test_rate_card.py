"""The rate card: prices per pool and model from the farm file and the clouds' list prices; refused at load when
wrong, unpriced (never zero) when nothing prices a model."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from fakes import FARM_YAML

from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard, RateSource, mig_fraction, round_cents

READ = datetime(2026, 12, 1, tzinfo=UTC)
RATES = """rates:
  currency: USD
  discounts: {savings-plan: 0.72}
  mig_fractions: {2g.20gb: 0.25}
  environments:
    hpc: {per_gpu_hour: {H100: 2.10}}
    cloud:
      cloud: aws
      region: us-east-1
      instance_types: {H100: p5.48xlarge, A100: p4d.24xlarge}
      purchase: savings-plan
      per_gpu_hour: {A100: 3.20}
    slices: {cloud: azure, location: eastus, vm_sizes: {A100: Standard_NC24ads_A100_v4}}
"""


def farm(rates: str = RATES):  # type: ignore[no-untyped-def]
    return parse_farm(FARM_YAML + rates)


def test_a_written_price_wins_and_a_list_price_is_divided_by_its_gpus_and_discounted() -> None:
    config = farm()
    p5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")
    card = RateCard(config.rates, {p5: CloudPrice(Decimal("98.32"), 8, "USD", READ)})
    hpc = card.rate("hpc", "h100")
    assert hpc is not None and (hpc.per_gpu_hour, hpc.source) == (Decimal("2.10"), RateSource.FARM)
    aws = card.rate("cloud", "H100")
    assert aws is not None and aws.source is RateSource.AWS and aws.as_of == READ
    assert aws.per_gpu_hour == Decimal("98.32") / 8 * Decimal("0.72")
    a100 = card.rate("cloud", "A100")
    assert a100 is not None and a100.per_gpu_hour == Decimal("3.20")  # the override, not the list


def test_nothing_prices_a_model_then_it_has_no_rate_never_zero() -> None:
    card = RateCard(farm().rates, {})
    assert card.rate("cloud", "H100") is None  # the list price was never read
    assert card.cost("slices", "L4", 10.0) is None  # the pool names no SKU for L4
    assert card.unpriced({"hpc": ("H100",), "slices": ("A100", "L4")}) == [("slices", "A100"), ("slices", "L4")]


def test_a_price_in_another_currency_is_not_used() -> None:
    key = PriceKey(Cloud.AZURE, "eastus", "Standard_NC24ads_A100_v4")
    card = RateCard(farm().rates, {key: CloudPrice(Decimal("3.67"), 1, "EUR", READ)})
    assert card.rate("slices", "A100") is None


def test_the_last_known_price_is_used_and_said_stale() -> None:
    key = PriceKey(Cloud.AZURE, "eastus", "Standard_NC24ads_A100_v4")
    card = RateCard(farm().rates, {key: CloudPrice(Decimal("3.67"), 1, "USD", READ, stale=True)})
    rate = card.rate("slices", "A100")
    assert rate is not None and rate.stale and rate.per_gpu_hour == Decimal("3.67")
    assert card.stale_keys() == [key]
    assert [k.label() for k in card.price_keys()] == [
        "aws/us-east-1/p5.48xlarge",
        "aws/us-east-1/p4d.24xlarge",
        "azure/eastus/Standard_NC24ads_A100_v4",
    ]


def test_a_slice_costs_its_share_of_the_gpu() -> None:
    config = farm()
    card = RateCard(config.rates)
    assert mig_fraction(config.rates, "3g.40gb") == Decimal(3) / 7
    assert mig_fraction(config.rates, "2g.20gb") == Decimal("0.25")
    assert mig_fraction(config.rates, "unknown") == Decimal(1) / 7
    whole = card.rate("hpc", "H100")
    one = card.slice_rate("hpc", "H100", "1g.10gb")
    assert whole is not None and one is not None
    assert round(one.per_gpu_hour, 12) == round(whole.per_gpu_hour / 7, 12)
    assert round_cents(whole.cost(1.5)) == Decimal("3.15")


@pytest.mark.parametrize(
    ("rates", "says"),
    [
        ("rates: {environments: {hpc: {per_gpu_hour: {H100: -1}}}}", "greater than or equal to 0"),
        ("rates: {currency: usd}", "ISO 4217"),
        ("rates: {currency: USD, environments: {hpc: {currency: EUR, per_gpu_hour: {H100: 2}}}}", "not the rate card"),
        ("rates: {environments: {hpc: {per_gpu_hour: {B200: 9}}}}", "offers no 'B200'"),
        ("rates: {environments: {mars: {per_gpu_hour: {H100: 9}}}}", "'mars' is not an environment"),
        ("rates: {environments: {cloud: {cloud: aws, instance_types: {H100: p5.48xlarge}}}}", "names the region"),
        ("rates: {environments: {slices: {cloud: azure, vm_sizes: {A100: Standard_NC24}}}}", "names the location"),
        ("rates: {environments: {hpc: {instance_types: {H100: p5.48xlarge}}}}", "need cloud: aws or azure"),
        ("rates: {discounts: {spot: 1.5}}", "less than or equal to 1"),
        (
            "rates: {environments: {cloud: {cloud: aws, region: us-east-1, purchase: spot}}}",
            "no factor for spot",
        ),
        (
            "rates: {currency: EUR, environments: {cloud: {cloud: aws, region: us-east-1, "
            "instance_types: {H100: p5.48xlarge}}}}",
            "in USD, not EUR",
        ),
    ],
)
def test_a_wrong_rate_card_is_refused_at_load(rates: str, says: str) -> None:
    with pytest.raises(FarmConfigError, match=says):
        farm(rates + "\n")


def test_a_lease_on_slices_pays_their_share_and_a_dedicated_lease_whole_gpus() -> None:
    from gpufarm.core.money.lease_rate import lease_rate

    card = RateCard(farm().rates)
    whole = card.rate("hpc", "H100")
    assert whole is not None
    assert lease_rate(card, "hpc", "H100", ()) == whole
    slices = ["h1=0.1/mig-aaaaaaaa-1111/1g.10gb", "h1=0.2/mig-bbbbbbbb-2222/3g.40gb", "junk"]
    rate = lease_rate(card, "hpc", "H100", slices)
    assert rate is not None
    assert round(rate.per_gpu_hour, 9) == round(whole.per_gpu_hour * 4 / 14, 9)
    assert lease_rate(card, "slices", "L4", ()) is None and lease_rate(card, None, "H100") is None
