"""The light lease record reports read (gpufarm.core.kernel.lease_facts) decodes every field as the lifecycle's
Allocation does, hand-edited and malformed values included, and FieldView decodes a field as decode_fields does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, IncidentRecord

MODIFIED = datetime(2026, 12, 3, 4, 5, 6, tzinfo=UTC)

CASES: dict[str, dict[str, Any]] = {
    "a live lease": {
        f.STATE: "stable",
        f.PHASE: "allocated",
        f.TEAM: "nlp",
        f.PROJECT: "llm",
        f.ENVIRONMENT: "onprem-hpc",
        f.GPU_COUNT: "16",
        f.HOSTS: ["node-1", "node-2"],
        f.HOST_GPUS: ["node-1=8", "node-2=8"],
        f.ALLOCATED_AT: "2026-12-01T10:00:00Z",
        f.GPU_HOURS_HELD: "160.000",
        f.GPU_HOURS_BUSY: "100.5",
        f.GPU_HOURS_IDLE: "50",
        f.GPU_HOURS_UNMEASURED: "9.5",
        f.GPU_HOURS_UNTIL: "2026-12-01T20:00:00Z",
        f.GPU_HOURS_BY_MONTH: ["2026-12=160.000"],
        f.HISTORY: ["2026-12-01T09:00:00Z U01 requested: 16xH100", "2026-12-01T10:00:00Z gpufarm allocated: x"],
    },
    "an ended lease": {
        f.STATE: "resolved",
        f.PHASE: "reclaimed",
        f.RECLAIM_REASON: "idle",
        f.TEAM: "vision",
        f.HOSTS: [],
        f.HOST_GPUS: ["node-3=4"],
    },
    "malformed values": {
        f.STATE: "melted",
        f.PHASE: "dancing",
        f.RECLAIM_REASON: "bored",
        f.GPU_COUNT: "many",
        f.HOST_GPUS: ["=3", "node-4", "node-5=x", "node-6=2"],
        f.ALLOCATED_AT: "yesterday",
        f.GPU_HOURS_HELD: "inf",
        f.GPU_HOURS_BUSY: "-4",
        f.GPU_HOURS_IDLE: "1" * 40,
        f.GPU_HOURS_UNMEASURED: "nan",
        f.GPU_HOURS_UNTIL: "2026-13-45T99:00:00Z",
        f.GPU_HOURS_BY_MONTH: "2026-12=1",
        f.HISTORY: "one line, not a list",
    },
    "hostile text": {
        f.TEAM: '=HYPERLINK("http://evil.example")',
        f.PROJECT: "\x1b[2J" + "x" * 20_000,
        f.ENVIRONMENT: ["first of a list", "second"],
        f.HOSTS: "one-host",
    },
    "nothing at all": {},
}


def _record(values: dict[str, Any], state: str | None) -> IncidentRecord:
    raw = {name: {"type": "textbox", "value": value} for name, value in values.items()}
    return IncidentRecord(
        id="id-7", public_id=7, title="t", state=state, fields=f.decode_fields(raw), modified=MODIFIED
    )


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("state", [None, "active", "resolved"])
def test_facts_decode_as_the_allocation_does(name: str, state: str | None) -> None:
    record = _record(CASES[name], state)
    facts = LeaseFacts.decode(record.public_id, record.state, record.fields, record.modified)
    assert facts == LeaseFacts.of(Allocation.from_record(record))


def test_malformed_values_read_as_their_safe_defaults() -> None:
    facts = LeaseFacts.decode(7, None, f.decode_fields({k: {"value": v} for k, v in CASES["malformed values"].items()}))
    assert (facts.state, facts.phase, facts.reclaim_reason) == (State.ACTIVE, Phase.REQUESTED, None)
    assert (facts.gpu_count, facts.allocated_at, facts.hours_until) == (0, None, None)
    assert (facts.hours_held, facts.hours_busy, facts.hours_idle, facts.hours_unmeasured) == (0.0, 0.0, 0.0, 0.0)
    assert dict(facts.host_gpus) == {"node-6": 2}
    assert facts.history == ("one line, not a list",)
    assert LeaseFacts.decode(7, "resolved", {f.RECLAIM_REASON: "idle"}).reclaim_reason is ReclaimReason.IDLE


@pytest.mark.parametrize("name", list(CASES))
def test_a_field_view_decodes_each_field_as_decode_fields(name: str) -> None:
    raw: dict[str, Any] = {k: {"type": "textarray", "value": v} for k, v in CASES[name].items()}
    raw["bare"] = 12
    raw["none"] = {"type": "textbox", "value": None}
    view = f.FieldView(raw)
    assert dict(view) == f.decode_fields(raw)
    assert len(view) == len(raw) and view.get("absent") is None and view.get("absent", "x") == "x"
    assert view.get("none", "x") is None
    with pytest.raises(KeyError):
        view["absent"]
    assert dict(f.FieldView(None)) == {} and dict(f.FieldView(["not", "a", "mapping"])) == {}  # type: ignore[arg-type]
