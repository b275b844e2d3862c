"""Metric intake rules of the sandbox, in process (no sockets): host tags stamped at ingest, time limits, validation."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import zstandard
from werkzeug.test import Client

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.query import QueryError

KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}


@pytest.fixture
def sb() -> Iterator[Sandbox]:
    yield Sandbox()


def call(sb: Sandbox, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    headers = {**KEYS, **kw.pop("headers", {})}
    data = kw.pop("data", None)
    if body is not None:
        data = json.dumps(body).encode()
    response = Client(sb).open(path, method=method, data=data, headers=headers, **kw)
    text = response.get_data(as_text=True)
    return response.status_code, json.loads(text) if text else None


def submit(sb: Sandbox, *series: dict[str, Any]) -> list[str]:
    status, body = call(sb, "POST", "/api/v2/series", {"series": list(series)})
    assert status == 202, body
    return list(body["errors"])


def gauge(metric: str, points: list[tuple[float, float]], host: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metric": metric,
        "type": 3,
        "points": [{"timestamp": int(t), "value": v} for t, v in points],
    }
    if host:
        out["resources"] = [{"type": "host", "name": host}]
    out.update(extra)
    return out


def test_host_tags_are_stamped_at_ingest_and_history_keeps_the_old_owner(sb: Sandbox) -> None:
    now = sb.clock.now()
    assert call(sb, "PUT", "/api/v1/tags/hosts/gpu-1", {"tags": ["ir:ir-1", "gpufarm:managed"]})[0] == 201
    assert submit(sb, gauge("gpufarm.gpu.utilization", [(now - 600, 10.0), (now - 540, 20.0)], "gpu-1")) == []
    # The host changes hands: later points carry the new IR, earlier points keep the old one.
    assert call(sb, "PUT", "/api/v1/tags/hosts/gpu-1", {"tags": ["ir:ir-2", "gpufarm:managed"]})[0] == 201
    assert submit(sb, gauge("gpufarm.gpu.utilization", [(now - 60, 90.0)], "gpu-1")) == []
    groups = {
        g.group_tags: g.points
        for g in sb.metrics.query_series("avg:gpufarm.gpu.utilization{*} by {ir}", now - 900, now)
    }
    assert set(groups) == {("ir:ir-1",), ("ir:ir-2",)}
    assert [v for _, v in groups[("ir:ir-1",)]] == [10.0, 20.0]
    assert [v for _, v in groups[("ir:ir-2",)]] == [90.0]
    # host:<name> is a tag of every point the host sent, and the host counts as reporting.
    by_host = sb.metrics.query_series("sum:gpufarm.gpu.utilization{host:gpu-1,gpufarm:managed}", now - 900, now)
    assert len(by_host) == 1 and sum(v for _, v in by_host[0].points) == 120.0
    assert sb.hosts.dump()["hosts"]["gpu-1"]["last_reported"] == pytest.approx(now, abs=5)


def test_points_outside_the_intake_window_are_dropped_and_reported(sb: Sandbox) -> None:
    now = sb.clock.now()
    errors = submit(sb, gauge("m.a", [(now - 4000, 1.0), (now - 30, 2.0), (now + 1200, 3.0)]))
    assert len(errors) == 1 and "2 point(s) dropped" in errors[0] and "m.a" in errors[0]
    assert [v for _, v in sb.metrics.query_series("avg:m.a{*}", now - 7200, now + 7200)[0].points] == [2.0]


def test_resent_and_out_of_order_points(sb: Sandbox) -> None:
    now = float(int(sb.clock.now()) // 60 * 60)
    submit(sb, gauge("m.b", [(now - 120, 1.0), (now - 60, 2.0)]))
    submit(sb, gauge("m.b", [(now - 60, 5.0)]))  # same timestamp: last write wins
    submit(sb, gauge("m.b", [(now - 180, 7.0), (now - 120, 9.0)]))  # out of order, and a rewrite
    points = sb.metrics.query_series("avg:m.b{*}", now - 600, now, interval=60)[0].points
    assert points == [(now - 180, 7.0), (now - 120, 9.0), (now - 60, 5.0)]
    assert sb.metrics.dump()["points"] == 3


def test_v1_series_with_host_tags_and_type(sb: Sandbox) -> None:
    now = sb.clock.now()
    body = {"series": [{"metric": "jobs.done", "type": "count", "host": "gpu-9", "tags": ["Team:NLP"],
                        "points": [[now - 20, 2], [now - 10, 3], [now - 5, None]]}]}  # fmt: skip
    status, answer = call(sb, "POST", "/api/v1/series", body, headers={"Content-Type": "text/json"})
    assert (status, answer) == (202, {"status": "ok"})
    (group,) = sb.metrics.query_series("sum:jobs.done{team:nlp} by {host}", now - 60, now)
    assert group.group_tags == ("host:gpu-9",)
    assert sum(v for _, v in group.points) == 5.0


def test_metric_names_are_normalised_or_refused(sb: Sandbox) -> None:
    now = sb.clock.now()
    errors = submit(sb, gauge("gpu util!", [(now, 1.0)]), gauge("9lives", [(now, 1.0)]))
    assert len(errors) == 1 and "invalid metric name" in errors[0]
    assert sb.metrics.metric_names() == ["gpu_util_"]


def test_v2_resources_other_than_host_become_tags(sb: Sandbox) -> None:
    now = sb.clock.now()
    submit(sb, gauge("m.c", [(now, 1.0)], resources=[{"type": "device", "name": "nvidia0"}], tags=["GPU:0"]))
    assert [g.group_tags for g in sb.metrics.query_series("avg:m.c{gpu:0} by {device}", now - 60, now)] == [
        ("device:nvidia0",)
    ]


@pytest.mark.parametrize(
    "series",
    [
        {"metric": "m", "type": 7, "points": []},
        {"metric": "m", "points": [{"timestamp": "now", "value": 1}]},
        {"metric": "m", "points": [{"timestamp": 1, "value": "high"}]},
        {"metric": "m"},
        {"metric": "", "points": []},
        {"metric": "m", "points": [], "tags": "env:prod"},
        {"metric": "m", "points": [], "resources": [{"name": "h"}]},
        "not-an-object",
    ],
)
def test_malformed_v2_series_are_400(sb: Sandbox, series: Any) -> None:
    status, body = call(sb, "POST", "/api/v2/series", {"series": [series]})
    assert status == 400 and body["errors"] and isinstance(body["errors"][0], str)


def test_intake_needs_only_the_api_key_and_checks_it(sb: Sandbox) -> None:
    payload = json.dumps({"series": []}).encode()
    ok = Client(sb).post("/api/v2/series", data=payload, headers={"DD-API-KEY": DEFAULT_DD_API_KEY})
    assert ok.status_code == 202
    denied = Client(sb).post("/api/v2/series", data=payload, headers={"DD-API-KEY": "wrong"})
    assert denied.status_code == 403 and denied.json == {"errors": ["Forbidden"]}


def test_size_limits(sb: Sandbox) -> None:
    big = json.dumps({"series": [], "pad": "x" * 600_000}).encode()
    assert call(sb, "POST", "/api/v2/series", data=big)[0] == 413
    bomb = gzip.compress(json.dumps({"series": [], "pad": "0" * 6_000_000}).encode())
    assert len(bomb) < 512_000
    assert call(sb, "POST", "/api/v2/series", data=bomb, headers={"Content-Encoding": "gzip"})[0] == 413
    now = sb.clock.now()
    packed = zlib.compress(json.dumps({"series": [gauge("m.z", [(now, 4.0)])]}).encode())
    assert call(sb, "POST", "/api/v2/series", data=packed, headers={"Content-Encoding": "deflate"}) == (
        202,
        {"errors": []},
    )
    status, body = call(sb, "POST", "/api/v2/series", data=b"\x1f\x8bnot-gzip", headers={"Content-Encoding": "gzip"})
    assert status == 400 and body == {"errors": ["Invalid compressed payload"]}


def test_zstd1_bodies_are_decoded_within_the_same_limits(sb: Sandbox) -> None:
    now = sb.clock.now()
    packed = zstandard.ZstdCompressor(level=1).compress(json.dumps({"series": [gauge("m.s", [(now, 2.5)])]}).encode())
    headers = {"Content-Encoding": "zstd1"}
    assert call(sb, "POST", "/api/v2/series", data=packed, headers=headers) == (202, {"errors": []})
    assert sb.metrics.query_series("avg:m.s{*}", int(now) - 60, int(now) + 60)
    # A frame that claims no size and expands past 5,242,880 bytes is refused before it is all in memory.
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"0" * 6_000_000)
    assert len(bomb) < 512_000 and call(sb, "POST", "/api/v2/series", data=bomb, headers=headers)[0] == 413
    status, body = call(sb, "POST", "/api/v2/series", data=b"not-zstd", headers=headers)
    assert status == 400 and body == {"errors": ["Invalid compressed payload"]}


def test_query_series_rejects_bad_queries(sb: Sandbox) -> None:
    with pytest.raises(QueryError):
        sb.metrics.query_series("avg:m{", 0, 1)


def test_dump_and_reset(sb: Sandbox) -> None:
    now = sb.clock.now()
    submit(sb, gauge("m.d", [(now - 10, 1.0), (now, 2.0)], "h1", unit="percent"))
    dump = sb.metrics.dump()
    assert dump == {"series": 1, "points": 2, "metrics": {"m.d": 1}, "units": {"m.d": "percent"}}
    sb.reset()
    assert sb.metrics.dump()["series"] == 0 and sb.hosts.dump()["count"] == 0
