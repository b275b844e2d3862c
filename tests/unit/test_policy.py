"""Farm configuration, request validation, quota decisions and authority."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FARM_YAML

from gpufarm.core.config.farm import FarmConfig, FarmConfigError, PoolKind, parse_farm
from gpufarm.core.governance.policy import (
    Action,
    Ask,
    Decision,
    Verdict,
    authorize,
    build_request,
    decide_grant,
    extension_days,
    team_usage,
)
from gpufarm.core.kernel.errors import NotAllowed, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, GpuRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def farm() -> FarmConfig:
    return parse_farm(FARM_YAML)


def request(farm: FarmConfig, **values: str) -> GpuRequest:
    base = {"gpu_count": "4", "gpu_model": "h100", "environment": "hpc", "team": "nlp", "project": "llm-ko"}
    base.update(values)
    return build_request(base, farm, requester="U0000000001", channel="C0000000001", request_id="req-00000001")


def decide(request: GpuRequest, farm: FarmConfig, *, team_used: int, pool_capacity: int) -> Decision:
    """The policy's verdict on a new request, weighed as the lease use cases weigh it (no host charging)."""
    ask = Ask(request.team, request.environment, request.gpu_model, request.gpu_count)
    return decide_grant(ask, farm, team_used=team_used, pool_capacity=pool_capacity)


def alloc(ir: int, phase: Phase, count: int, team: str = "nlp", env: str = "hpc", model: str = "H100") -> Allocation:
    return Allocation(
        incident_id=f"id-{ir}",
        ir=ir,
        title="t",
        state=State.ACTIVE,
        phase=phase,
        team=team,
        environment=env,
        gpu_model=model,
        gpu_count=count,
        requester="U0000000001",
    )


# -- the farm file ----------------------------------------------------------------------------------------


def test_example_farm_file_is_valid() -> None:
    farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
    assert farm.environments["shared-slices"].kind is PoolKind.SHARED
    assert farm.valid_values()["gpu_model"] == ["A100", "H100", "L4"]


def test_farm_lookups(farm: FarmConfig) -> None:
    assert farm.model("h100") == "H100"
    assert farm.environments_offering("A100") == ["cloud", "slices"]
    assert farm.quota("nlp", "hpc", "h100") is not None
    assert farm.quota("nlp", "slices", "L4") is None
    assert farm.quota("nobody", "hpc", "H100") is None


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("gpu_models: [", "not valid YAML"),
        ("- a\n- b", "must be a YAML mapping"),
        ("gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [A100]}}", "environments.hpc.gpu_models"),
        (
            "gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [H100]}}\n"
            "teams: {nlp: {quotas: {cloud: {H100: {gpus: 1}}}}}",
            "'cloud' is not an environment",
        ),
        (
            "gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [H100]}}\n"
            "teams: {nlp: {quotas: {hpc: {H100: {gpus: 8, hard_limit: 4}}}}}",
            "hard_limit (4) must be at least gpus (8)",
        ),
        ("gpu_models: {H100: {}}\nenvironments: {hpc: {kind: magic, gpu_models: [H100]}}", "environments.hpc.kind"),
        ("gpu_models: {H100: {}}\nenvironments: {Bad Name: {gpu_models: [H100]}}", "environments"),
        ("gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [H100]}}\nsurprise: 1", "surprise"),
        # Refused by the loader before int() (which raises ValueError past Python's 4,300-digit bound), with where.
        (
            "gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [H100]}}\n"
            f"teams: {{nlp: {{quotas: {{hpc: {{H100: {{gpus: {'9' * 5000}}}}}}}}}}}",
            "line 3, column 43: a number of 5,000 characters is too long",
        ),
    ],
)
def test_bad_farm_files_say_where(text: str, where: str) -> None:
    with pytest.raises(FarmConfigError) as err:
        parse_farm(text)
    assert where in str(err.value)


# -- request validation ------------------------------------------------------------------------------------


def test_build_request_normalizes(farm: FarmConfig) -> None:
    req = request(farm, team="NLP", gpu_model="h100", purpose="  train  ")
    assert (req.team, req.gpu_model, req.environment, req.duration_days, req.purpose) == (
        "nlp",
        "H100",
        "hpc",
        7,
        "train",
    )


def test_environment_defaults_when_only_one_pool_offers_the_model(farm: FarmConfig) -> None:
    farm2 = parse_farm(
        FARM_YAML.replace("cloud: {kind: dedicated, gpu_models: [H100, A100]}", "cloud: {gpu_models: [A100]}")
    )
    req = build_request(
        {"gpu_count": "1", "gpu_model": "H100", "team": "nlp", "project": "p"},
        farm2,
        requester="U0000000001",
        channel=None,
        request_id="req-00000002",
    )
    assert req.environment == "hpc"
    with pytest.raises(ValidationFailed) as err:
        request(farm, environment="")
    assert err.value.field == "environment"


@pytest.mark.parametrize(
    ("values", "field", "says"),
    [
        ({"gpu_count": "0"}, "gpu_count", "at least 1"),
        ({"gpu_count": "-2"}, "gpu_count", "at least 1"),
        ({"gpu_count": "100000"}, "gpu_count", "at most"),
        ({"gpu_count": "eight"}, "gpu_count", "whole number"),
        ({"gpu_count": "2.5"}, "gpu_count", "whole number"),
        ({"gpu_count": ""}, "gpu_count", "how many"),
        ({"gpu_model": "V100"}, "gpu_model", "unknown GPU model"),
        ({"gpu_model": "H100;rm -rf"}, "gpu_model", "unknown GPU model"),
        ({"environment": "mars"}, "environment", "unknown environment"),
        ({"environment": "slices"}, "environment", "offers no H100"),
        ({"team": "marketing"}, "team", "unknown team"),
        ({"project": "Bad Name"}, "project", "project"),
        ({"project": "a,b"}, "project", "project"),
        ({"project": "x\nproject:evil"}, "project", "project"),
        ({"project": "llm\x00ko"}, "project", "project"),
        ({"project": ""}, "project", "which project"),
        ({"duration_days": "31"}, "duration_days", "at most 30 days"),
        ({"duration_days": "0"}, "duration_days", "at least 1"),
        ({"duration_days": "soon"}, "duration_days", "whole number"),
        ({"purpose": "bell\x07"}, "purpose", "control characters"),
        ({"purpose": "x" * 501}, "purpose", "purpose"),
    ],
)
def test_bad_requests_name_the_field(farm: FarmConfig, values: dict[str, str], field: str, says: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        request(farm, **values)
    assert err.value.field == field
    assert says in err.value.message
    assert "\x00" not in err.value.message and "\n" not in err.value.message.replace("\\n", "")


# -- quota decisions ---------------------------------------------------------------------------------------


def test_within_quota_is_approved(farm: FarmConfig) -> None:
    d = decide(request(farm, gpu_count="8"), farm, team_used=0, pool_capacity=32)
    assert d.verdict is Verdict.APPROVE and d.entitled == 8


def test_beyond_quota_goes_to_operators(farm: FarmConfig) -> None:
    d = decide(request(farm, gpu_count="4"), farm, team_used=6, pool_capacity=32)
    assert d.verdict is Verdict.NEEDS_OPERATOR
    assert "beyond its quota of 8" in d.reason


def test_over_hard_limit_is_refused(farm: FarmConfig) -> None:
    d = decide(request(farm, gpu_count="12"), farm, team_used=8, pool_capacity=64)
    assert d.verdict is Verdict.REFUSE
    assert "hard limit of 16" in d.reason


def test_more_than_the_pool_is_refused(farm: FarmConfig) -> None:
    d = decide(request(farm, gpu_count="8"), farm, team_used=0, pool_capacity=4)
    assert d.verdict is Verdict.REFUSE and "only 4" in d.reason


def test_no_quota_is_refused_and_no_hard_limit_means_operators(farm: FarmConfig) -> None:
    farm_no_quota = parse_farm(FARM_YAML.replace("hpc: {H100: {gpus: 0, hard_limit: 8}}", "cloud: {A100: {gpus: 1}}"))
    d = decide(request(farm_no_quota, team="vision"), farm_no_quota, team_used=0, pool_capacity=64)
    assert d.verdict is Verdict.REFUSE and "no quota" in d.reason
    big = request(farm, gpu_model="A100", environment="cloud", gpu_count="40")
    assert decide(big, farm, team_used=0, pool_capacity=64).verdict is Verdict.NEEDS_OPERATOR


def test_team_usage_counts_granted_phases_only() -> None:
    allocs = [
        alloc(1, Phase.ALLOCATED, 4),
        alloc(2, Phase.WAITING, 2),
        alloc(3, Phase.APPROVED, 1),
        alloc(4, Phase.IDLE_WARNED, 1),
        alloc(5, Phase.REQUESTED, 8),
        alloc(6, Phase.RECLAIMED, 8),
        alloc(7, Phase.ALLOCATED, 8, team="vision"),
        alloc(8, Phase.ALLOCATED, 8, env="cloud"),
        alloc(9, Phase.ALLOCATED, 8, model="A100"),
    ]
    assert team_usage(allocs, "nlp", "hpc", "h100") == 8


# -- authority ---------------------------------------------------------------------------------------------

OPS = frozenset({"U0000000OPS"})


@pytest.mark.parametrize("action", [Action.APPROVE, Action.REJECT, Action.FORCE_RECLAIM])
def test_only_operators_decide(action: Action) -> None:
    authorize(action, "U0000000OPS", OPS)
    with pytest.raises(NotAllowed):
        authorize(action, "U0000000001", OPS)


@pytest.mark.parametrize("action", [Action.RELEASE, Action.EXTEND, Action.KEEP])
def test_owner_or_operator_release_and_extend(action: Action) -> None:
    mine = alloc(1, Phase.ALLOCATED, 1)
    authorize(action, "U0000000001", OPS, mine)
    authorize(action, "U0000000OPS", OPS, mine)
    with pytest.raises(NotAllowed, match="IR-1"):
        authorize(action, "U0000000002", OPS, mine)


def test_anyone_requests_and_looks() -> None:
    authorize(Action.REQUEST, "U0000000002", frozenset())
    authorize(Action.LOOK, "U0000000002", frozenset())


def test_extension_respects_max_days(farm: FarmConfig) -> None:
    mine = alloc(1, Phase.ALLOCATED, 1).model_copy(update={"duration_days": 20})
    assert extension_days(mine, farm, None) == 7
    assert extension_days(mine, farm, 10) == 10
    with pytest.raises(ValidationFailed, match="limit of 30 days"):
        extension_days(mine, farm, 11)
