"""Datadog's rate limits: the sandbox's headers and 429s per endpoint group, and the gateway waiting them out.

The sandbox answers every Datadog API call with X-RateLimit-Limit / -Period / -Remaining / -Reset / -Name and refuses
a spent group with 429 until its window turns (real time); the gateway waits a 429 out until its reset within bounds,
holds calls to a budget it saw spent, and fails fast with an UpstreamError when the reset is beyond what it waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import http

from gpufarm.adapters import datadog_client as dc
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.ratelimit import DEFAULT_LIMIT, DEFAULT_PERIOD_S, GROUP_NAMES

pytestmark = pytest.mark.contract

HEADERS = ("X-RateLimit-Limit", "X-RateLimit-Period", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Name")


def _limits(sandbox_url: str, **groups: dict[str, int]) -> dict[str, Any]:
    status, body = http(f"{sandbox_url}/_sandbox/ratelimits", "POST", {"groups": groups})
    assert status == 200, body
    return dict(body)


def _refused(sandbox_url: str, group: str) -> int:
    return int(http(f"{sandbox_url}/_sandbox/ratelimits")[1]["groups"][group]["refused"])


def _answer_headers(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict[str, str]]:
    """Status and headers of one API call with the default keys."""
    import urllib.error
    import urllib.request

    from helpers import KEYS

    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json", **KEYS}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


@pytest.fixture
def gateway(settings: Settings, type_id: str) -> Iterator[DatadogGateway]:
    """A gateway with its type id known."""
    gw = DatadogGateway(settings, incident_type_id=type_id, create_backoff_s=0.05)
    yield gw
    gw.close()


# -- the sandbox's headers and 429s ------------------------------------------------------------------------------


def test_every_datadog_answer_carries_its_groups_rate_limit_headers(sandbox_url: str, sandbox: Sandbox) -> None:
    answers = {
        "incidents": _answer_headers(f"{sandbox_url}/api/v2/incidents/00000000-0000-4000-8000-000000000001"),
        "hosts": _answer_headers(f"{sandbox_url}/api/v1/hosts"),
        "tags": _answer_headers(f"{sandbox_url}/api/v1/tags/hosts/gpu-node-01"),
        "query": _answer_headers(f"{sandbox_url}/api/v2/query/scalar", "POST", b"{}"),
        "monitors": _answer_headers(f"{sandbox_url}/api/v1/monitor"),
        "dashboards": _answer_headers(f"{sandbox_url}/api/v1/dashboard"),
    }
    for group, (status, headers) in answers.items():
        assert all(name in headers for name in HEADERS), (group, status, headers)
        assert headers["X-RateLimit-Name"] == group
        assert headers["X-RateLimit-Limit"] == str(DEFAULT_LIMIT)
        assert headers["X-RateLimit-Period"] == str(DEFAULT_PERIOD_S)
        assert 1 <= int(headers["X-RateLimit-Reset"]) <= DEFAULT_PERIOD_S
    assert answers["incidents"][0] == 404 and answers["query"][0] == 400  # errors carry them too
    # Each group keeps its own count; Slack's API and the control plane carry none.
    again = _answer_headers(f"{sandbox_url}/api/v1/hosts")[1]
    assert int(again["X-RateLimit-Remaining"]) == int(answers["hosts"][1]["X-RateLimit-Remaining"]) - 1
    assert "X-RateLimit-Name" not in _answer_headers(f"{sandbox_url}/slack/api/auth.test", "POST")[1]
    assert "X-RateLimit-Name" not in _answer_headers(f"{sandbox_url}/_sandbox/health")[1]


def test_a_spent_group_answers_429_until_its_window_turns(sandbox_url: str, sandbox: Sandbox) -> None:
    _limits(sandbox_url, hosts={"limit": 3, "period": 1})
    # Start at the top of a window, so the three fit in one.
    time.sleep(1 - time.time() % 1)
    seen = [_answer_headers(f"{sandbox_url}/api/v1/hosts") for _ in range(5)]
    assert [status for status, _ in seen] == [200, 200, 200, 429, 429]
    assert [h["X-RateLimit-Remaining"] for _, h in seen] == ["2", "1", "0", "0", "0"]
    assert all(h["X-RateLimit-Limit"] == "3" and h["X-RateLimit-Period"] == "1" for _, h in seen)
    assert http(f"{sandbox_url}/api/v1/hosts")[1] == {"errors": ["Too many requests"]}
    # Other groups are untouched; the refused ones did not spend budget; the next window serves again.
    assert _answer_headers(f"{sandbox_url}/api/v1/tags/hosts/gpu-node-01")[0] == 404
    assert _refused(sandbox_url, "hosts") == 3
    time.sleep(int(seen[-1][1]["X-RateLimit-Reset"]))
    status, headers = _answer_headers(f"{sandbox_url}/api/v1/hosts")
    assert status == 200 and headers["X-RateLimit-Remaining"] == "2"


def test_rate_limits_are_configured_checked_and_reset(sandbox_url: str, sandbox: Sandbox) -> None:
    shown = _limits(sandbox_url, incidents={"limit": 7, "period": 60})
    assert set(shown["groups"]) == set(GROUP_NAMES)
    assert shown["groups"]["incidents"] == {"limit": 7, "period": 60, "remaining": 7, "refused": 0}
    assert shown["groups"]["hosts"]["limit"] == DEFAULT_LIMIT
    for bad in ({"nope": {"limit": 1, "period": 1}}, {"hosts": {"limit": 0, "period": 1}}, {"hosts": {"limit": 1}}):
        status, body = http(f"{sandbox_url}/_sandbox/ratelimits", "POST", {"groups": bad})
        assert status == 400, body
    assert http(f"{sandbox_url}/_sandbox/ratelimits")[1]["groups"]["incidents"]["limit"] == 7  # nothing changed
    assert http(f"{sandbox_url}/_sandbox/ratelimits", "DELETE")[1]["groups"]["incidents"]["limit"] == DEFAULT_LIMIT
    _limits(sandbox_url, incidents={"limit": 7, "period": 60})
    sandbox.reset()
    assert http(f"{sandbox_url}/_sandbox/ratelimits")[1]["groups"]["incidents"]["limit"] == DEFAULT_LIMIT


def test_windows_run_on_real_time_not_the_sandbox_clock(sandbox_url: str, sandbox: Sandbox) -> None:
    _limits(sandbox_url, hosts={"limit": 1, "period": 86_400})
    assert _answer_headers(f"{sandbox_url}/api/v1/hosts")[0] == 200
    http(f"{sandbox_url}/_sandbox/clock", "POST", {"advance": 86_400})
    assert _answer_headers(f"{sandbox_url}/api/v1/hosts")[0] == 429


# -- the gateway ----------------------------------------------------------------------------------------------------


def test_a_burst_under_a_tiny_limit_all_succeeds_after_waiting(
    gateway: DatadogGateway, settings: Settings, type_id: str, sandbox_url: str
) -> None:
    """Two containers (gateways with their own gates) share a 4-per-second incidents budget for 24 calls."""
    _limits(sandbox_url, incidents={"limit": 4, "period": 1})
    other = DatadogGateway(settings, incident_type_id=type_id, create_backoff_s=0.05)
    results: dict[str, list[int]] = {}

    def burst(name: str, gw: DatadogGateway) -> None:
        made = []
        for n in range(6):
            record = gw.create(f"GPU request {name} {n}", {f.STATE: "active", f.TEAM: "nlp"})
            made.append(gw.get_by_ir(record.public_id).public_id)
        results[name] = made

    started = time.monotonic()
    threads = [threading.Thread(target=burst, args=(name, gw)) for name, gw in (("a", gateway), ("b", other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    wall = time.monotonic() - started
    other.close()
    assert sorted(len(made) for made in results.values()) == [6, 6]
    assert len({ir for made in results.values() for ir in made}) == 12
    # 24 calls at 4 a second take at least 5 windows; the budget was spent and refused along the way.
    assert wall >= 4.0
    assert _refused(sandbox_url, "incidents") > 0
    assert wall < 30


def test_a_spent_budget_holds_the_next_call_instead_of_drawing_a_429(gateway: DatadogGateway, sandbox_url: str) -> None:
    _limits(sandbox_url, hosts={"limit": 2, "period": 1})
    for _ in range(6):
        assert list(gateway.list_hosts()) == []
    assert _refused(sandbox_url, "hosts") == 0  # one client alone never meets the 429: it waits for the reset
    assert gateway.rate_limits.waited_s > 0


def test_a_reset_beyond_the_bound_fails_fast_with_an_upstream_error(gateway: DatadogGateway, sandbox_url: str) -> None:
    # A day's window: its reset is hours away (unless within 10 s of midnight UTC, when waiting it out is right).
    _limits(sandbox_url, incidents={"limit": 1, "period": 86_400})
    gateway.create("GPU request", {f.STATE: "active", f.TEAM: "nlp"})
    started = time.monotonic()
    with pytest.raises(UpstreamError) as limited:
        list(gateway.search(IncidentQuery.where({State.ACTIVE})))
    assert time.monotonic() - started < 1.0
    text = str(limited.value)
    assert "HTTP 429" in text and "rate limit incidents" in text and "resets in" in text
    # The create path fails as fast: a 429 is not applied, and a reset a minute away is not waited for.
    started = time.monotonic()
    with pytest.raises(UpstreamError, match="429"):
        gateway.create("GPU request", {f.STATE: "active", f.TEAM: "nlp"})
    assert time.monotonic() - started < 1.0


def test_a_5xx_retry_backs_off_without_waiting_for_the_rate_limit_window(
    gateway: DatadogGateway, sandbox_url: str
) -> None:
    """Datadog sends X-RateLimit-Reset on every answer; a 500 is retried at once, not after the window."""
    _limits(sandbox_url, hosts={"limit": 1000, "period": 60})
    http(
        f"{sandbox_url}/_sandbox/faults",
        "POST",
        {"rate": 1.0, "statuses": [500], "paths": "^/api/v1/hosts", "max_faults": 1},
    )
    started = time.monotonic()
    assert list(gateway.list_hosts()) == []
    assert time.monotonic() - started < 2.0
    assert http(f"{sandbox_url}/_sandbox/faults")[1]["injected"] == 1


# -- the retry policy alone ---------------------------------------------------------------------------------------


class _Answer:
    """Just what urllib3's retry policy reads from a response."""

    def __init__(self, status: int, **headers: str) -> None:
        self.status = status
        self.headers = {f"X-RateLimit-{k.title()}": v for k, v in headers.items()}

    def get_redirect_location(self) -> bool:
        return False


def test_the_retry_policy_waits_for_a_429_within_its_bounds() -> None:
    import urllib3

    slept: list[float] = []
    policy = dc.DatadogRetry(total=1, rate_limit_wait_s=5, rate_limit_retries=2, sleeper=slept.append)
    limited = _Answer(429, reset="3", name="incidents", remaining="0")
    assert policy.is_retry("POST", 429)
    once = policy.increment("GET", "/api/v2/incidents", response=limited)
    once.sleep(limited)
    assert 3.0 <= slept[-1] <= 3.3 and once.total == 1  # a 429 spends no 5xx retry
    twice = once.increment("GET", "/api/v2/incidents", response=limited)
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="still limited after 0 waits"):
        twice.increment("GET", "/api/v2/incidents", response=limited)
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="resets in 60 s, beyond the 5 s"):
        policy.increment("GET", "/api/v2/incidents", response=_Answer(429, reset="60"))
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="no X-RateLimit-Reset"):
        policy.increment("GET", "/api/v2/incidents", response=_Answer(429))
    # A 500 backs off (none on the first retry) and never sleeps for the window it also announces.
    failed = _Answer(500, reset="9")
    policy.increment("GET", "/api/v2/incidents", response=failed).sleep(failed)
    assert slept == [slept[0]]


def test_the_gate_holds_a_spent_limit_for_its_reset_only() -> None:
    now = [100.0]
    slept: list[float] = []
    gate = dc.RateLimitGate(max_wait_s=10, sleeper=slept.append, clock=lambda: now[0])
    incidents = "http://dd/api/v2/incidents/search?query=x"
    gate.observe(incidents, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "4", "X-RateLimit-Name": "incidents"})
    gate.hold("http://dd/api/v2/incidents/abc")  # same limit, another endpoint
    gate.hold("http://dd/api/v1/hosts")  # another limit
    assert slept == [4.0]
    gate.observe(incidents, {"X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "4", "X-RateLimit-Name": "incidents"})
    gate.hold(incidents)
    gate.observe(incidents, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60", "X-RateLimit-Name": "incidents"})
    gate.hold(incidents)  # beyond the bound: not waited for here
    assert slept == [4.0]
    for garbled in ("soon", "-1", "nan", "1e400"):
        assert dc.reset_seconds({"X-RateLimit-Reset": garbled}) is None


def test_no_retry_waits_past_the_invocations_time_budget() -> None:
    import urllib3

    from gpufarm.adapters import time_budget

    slept: list[float] = []
    policy = dc.DatadogRetry(
        total=3, backoff_factor=2, rate_limit_wait_s=10, rate_limit_retries=4, sleeper=slept.append
    )
    limited = _Answer(429, reset="3", name="incidents", remaining="0")
    failed = _Answer(503)
    with time_budget.invocation(3.5):  # 2.8 s of work, 0.7 s kept for the answer
        # A 3 s reset, within the bounds but past the budget: the call ends now, with the 429 it got.
        with pytest.raises(urllib3.exceptions.MaxRetryError, match="time budget"):
            policy.increment("GET", "/api/v2/incidents", response=limited)
        # The first 5xx retry backs off 0 s: made; the next backs off 4 s: not.
        first = policy.increment("GET", "/api/v2/incidents", response=failed)
        with pytest.raises(urllib3.exceptions.MaxRetryError, match="time budget"):
            first.increment("GET", "/api/v2/incidents", response=failed)
        now = [0.0]
        gate = dc.RateLimitGate(max_wait_s=10, sleeper=slept.append, clock=lambda: now[0])
        gate.observe("http://dd/api/v1/hosts", {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5"})
        gate.hold("http://dd/api/v1/hosts")  # a 5 s hold would pass the budget: the call goes out instead
    assert slept == []
    # Outside an invocation the same 429 is waited out.
    policy.increment("GET", "/api/v2/incidents", response=limited).sleep(limited)
    assert 3.0 <= slept[-1] <= 3.3
