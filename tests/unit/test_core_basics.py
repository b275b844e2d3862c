"""IR formatting, the lifecycle and the incident field schema."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import InvalidTransition, ValidationFailed
from gpufarm.core.kernel.ir import format_ir, ir_tag, parse_ir
from gpufarm.core.kernel.lifecycle import Phase, State, check_transition, state_for
from gpufarm.core.kernel.model import Allocation, GpuRequest, IncidentRecord, decode_host_gpus, encode_host_gpus


@pytest.mark.parametrize("text", ["IR-123", "ir-123", "ir:ir-123", "123", " IR123 ", "#123"])
def test_parse_ir_accepts_the_forms_people_type(text: str) -> None:
    assert parse_ir(text) == 123


@pytest.mark.parametrize("text", ["", "IR-", "IR-0", "abc", "IR-12x", "IR-1;drop", "\x00"])
def test_parse_ir_rejects_garbage(text: str) -> None:
    with pytest.raises(ValidationFailed):
        parse_ir(text)


def test_ir_forms() -> None:
    assert format_ir(7) == "IR-7"
    assert ir_tag(7) == "ir:ir-7"


def test_lifecycle_allows_the_documented_path_and_nothing_else() -> None:
    path = [Phase.REQUESTED, Phase.APPROVED, Phase.ALLOCATED, Phase.IDLE_WARNED, Phase.RECLAIMING, Phase.RECLAIMED]
    for src, dst in itertools.pairwise(path):
        check_transition(src, dst)
    check_transition(Phase.ALLOCATED, Phase.ALLOCATED)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.RECLAIMED, Phase.ALLOCATED)
    with pytest.raises(InvalidTransition):
        check_transition(Phase.REQUESTED, Phase.ALLOCATED)
    assert state_for(Phase.ALLOCATED) is State.STABLE
    assert state_for(Phase.REJECTED) is State.RESOLVED


def test_fields_round_trip() -> None:
    encoded = f.encode_fields({f.STATE: "active", f.GPU_COUNT: 8, f.HOSTS: ["a", "b"], f.PURPOSE: None})
    assert encoded[f.STATE] == {"type": "dropdown", "value": "active"}
    assert encoded[f.GPU_COUNT] == {"type": "textbox", "value": "8"}
    assert encoded[f.HOSTS] == {"type": "textarray", "value": ["a", "b"]}
    assert f.decode_fields(encoded) == {f.STATE: "active", f.GPU_COUNT: "8", f.HOSTS: ["a", "b"], f.PURPOSE: None}
    with pytest.raises(KeyError):
        f.encode_fields({"nonsense": "x"})
    with pytest.raises(TypeError):
        f.encode_fields({f.HOSTS: "a"})


def test_request_validation_and_allocation_decoding() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    req = GpuRequest(
        team="NLP",
        project="llm-ko",
        gpu_model="h100",
        gpu_count=8,
        environment="onprem-hpc",
        duration_days=14,
        purpose="fine-tune",
        requester="U0000000001",
        request_id="req-00000001",
    )
    assert (req.team, req.gpu_model) == ("nlp", "H100")
    values = req.to_fields(Phase.REQUESTED, now)
    values[f.HOST_GPUS] = encode_host_gpus({"n1": 4, "n2": 4})
    record = IncidentRecord(
        id="uuid-1", public_id=5, title=req.title(), state="active", fields=f.decode_fields(f.encode_fields(values))
    )
    alloc = Allocation.from_record(record)
    assert alloc.ir_label == "IR-5" and alloc.ir_tag == "ir:ir-5"
    assert alloc.gpu_count == 8 and alloc.host_gpus == {"n1": 4, "n2": 4}
    assert alloc.expires_at == datetime(2026, 1, 15, tzinfo=UTC)
    assert decode_host_gpus(["bad", "x=y", "h=2"]) == {"h": 2}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_count", 0),
        ("gpu_count", -1),
        ("gpu_count", 10**6),
        ("project", "Bad Name"),
        ("project", "a,b"),
        ("project", "x\nproject:evil"),
        ("gpu_model", "H100;rm"),
        ("purpose", "ok\x07"),
        ("requester", "bob"),
    ],
)
def test_request_rejects_bad_input(field: str, value: object) -> None:
    base: dict[str, object] = {
        "team": "nlp",
        "project": "p",
        "gpu_model": "H100",
        "gpu_count": 1,
        "environment": "cloud",
        "requester": "U0000000001",
        "request_id": "req-00000001",
    }
    base[field] = value
    with pytest.raises(ValueError, match=field):
        GpuRequest.model_validate(base)
