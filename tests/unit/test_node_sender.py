"""The Datadog sender: size-bounded batches, merging, the outage buffer and its drop accounting."""

from __future__ import annotations

import gzip
import io
import json
import random
import string
from typing import Any

import pytest
from datadog_api_client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from gpufarm.node.collect import Series
from gpufarm.node.sender import MAX_BATCH_JSON_BYTES, DatadogSender, JsonLinesSender, json_size_bound

NOW = 1_700_000_000


class FakeMetricsApi:
    """Records submit_metrics calls; can fail with a queue of exceptions first."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = failures or []
        self.bodies: list[dict[str, Any]] = []
        self.encodings: list[Any] = []

    def submit_metrics(self, *, body: dict[str, Any], content_encoding: Any) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.bodies.append(body)
        self.encodings.append(content_encoding)


def _api_error(status: int) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = b'{"errors":["nope"]}'
    return exc


def _cycle(n: int, value: float = 1.0, metric: str = "gpufarm.gpu.utilization") -> list[Series]:
    return [Series(metric, value, ("environment:e", f"gpu_uuid:gpu-{i}", "gpu_ir:none")) for i in range(n)]


def test_series_json_size_bound_is_an_upper_bound_even_for_unicode() -> None:
    rng = random.Random(3)
    for _ in range(300):
        alphabet = string.ascii_letters + "é漢😀_:-"
        tags = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(0, 12))
        )
        series = Series("gpufarm.gpu.energy", rng.uniform(-1e300, 1e300), tags)
        body = {
            "metric": series.metric,
            "type": 1,
            "points": [{"timestamp": NOW, "value": series.value}],
            "resources": [{"name": "node-é", "type": "host"}],
            "tags": list(tags),
            "unit": "joule",
            "interval": 15,
        }
        assert json_size_bound(series, "node-é") + 64 >= len(json.dumps(body)) + 2


def test_points_of_later_cycles_merge_into_one_series_and_gzip_is_asked_for() -> None:
    api = FakeMetricsApi()
    sender = DatadogSender(api, "node-1", clock=lambda: NOW)
    sender.send(_cycle(3, 1.0), NOW - 30)
    sender.send(_cycle(3, 2.0), NOW - 15)
    assert sender.flush() is True
    (body,) = api.bodies
    assert len(body["series"]) == 3
    assert body["series"][0]["points"] == [{"timestamp": NOW - 30, "value": 1.0}, {"timestamp": NOW - 15, "value": 2.0}]
    assert body["series"][0]["resources"] == [{"name": "node-1", "type": "host"}]
    assert body["series"][0]["unit"] == "percent" and body["series"][0]["type"] == 3
    assert str(api.encodings[0]) == "gzip"
    assert sender.buffered == 0 and sender.take_dropped() == {}


def test_batches_stay_under_the_payload_limits() -> None:
    api = FakeMetricsApi()
    sender = DatadogSender(api, "node-1", clock=lambda: NOW, max_points=1_000_000)
    long_tags = tuple(f"tag{i}:{'x' * 150}" for i in range(10))
    for cycle in range(4):
        sender.send(
            [Series("gpufarm.gpu.utilization", float(i), (*long_tags, f"n:{i}")) for i in range(1500)], NOW - 60 + cycle
        )
    assert sender.flush() is True
    assert len(api.bodies) > 1
    assert sum(len(p["points"]) for b in api.bodies for p in b["series"]) == 6000
    for body in api.bodies:
        raw = json.dumps(body).encode()
        assert len(raw) <= MAX_BATCH_JSON_BYTES
        assert len(gzip.compress(raw)) < 512_000


@pytest.mark.parametrize(
    "failure", [_api_error(503), _api_error(429), _api_error(403), MaxRetryError(None, "/", "down")]
)
def test_an_outage_keeps_the_points_for_the_next_flush(failure: Exception) -> None:
    api = FakeMetricsApi([failure])
    sender = DatadogSender(api, "node-1", clock=lambda: NOW)
    sender.send(_cycle(5), NOW)
    assert sender.flush() is False and sender.buffered == 5
    assert sender.flush() is True and sender.buffered == 0
    assert len(api.bodies) == 1 and sender.stats["failures"] == 1


def test_a_full_buffer_drops_the_oldest_and_counts_them() -> None:
    api = FakeMetricsApi([OSError("refused")] * 10)
    sender = DatadogSender(api, "node-1", clock=lambda: NOW, max_points=12)
    for i in range(4):
        sender.send(_cycle(5, float(i)), NOW - 40 + i)
        sender.flush()
    # Whole oldest cycles go first until the rest fits: 20 points -> 10.
    assert sender.buffered == 10 and sender.take_dropped() == {"overflow": 10}
    api.failures.clear()
    assert sender.flush() is True
    values = sorted({p["value"] for s in api.bodies[0]["series"] for p in s["points"]})
    assert values == [2.0, 3.0]


def test_one_cycle_bigger_than_the_buffer_keeps_its_newest_points() -> None:
    sender = DatadogSender(FakeMetricsApi(), "node-1", clock=lambda: NOW, max_points=3)
    sender.send(_cycle(5), NOW)
    assert sender.buffered == 3 and sender.take_dropped() == {"overflow": 2}


def test_points_older_than_datadog_accepts_are_dropped_as_expired() -> None:
    now = [NOW]
    api = FakeMetricsApi([OSError("refused")])
    sender = DatadogSender(api, "node-1", clock=lambda: now[0])
    sender.send(_cycle(4), NOW)
    sender.flush()
    now[0] += 3600
    sender.send(_cycle(2), now[0])
    assert sender.flush() is True
    assert sender.take_dropped() == {"expired": 4}
    assert sum(len(s["points"]) for s in api.bodies[0]["series"]) == 2


def test_a_rejected_payload_is_dropped_not_retried_forever() -> None:
    api = FakeMetricsApi([_api_error(400)])
    sender = DatadogSender(api, "node-1", clock=lambda: NOW)
    sender.send(_cycle(3), NOW)
    assert sender.flush() is True
    assert sender.take_dropped() == {"rejected": 3} and sender.buffered == 0 and api.bodies == []


def test_a_partly_sent_buffer_resumes_where_it_stopped() -> None:
    api = FakeMetricsApi()
    sender = DatadogSender(api, "node-1", clock=lambda: NOW, max_batch_bytes=2_000)
    for i in range(3):
        sender.send(_cycle(10, float(i)), NOW - 30 + i)
    original = api.submit_metrics
    calls = {"n": 0}

    def flaky(**kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("reset")
        original(**kwargs)

    api.submit_metrics = flaky  # type: ignore[method-assign]
    assert sender.flush() is False
    sent = sum(len(s["points"]) for b in api.bodies for s in b["series"])
    assert sender.buffered == 30 - sent
    assert sender.flush() is True
    points = [(s["tags"][1], p["value"]) for b in api.bodies for s in b["series"] for p in s["points"]]
    assert len(points) == 30 and len(set(points)) == 30


def test_dry_run_prints_one_payload_per_cycle() -> None:
    out = io.StringIO()
    sender = JsonLinesSender("node-1", stream=out)
    sender.send([*_cycle(2), Series("gpufarm.gpu.energy", 5.0, ("environment:e",))], NOW)
    payload = json.loads(out.getvalue())
    assert [s["metric"] for s in payload["series"]] == ["gpufarm.gpu.utilization"] * 2 + ["gpufarm.gpu.energy"]
    assert payload["series"][2]["type"] == 1 and payload["series"][2]["interval"] == 15
    assert sender.flush() is True and sender.take_dropped() == {}
