"""The price cache: the JSON it stores read back whole, a corrupt one ignored with one warning, bounded, in a file
or an S3 object (moto)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from gpufarm.adapters.price_cache import MAX_CACHE_BYTES, PriceCache
from gpufarm.config import ConfigurationError, Settings
from gpufarm.core.config.rates import Cloud
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.price_codec import NotACache, decode, encode
from gpufarm.core.money.prices import MAX_PRICE_KEYS, PriceEntry, PriceState

NOW = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)
P5 = PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge")
ND = PriceKey(Cloud.AZURE, "eastus", "Standard_ND96isr_H100_v5")
NC = PriceKey(Cloud.AZURE, "westeurope", "Standard_NC24ads_A100_v4")
STATE = PriceState(
    NOW,
    {
        P5: PriceEntry(CloudPrice(Decimal("98.32"), 8, "USD", NOW)),
        ND: PriceEntry(CloudPrice(Decimal("98.3200001"), 8, "USD", NOW, stale=True), told=True),
        NC: PriceEntry(None, told=True),
    },
)


def test_a_saved_cache_reads_back_whole_and_known_gives_its_prices(tmp_path: Path) -> None:
    cache = PriceCache(str(tmp_path / "rates" / "prices.json"))
    assert cache.load() == PriceState() and cache.known() == {}  # no cache yet: empty, not an error
    cache.save(STATE)
    assert cache.load() == STATE
    assert PriceCache(str(tmp_path / "rates" / "prices.json")).known() == {
        P5: STATE.entries[P5].price,
        ND: STATE.entries[ND].price,
    }
    stored = json.loads((tmp_path / "rates" / "prices.json").read_text())
    assert stored["entries"][0]["price"] == "98.32"  # a decimal string, never a float


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "\xff\xfe",
        json.dumps({"version": 2, "entries": []}),
        json.dumps({"version": 1, "refreshed_at": None, "entries": [{"cloud": "gcp"}]}),
        json.dumps(encode(STATE)).replace('"98.32"', '"-1"'),
        json.dumps(encode(STATE)).replace('"98.32"', '"NaN"'),
        json.dumps(encode(STATE)).replace('"gpus":8', '"gpus":0').replace('"gpus": 8', '"gpus": 0'),
        json.dumps(encode(STATE)).replace("+00:00", ""),
    ],
)
def test_a_corrupt_cache_is_ignored_with_one_warning(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    cache = PriceCache(str(path))
    with caplog.at_level(logging.WARNING, logger="gpufarm.adapters.price_cache"):
        assert cache.load() == PriceState()
        assert cache.load() == PriceState()
    assert len([r for r in caplog.records if "is not a cache" in r.getMessage()]) == 1
    cache.save(STATE)  # the next refresh replaces it
    assert cache.load() == STATE


def test_the_cache_is_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "prices.json"
    path.write_bytes(b" " * (MAX_CACHE_BYTES + 1))
    with caplog.at_level(logging.WARNING):
        assert PriceCache(str(path)).load() == PriceState()
    assert "larger than" in caplog.text
    many = {PriceKey(Cloud.AWS, "us-east-1", f"p{n}.48xlarge"): PriceEntry(None) for n in range(MAX_PRICE_KEYS + 1)}
    with pytest.raises(ValueError, match="at most"):
        encode(PriceState(NOW, many))
    with pytest.raises(NotACache, match="at most"):
        decode({"version": 1, "refreshed_at": None, "entries": [{}] * (MAX_PRICE_KEYS + 1)})


def test_known_is_read_at_most_every_max_age_and_keeps_the_last_when_the_store_fails(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    ticks = [0.0]
    cache = PriceCache(str(path), max_age_s=60, monotonic=lambda: ticks[0])
    PriceCache(str(path)).save(STATE)
    assert P5 in cache.known()
    path.write_text(json.dumps(encode(PriceState(NOW, {}))))
    ticks[0] = 30
    assert P5 in cache.known()  # not read again yet
    ticks[0] = 61
    assert cache.known() == {}
    PriceCache(str(path)).save(STATE)
    ticks[0] = 200
    assert P5 in cache.known()
    path.unlink()
    path.mkdir()  # the store fails to read (a directory where the cache was)
    ticks[0] = 400
    assert P5 in cache.known()  # the prices read before, not an error


def test_a_location_that_is_neither_s3_nor_a_file_is_refused() -> None:
    for location in ("s3://Bad_Bucket/x", "s3://bucket", "https://example.com/prices.json", "s3://bucket/../x"):
        with pytest.raises(ConfigurationError, match="GPUFARM_PRICE_CACHE"):
            PriceCache(location)


@mock_aws
def test_an_s3_object_cache_roundtrips_and_a_missing_object_is_empty() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="gpufarm-profiles")
    cache = PriceCache("s3://gpufarm-profiles/rates/prices.json", Settings(), client=s3)
    assert cache.load() == PriceState()
    cache.save(STATE)
    assert cache.load() == STATE
    body = s3.get_object(Bucket="gpufarm-profiles", Key="rates/prices.json")["Body"].read()
    assert json.loads(body)["version"] == 1
    gone = PriceCache("s3://no-such-bucket-here/rates/prices.json", Settings(), client=s3)
    with pytest.raises(UpstreamError, match="NoSuchBucket"):
        gone.save(STATE)
