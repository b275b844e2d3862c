"""Datadog's answers are parsed by orjson (`datadog_http.parse_json`): the values `json.loads` gives for the JSON
Datadog sends, invalid JSON a ValueError that the readers turn into an UpstreamError, and the cycle collector left
as it was found."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest

from gpufarm.adapters.datadog_client import read_json
from gpufarm.adapters.datadog_http import parse_json
from gpufarm.core.kernel.errors import UpstreamError

PAGE = {
    "data": {
        "attributes": {
            "total": 2,
            "incidents": [
                {
                    "data": {
                        "id": "8f0e-1",
                        "attributes": {
                            "public_id": 12,
                            "title": "IR 8 H100 — équipe nlp",
                            "created": "2026-12-07T22:50:03.123456+00:00",
                            "resolved": None,
                            "fields": {"gpu_count": {"type": "textbox", "value": "8"}, "hosts": {"value": ["a", "b"]}},
                        },
                    }
                },
                {"data": {"id": "8f0e-2", "attributes": {"customer_impact_duration": 0, "ratio": 0.25}}},
            ],
        }
    }
}


class Answer:
    """A raw client answer: its body, and whether its connection went back to the pool."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.released = False

    def release_conn(self) -> None:
        self.released = True


@pytest.mark.parametrize("encode", [lambda v: json.dumps(v).encode(), lambda v: json.dumps(v, ensure_ascii=False)])
def test_the_values_are_those_json_loads_gives(encode: Any) -> None:
    text = encode(PAGE)
    assert parse_json(text) == json.loads(text) == PAGE


@pytest.mark.parametrize("body", [b"{", b"<html>502 Bad Gateway</html>", b'{"total": NaN}', b"\xff\xfe"])
def test_invalid_json_is_a_value_error_and_an_upstream_error_to_the_reader(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_json(body)
    answer = Answer(body)
    with pytest.raises(UpstreamError, match="not JSON"):
        read_json(answer)
    assert answer.released


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cycle_collector_is_left_as_it_was_found(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        parse_json(b"[1, 2]")
        with pytest.raises(ValueError):
            parse_json(b"[1,")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
