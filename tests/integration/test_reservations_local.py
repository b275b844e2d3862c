"""Reservations from Slack to the incident on the local host: `/gpu reserve` books through the pool's writer, two
bookings racing for the team's last quota in one window end with exactly one reserved, `/gpu calendar` shows it."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE
from gpufarm_sandbox.localhost import start_local
from gpufarm_sandbox.races import RaceFarm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def farm() -> Iterator[LocalFarm]:
    with start_local(port=0) as env:
        local = LocalFarm.ready(env)
        try:
            yield local
        finally:
            local.settle(timeout=30)
            local.close()
            runtime.reset()


def _from(days: int) -> str:
    start = (datetime.now(UTC) + timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
    return start.strftime("%Y-%m-%d %H:%M")


def _answers(farm: LocalFarm, contains: str) -> list[str]:
    return [m["text"] for m in farm.messages(user=ALICE.id, kind="response", contains=contains)]


def test_a_reservation_asked_in_slack_is_an_incident_in_phase_reserved(farm: LocalFarm) -> None:
    farm.slash(ALICE, f"reserve 4 H100 env=onprem-hpc project=book-one team=nlp from {_from(5)} for 2d")
    farm.settle()
    [answer] = _answers(farm, "reserved: 4 H100 in onprem-hpc")
    alloc = farm.allocation(ir_in(answer) or 0)
    assert alloc.phase is Phase.RESERVED and alloc.project == "book-one" and alloc.hosts == ()
    assert alloc.reserved_until is not None and alloc.reserved_from is not None
    assert alloc.reserved_until - alloc.reserved_from == timedelta(days=2)
    farm.slash(ALICE, "calendar onprem-hpc H100")
    farm.settle()
    [calendar] = _answers(farm, "onprem-hpc H100: day (UTC)")
    rows = [
        line.split()[-4:]
        for line in calendar.splitlines()
        if line[:3] in {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
    ]
    assert ["32", "0", "4", "28"] in rows  # a day of the window: 4 reserved, 28 of 32 free
    farm.slash(ALICE, f"reserve 4 H100 env=onprem-hpc project=book-late team=nlp from {_from(80)} for 30d")
    farm.settle()
    assert any("[reservation-too-long]" in t for t in _answers(farm, "Request refused"))


def test_the_request_form_books_a_window_when_its_from_and_for_are_filled(farm: LocalFarm) -> None:
    farm.slash(ALICE, "request")
    view = [v for v in farm.views() if v["user"] == ALICE.id][-1]
    assert [b["block_id"] for b in view["blocks"]][-2:] == ["reserved_from", "reserved_for"]

    def text(value: str | None) -> dict[str, Any]:
        return {"type": "plain_text_input", "value": value}

    values = {
        "gpu_model": {"gpu_model": {"type": "static_select", "selected_option": {"value": "H100"}}},
        "gpu_count": {"gpu_count": {"type": "number_input", "value": "2"}},
        "environment": {"environment": {"type": "static_select", "selected_option": {"value": "onprem-hpc"}}},
        "team": {"team": {"type": "static_select", "selected_option": {"value": "nlp"}}},
        "project": {"project": text("book-form")},
        "duration_days": {"duration_days": {"type": "number_input", "value": "7"}},
        "purpose": {"purpose": text(None)},
        "reserved_from": {"reserved_from": text(_from(10))},
        "reserved_for": {"reserved_for": text("3w")},
    }
    bad = farm.submit_view(ALICE, view["id"], values)
    assert json.loads(bad["body"])["errors"].keys() == {"reserved_for"}
    values["reserved_for"]["reserved_for"]["value"] = "36h"
    assert farm.submit_view(ALICE, view["id"], values)["status"] == 200
    farm.settle()
    [booked] = [a for a in farm.incidents() if a.project == "book-form"]
    assert booked.phase is Phase.RESERVED and booked.reserved_from is not None and booked.reserved_until is not None
    assert booked.reserved_until - booked.reserved_from == timedelta(hours=36)


def test_two_bookings_racing_for_the_last_quota_end_with_exactly_one_reserved(farm: LocalFarm) -> None:
    race = RaceFarm(farm, latency_ms=100)
    window = f"from {_from(40)} for 1d"
    texts = [f"reserve 8 H100 env=onprem-hpc project=race-{n} team=nlp {window}" for n in (1, 2)]
    race.pair(lambda: farm.slash(ALICE, texts[0]), lambda: farm.slash(ALICE, texts[1]), gap=0.02)
    booked = [a for a in farm.incidents() if (a.project or "").startswith("race-")]
    reserved = [a for a in booked if a.phase is Phase.RESERVED]
    assert len(reserved) == 1, [(a.project, a.phase) for a in booked]
    assert all(a.phase in (Phase.RESERVED, Phase.REJECTED) for a in booked)
    # Each requester is answered once: one reserved, one refused over the team's quota in that window.
    answers = [t for t in _answers(farm, "8 H100") if "race-" in t or "reserved:" in t or "refused" in t]
    assert sum("reserved: 8 H100" in t for t in answers) == 1
    assert sum("[reservation-over-quota]" in t for t in answers) == 1


def test_the_sandboxs_quota_ledger_page_shows_the_pools_calendar(farm: LocalFarm) -> None:
    farm.slash(ALICE, f"reserve 2 H100 env=onprem-hpc project=book-page team=nlp from {_from(2)} for 1d")
    farm.settle()
    farm.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    farm.settle()
    index = urllib.request.urlopen(farm.base_url + "/dashboards", timeout=30).read().decode()
    found = re.search(r'href="/dashboards/([^"?]+)"[^>]*>gpufarm: quota ledger', index)
    assert found, index[:500]
    page = (
        urllib.request.urlopen(f"{farm.base_url}/dashboards/{found.group(1)}?environment=onprem-hpc", timeout=30)
        .read()
        .decode()
    )
    assert "Calendar: GPUs reserved per pool and model, per day ahead" in page
    assert "Reserved GPU-hours ahead per team, project, environment and model" in page
    assert "book-page" in page  # the reserved column's row for the booking
