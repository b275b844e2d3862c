"""`gpufarm rates`: every pool and model with its price, source, as-of and staleness from the farm file and the
cached list prices; unpriced never shown as zero; bad input exits 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import FARM_YAML

from gpufarm.adapters.price_cache import PriceCache
from gpufarm.cli.rates import rates
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.rates import Cloud
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.prices import PriceEntry, PriceState
from gpufarm.handlers import runtime as rt

pytestmark = pytest.mark.unit

READ = datetime(2026, 12, 7, 6, tzinfo=UTC)
RATES = """rates:
  currency: USD
  discounts: {savings-plan: 0.72}
  environments:
    hpc: {per_gpu_hour: {H100: 2.10}}
    cloud:
      cloud: aws
      region: us-east-1
      instance_types: {H100: p5.48xlarge, A100: p4d.24xlarge}
      purchase: savings-plan
"""
P5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[PriceCache]:
    book = PriceCache(str(tmp_path / "prices.json"))
    book.save(PriceState(READ, {P5: PriceEntry(CloudPrice(Decimal("98.32"), 8, "USD", READ, stale=True), told=True)}))
    rt.override(farm=parse_farm(FARM_YAML + RATES), prices=book)
    yield book
    rt.reset()


def test_every_pool_and_model_with_its_price_source_as_of_and_staleness(cache: PriceCache) -> None:
    done = CliRunner().invoke(rates, ["--format", "json"])
    assert done.exit_code == 0, done.output
    shown = {(r["pool"], r["model"]): r for r in json.loads(done.output)["rates"]}
    assert set(shown) == {("hpc", "H100"), ("cloud", "H100"), ("cloud", "A100"), ("slices", "A100"), ("slices", "L4")}
    assert shown["hpc", "H100"] == {
        "pool": "hpc",
        "model": "H100",
        "per_gpu_hour": "2.10",
        "currency": "USD",
        "unpriced": False,
        "source": "farm",
        "as_of": None,
        "stale": False,
    }
    aws = shown["cloud", "H100"]
    assert (aws["per_gpu_hour"], aws["source"], aws["stale"]) == ("8.85", "aws", True)  # 98.32 / 8 x 0.72
    assert aws["as_of"] == READ.isoformat()
    never = shown["cloud", "A100"]
    assert (never["per_gpu_hour"], never["unpriced"]) == (None, True)  # never read: unpriced, not zero
    assert json.loads(done.output)["stale_list_prices"] == ["aws/us-east-1/p5.48xlarge"]
    table = CliRunner().invoke(rates, ["--pool", "cloud"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split() == ["POOL", "MODEL", "PER", "GPU-HOUR", "SOURCE", "AS", "OF", "STALE"]
    assert "8.85 USD" in lines[1] and "stale" in lines[1] and "unpriced" in lines[2]
    assert "hpc" not in table.output and "stale list prices" in table.output


def test_without_a_cache_only_written_prices(cache: PriceCache) -> None:
    rt.override(prices=None)
    done = CliRunner().invoke(rates, ["--format", "json"])
    shown = {(r["pool"], r["model"]): r["per_gpu_hour"] for r in json.loads(done.output)["rates"]}
    assert shown["hpc", "H100"] == "2.10" and shown["cloud", "H100"] is None


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--pool", "ghost"], "not a pool"), (["--format", "xml"], "Invalid value"), (["--bogus"], "No such option")],
)
def test_bad_input_exits_2(cache: PriceCache, args: list[str], words: str) -> None:
    done = CliRunner().invoke(rates, args)
    assert done.exit_code == 2 and words in done.output


def test_an_invalid_farm_file_exits_2(cache: PriceCache, tmp_path: Path) -> None:
    bad = tmp_path / "farm.yaml"
    bad.write_text(FARM_YAML + RATES.replace("2.10", "-1"))
    done = CliRunner().invoke(rates, ["--farm-config", str(bad)])
    assert done.exit_code == 2 and "error:" in done.output


def test_the_runtime_builds_the_cache_and_the_feed_from_gpufarm_price_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufarm.adapters.price_lists import CloudPriceLists

    monkeypatch.setenv("GPUFARM_PRICE_CACHE", str(tmp_path / "prices.json"))
    rt.reset()
    try:
        runtime = rt.current()
        book, feed = runtime.prices(), runtime.price_feed()
        assert isinstance(book, PriceCache) and book.location == str(tmp_path / "prices.json")
        assert feed is not None and feed.store is book and isinstance(feed.lists, CloudPriceLists)
    finally:
        rt.reset()
    monkeypatch.delenv("GPUFARM_PRICE_CACHE")
    try:
        assert rt.current().prices() is None and rt.current().price_feed() is None
    finally:
        rt.reset()


def test_gpufarm_report_prices_a_cloud_pool_from_the_cached_list(cache: PriceCache, tmp_path: Path) -> None:
    from fakes import FakeClock, FakeIncidents

    from gpufarm.cli.report import report
    from gpufarm.core.kernel import fields as f
    from gpufarm.core.kernel.model import isoformat

    now = datetime(2026, 12, 10, 12, tzinfo=UTC)
    store = FakeIncidents(FakeClock(now))
    store.create(
        "GPU request: nlp/llm",
        {
            f.STATE: "stable",
            f.PHASE: "allocated",
            f.TEAM: "nlp",
            f.PROJECT: "llm",
            f.ENVIRONMENT: "cloud",
            f.GPU_MODEL: "H100",
            f.GPU_COUNT: "8",
            f.HOST_GPUS: ["node-1=8"],
            f.HOSTS: ["node-1"],
            f.ALLOCATED_AT: isoformat(datetime(2026, 12, 9, tzinfo=UTC)),
            f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 12, 10, tzinfo=UTC)),
            f.GPU_HOURS_HELD: "192.000",
            f.GPU_HOURS_BUSY: "192.000",
            f.GPU_HOURS_BY_MONTH: ["2026-12=192.000"],
        },
    )
    rt.override(clock=FakeClock(now), incidents=store)
    done = CliRunner().invoke(report, ["--by", "project", "--format", "json"])
    assert done.exit_code == 0, done.output
    [row] = [r for r in json.loads(done.output)["rows"] if r["group"] == "llm"]
    # 192 GPU-hours at the stale list price: 98.32 / 8 GPUs x 0.72 (savings plan) = 8.8488 an hour.
    assert row["cost"]["busy"] == pytest.approx(
        float(Decimal("192") * Decimal("98.32") / 8 * Decimal("0.72")), abs=0.01
    )
    rt.override(prices=None)
    unpriced = CliRunner().invoke(report, ["--by", "project", "--format", "json"])
    [row] = [r for r in json.loads(unpriced.output)["rows"] if r["group"] == "llm"]
    assert row["cost"]["unpriced"] is True and row["cost"]["busy"] is None
