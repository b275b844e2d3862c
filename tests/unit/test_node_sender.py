"""The Datadog sender: the JSON it writes, size-bounded batches, merging, the outage buffer and drop accounting."""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import string
from typing import Any

import pytest
import zstandard

from gpufarm_node.catalog import METRICS
from gpufarm_node.collect import Series
from gpufarm_node.compression import ENCODINGS, GZIP, ZSTD, compressor, default_encoding
from gpufarm_node.sender import DatadogSender, IntakeError, JsonLinesSender, series_json

NOW = 1_700_000_000


def _decompress(encoding: str, data: bytes) -> bytes:
    if encoding == ZSTD:
        return zstandard.ZstdDecompressor().decompress(data)
    return gzip.decompress(data)


class FakeIntake:
    """Keeps the payloads posted to it (decompressed); can fail with a queue of errors first."""

    def __init__(self, failures: list[Exception] | None = None, encoding: str = ZSTD) -> None:
        self.encoding = encoding
        self.failures = failures or []
        self.bodies: list[dict[str, Any]] = []
        self.sizes: list[tuple[int, int]] = []

    def post(self, compressed: bytes) -> None:
        if self.failures:
            raise self.failures.pop(0)
        raw = _decompress(self.encoding, compressed)
        self.sizes.append((len(compressed), len(raw)))
        self.bodies.append(json.loads(raw))


def _cycle(n: int, value: float = 1.0, metric: str = "gpufarm.gpu.utilization") -> list[Series]:
    return [Series(metric, value, ("environment:e", f"gpu_uuid:gpu-{i}", "gpu_ir:none")) for i in range(n)]


def _points(intake: FakeIntake) -> list[tuple[str, str, float]]:
    return [
        (s["metric"], ",".join(s["tags"]), p["value"]) for b in intake.bodies for s in b["series"] for p in s["points"]
    ]


def test_the_payload_is_exactly_the_v2_series_shape_for_any_tag_text() -> None:
    rng = random.Random(3)
    alphabet = string.ascii_letters + 'é漢😀_:-"\\/'
    series = []
    for i in range(200):
        tags = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(rng.randint(0, 8)))
        metric = rng.choice(sorted(METRICS))
        series.append(Series(metric, rng.choice([0.0, 1.5, -2.25e300, 12345678901.0, float(i)]), (*tags, f"n:{i}")))
    intake = FakeIntake()
    sender = DatadogSender(intake, "node-é", interval=15, clock=lambda: NOW)
    sender.send(series, NOW)
    assert sender.flush() is True
    (body,) = intake.bodies
    expected = [series_json(s, NOW, "node-é", 15) for s in series]

    def order(item: dict[str, Any]) -> str:
        return json.dumps(item, sort_keys=True)

    assert sorted(body["series"], key=order) == sorted(expected, key=order)


def test_points_of_later_cycles_merge_into_one_series() -> None:
    intake = FakeIntake()
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW)
    sender.send(_cycle(3, 1.0), NOW - 30)
    sender.send(_cycle(3, 2.0), NOW - 15)
    assert sender.flush() is True
    (body,) = intake.bodies
    assert len(body["series"]) == 3
    assert body["series"][0]["points"] == [{"timestamp": NOW - 30, "value": 1.0}, {"timestamp": NOW - 15, "value": 2.0}]
    assert body["series"][0]["resources"] == [{"name": "node-1", "type": "host"}]
    assert body["series"][0]["unit"] == "percent" and body["series"][0]["type"] == 3
    assert sender.buffered == 0 and sender.take_dropped() == {}
    assert sender.stats["requests"] == 1 and sender.stats["points"] == 6


def test_batches_stay_under_the_payload_limits_and_lose_nothing() -> None:
    intake = FakeIntake()
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW, max_points=1_000_000, max_raw_bytes=400_000)
    long_tags = tuple(f"tag{i}:{'x' * 150}" for i in range(10))
    for cycle in range(4):
        sender.send(
            [Series("gpufarm.gpu.utilization", float(i), (*long_tags, f"n:{i}")) for i in range(1500)], NOW - 60 + cycle
        )
    assert sender.flush() is True
    assert len(intake.bodies) > 1 and all(raw <= 400_000 for _, raw in intake.sizes)
    assert sum(len(s["points"]) for b in intake.bodies for s in b["series"]) == 6000


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_batch_that_compresses_badly_is_cut_smaller(encoding: str) -> None:
    rng = random.Random(5)
    intake = FakeIntake(encoding=encoding)
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW, max_compressed_bytes=20_000)
    noise = [Series("gpufarm.gpu.utilization", 1.0, (f"r:{rng.getrandbits(256):064x}",)) for _ in range(2000)]
    sender.send(noise, NOW)
    assert sender.flush() is True
    assert len(intake.bodies) >= 4 and all(zipped < 20_000 for zipped, _ in intake.sizes)
    assert len(_points(intake)) == 2000


@pytest.mark.parametrize("status", [0, 401, 403, 429, 500, 503])
def test_an_outage_keeps_the_points_for_the_next_flush(status: int) -> None:
    intake = FakeIntake([IntakeError(status, "x", retry=True)])
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW)
    sender.send(_cycle(5), NOW)
    assert sender.flush() is False and sender.buffered == 5
    assert sender.flush() is True and sender.buffered == 0
    assert len(intake.bodies) == 1 and sender.stats["failures"] == 1


def test_a_full_buffer_drops_the_oldest_cycles_and_counts_them() -> None:
    intake = FakeIntake([IntakeError(0, "refused", retry=True)] * 10)
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW, max_points=12)
    for i in range(4):
        sender.send(_cycle(5, float(i)), NOW - 40 + i)
        sender.flush()
    # Whole oldest cycles go first until the rest fits: 20 points -> 10.
    assert sender.buffered == 10 and sender.take_dropped() == {"overflow": 10}
    intake.failures.clear()
    assert sender.flush() is True
    assert sorted({v for _, _, v in _points(intake)}) == [2.0, 3.0]


def test_one_cycle_bigger_than_the_buffer_keeps_its_newest_points() -> None:
    sender = DatadogSender(FakeIntake(), "node-1", clock=lambda: NOW, max_points=3)
    sender.send(_cycle(5), NOW)
    assert sender.buffered == 3 and sender.take_dropped() == {"overflow": 2}


def test_points_older_than_datadog_accepts_are_dropped_as_expired() -> None:
    now = [NOW]
    intake = FakeIntake([IntakeError(0, "refused", retry=True)])
    sender = DatadogSender(intake, "node-1", clock=lambda: now[0])
    sender.send(_cycle(4), NOW)
    sender.flush()
    now[0] += 3600
    sender.send(_cycle(2), now[0])
    assert sender.flush() is True
    assert sender.take_dropped() == {"expired": 4} and len(_points(intake)) == 2


def test_a_rejected_payload_is_dropped_not_retried_forever() -> None:
    intake = FakeIntake([IntakeError(400, '{"errors":["bad"]}', retry=False)])
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW)
    sender.send(_cycle(3), NOW)
    assert sender.flush() is True
    assert sender.take_dropped() == {"rejected": 3} and sender.buffered == 0 and intake.bodies == []


def test_non_finite_values_are_dropped_because_json_cannot_carry_them() -> None:
    intake = FakeIntake()
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW)
    sender.send([*_cycle(2), Series("gpufarm.gpu.utilization", math.nan, ("a:b",))], NOW)
    assert sender.flush() is True
    assert len(_points(intake)) == 2 and sender.take_dropped() == {"rejected": 1}


def test_a_partly_sent_buffer_resumes_where_it_stopped() -> None:
    intake = FakeIntake()
    sender = DatadogSender(intake, "node-1", clock=lambda: NOW, max_raw_bytes=2_000)
    for i in range(3):
        sender.send(_cycle(10, float(i)), NOW - 30 + i)
    real_post = intake.post
    calls = {"n": 0}

    def flaky(compressed: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise IntakeError(503, "busy", retry=True)
        real_post(compressed)

    intake.post = flaky  # type: ignore[method-assign]
    assert sender.flush() is False
    assert sender.buffered == 30 - len(_points(intake))
    assert sender.flush() is True
    points = _points(intake)
    assert len(points) == 30 and len(set(points)) == 30


def test_dry_run_prints_one_payload_per_cycle() -> None:
    out = io.StringIO()
    sender = JsonLinesSender("node-1", stream=out)
    sender.send([*_cycle(2), Series("gpufarm.gpu.energy", 5.0, ("environment:e",))], NOW)
    payload = json.loads(out.getvalue())
    assert [s["metric"] for s in payload["series"]] == ["gpufarm.gpu.utilization"] * 2 + ["gpufarm.gpu.energy"]
    assert payload["series"][2]["type"] == 1 and payload["series"][2]["interval"] == 15
    assert sender.flush() is True and sender.take_dropped() == {}


def test_the_column_wise_push_writes_what_the_point_by_point_push_writes() -> None:
    rng = random.Random(7)
    sender = DatadogSender(FakeIntake(), "node-1", clock=lambda: NOW)
    shape = [
        (rng.choice(sorted(METRICS)), (f"gpu_uuid:gpu-{i}", f"n:{rng.random()}", "pct:100%s%%")) for i in range(300)
    ]
    for cycle in range(4):
        values = [rng.choice([0.0, 1.0, 0.1 + cycle, 1e-7, 81_920.0 * i]) for i in range(300)]
        sender.send(
            [Series(metric, value, tags) for (metric, tags), value in zip(shape, values, strict=True)], NOW - 60 + cycle
        )
    fast = sender._whole_cycles(5_000_000)  # the two paths of one push, compared
    assert fast is not None and fast[1:3] == (300, 1200) and fast[3] >= len(fast[0])  # size: a bound
    assert fast is not None
    assert fast == sender._point_by_point(5_000_000)
    # A cycle that lists another series sends the whole queue point by point, as one batch.
    sender.send([*_cycle(2), Series("gpufarm.gpu.energy", 5.0, ("environment:e",))], NOW)
    assert sender._whole_cycles(5_000_000) is None


def test_zstd1_is_the_default_and_gzip_writes_the_same_json() -> None:
    assert default_encoding() == ZSTD  # zstandard is a dependency of gpufarm-node
    bodies = []
    for encoding in ENCODINGS:
        intake = FakeIntake(encoding=encoding)
        sender = DatadogSender(intake, "node-1", clock=lambda: NOW)
        for cycle in range(4):
            sender.send(_cycle(50, float(cycle)), NOW - 60 + cycle)
        assert sender.flush() is True
        bodies.append(intake.bodies)
        ((compressed, raw),) = intake.sizes
        assert sender.stats["compressed_bytes"] == compressed and sender.stats["raw_bytes"] >= raw
    assert bodies[0] == bodies[1] and len(bodies[0][0]["series"]) == 50


def test_the_compressors_round_trip_and_an_unknown_encoding_is_refused() -> None:
    data = json.dumps({"series": [{"metric": "m", "points": [{"timestamp": NOW, "value": 1.5}]}] * 100}).encode()
    assert _decompress(ZSTD, compressor(ZSTD)(data)) == data
    assert _decompress(GZIP, compressor(GZIP)(data)) == data
    with pytest.raises(ValueError, match="unsupported series encoding 'br'"):
        compressor("br")
