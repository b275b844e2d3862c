"""gpufarm_sandbox.process: the sandbox in a process of its own, as the benchmarks start it and talk to it."""

from __future__ import annotations

import pytest

from gpufarm_sandbox.process import control, free_port, start_sandbox

pytestmark = pytest.mark.integration


def test_the_sandbox_process_answers_its_control_plane_until_terminated() -> None:
    port = free_port()
    proc, ready_s = start_sandbox(port)
    url = f"http://127.0.0.1:{port}"
    try:
        assert ready_s > 0
        control(url, "/_sandbox/requests", "DELETE")
        assert control(url, "/_sandbox/requests")["total"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode is not None


def test_the_sandbox_process_plays_the_datadog_quirks_it_is_started_with() -> None:
    port = free_port()
    proc, _ = start_sandbox(port, quirks=["facets-400", "no-field-trigger"])
    try:
        assert control(f"http://127.0.0.1:{port}", "/_sandbox/state")["quirks"] == ["no-field-trigger", "facets-400"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_unknown_quirk_stops_the_start_with_the_reason() -> None:
    with pytest.raises(
        SystemExit, match=r"status 2 before it answered \(a usage error: is every Datadog quirk name known\?\)"
    ):
        start_sandbox(free_port(), quirks="facets-400,bogus")


def test_control_refuses_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="not an HTTP URL"):
        control("file:///etc", "/passwd")
