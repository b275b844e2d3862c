"""Who may do what, and whether a request is granted at once, sent to operators, or refused.

Refusals over a hard limit create no incident: nothing was granted, nothing needs reclaiming, and an incident per
refused typo would bury the real allocations. The requester sees the reason at once; requests an operator rejects
do become incidents (phase rejected), because a person decided and that decision is audited.

That up-front check is advisory: it reads what is granted before the request joins its pool's queue. The decision
that counts runs again in the pool's queue group (docs/design.md, rule 7), against every grant committed before
it; a request that no longer fits under the hard limit there is refused and its incident closed (phase rejected,
the reason in the title), and an operator's approval that would break the hard limit is refused the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import ValidationError

from gpufarm.core.config.farm import FarmConfig, WasteAction
from gpufarm.core.governance import idle_choice
from gpufarm.core.governance.charging import Charge, waste_verdict
from gpufarm.core.kernel import bounded
from gpufarm.core.kernel.errors import NotAllowed, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import MAX_GPU_COUNT, Allocation, GpuRequest

# Phases whose GPUs count against a team's quota: granted, whether or not hosts were found yet.
GRANTED_PHASES = frozenset({Phase.APPROVED, Phase.WAITING, Phase.ALLOCATED, Phase.IDLE_WARNED})
POLICY_APPROVER = "policy"


class Verdict(StrEnum):
    """What the policy says about a request."""

    APPROVE = "approve"
    NEEDS_OPERATOR = "needs-operator"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    """The verdict with the figures behind it, so the answer can explain itself."""

    verdict: Verdict
    reason: str
    team_used: int
    entitled: int
    hard_limit: int | None
    # GPUs of an approval beyond the team's quota, borrowed from the pool's idle capacity (gpufarm.core.leases.lending).
    borrowed: int = 0


class Action(StrEnum):
    """Things a Slack user can do to an allocation."""

    REQUEST = "request"
    LOOK = "look"
    APPROVE = "approve"
    REJECT = "reject"
    RELEASE = "release"
    EXTEND = "extend"
    KEEP = "keep"
    FORCE_RECLAIM = "force-reclaim"


OPERATOR_ONLY = frozenset({Action.APPROVE, Action.REJECT, Action.FORCE_RECLAIM})
OWNER_OR_OPERATOR = frozenset({Action.RELEASE, Action.EXTEND, Action.KEEP})

# Form and inline names of each request field, in the order errors should be reported.
REQUEST_FIELDS = ("gpu_count", "gpu_model", "environment", "team", "project", "duration_days", "purpose")


def authorize(action: Action, actor: str, operators: frozenset[str], allocation: Allocation | None = None) -> None:
    """Raise NotAllowed unless `actor` may do `action` (operators approve/reject/reclaim; owners release/extend)."""
    if action in OPERATOR_ONLY and actor not in operators:
        raise NotAllowed(f"only GPU operators can {action.value.replace('-', ' ')} allocations")
    if action in OWNER_OR_OPERATOR:
        owner = allocation.requester if allocation is not None else None
        if actor != owner and actor not in operators:
            label = allocation.ir_label if allocation is not None else "this allocation"
            raise NotAllowed(f"only the requester of {label} or a GPU operator can {action.value} it")


def build_request(
    values: Mapping[str, str | None],
    farm: FarmConfig,
    *,
    requester: str,
    channel: str | None,
    request_id: str,
) -> GpuRequest:
    """Turn raw form or inline values into a validated request; ValidationFailed names the first bad field."""
    raw = {k: (v.strip() if isinstance(v, str) else v) for k, v in values.items()}
    count = _count(raw.get("gpu_count"))
    model = _required(raw, "gpu_model", "say which GPU model, e.g. H100")
    model = farm.model(model)
    env_name = raw.get("environment") or _only_environment(farm, model)
    env = farm.environment(env_name.lower())
    if model not in env.gpu_models:
        offering = ", ".join(farm.environments_offering(model)) or "no pool"
        raise ValidationFailed("environment", f"{env_name} offers no {model}; {model} is in {offering}")
    team_name = _required(raw, "team", "say which team the GPUs are for, e.g. team=nlp").lower()
    team = farm.team(team_name)
    project = _required(raw, "project", "say which project the GPUs are for, e.g. project=llm-ko")
    days = _days(raw.get("duration_days"), farm.defaults.duration_days)
    if days > team.max_days:
        raise ValidationFailed(
            "duration_days", f"team {team_name} may hold GPUs for at most {team.max_days} days, not {days}"
        )
    window, grace = idle_choice.choose(farm, env_name.lower(), team_name, raw.get("idle_window"), raw.get("idle_grace"))
    try:
        return GpuRequest(
            team=team_name,
            project=project,
            gpu_model=model,
            gpu_count=count,
            environment=env_name.lower(),
            duration_days=days,
            purpose=raw.get("purpose") or "",
            requester=requester,
            channel=channel,
            request_id=request_id,
            idle_window_minutes=window,
            idle_grace_minutes=grace,
        )
    except ValidationError as exc:
        raise _first_error(exc) from None


@dataclass(frozen=True)
class Ask:
    """What a request asks for, as the policy weighs it (from a new request or from its incident)."""

    team: str
    environment: str
    gpu_model: str
    gpu_count: int
    # What it counts against the quota (whole hosts on dedicated pools, gpufarm.core.governance.charging); None:
    # gpu_count.
    charge: Charge | None = None

    @property
    def charged(self) -> int:
        """GPUs the request counts against its team's quota."""
        return self.charge.charged if self.charge is not None else self.gpu_count


def decide_grant(request: Ask, farm: FarmConfig, *, team_used: int, pool_capacity: int) -> Decision:
    """Approve within the team's remaining quota, ask operators beyond it, refuse over a hard limit; the reason says
    when whole hosts are charged."""
    decision = _decide_grant(request, farm, team_used=team_used, pool_capacity=pool_capacity)
    note = request.charge.explain() if request.charge is not None else None
    return replace(decision, reason=f"{note}; {decision.reason}") if note else decision


def _decide_grant(request: Ask, farm: FarmConfig, *, team_used: int, pool_capacity: int) -> Decision:
    quota = farm.quota(request.team, request.environment, request.gpu_model)
    entitled = quota.gpus if quota else 0
    hard = quota.hard_limit if quota else None
    total = team_used + request.charged
    where = f"{request.gpu_model} in {request.environment}"
    if quota is None:
        return Decision(
            Verdict.REFUSE,
            f"team {request.team} has no quota for {where}; ask the GPU operators to add one",
            team_used,
            0,
            None,
        )
    if request.gpu_count > pool_capacity:
        return Decision(
            Verdict.REFUSE,
            f"{request.environment} has only {pool_capacity} {request.gpu_model} GPUs in total; "
            f"{request.gpu_count} can never be allocated",
            team_used,
            entitled,
            hard,
        )
    if hard is not None and total > hard:
        return Decision(
            Verdict.REFUSE,
            f"team {request.team} would hold {total} {where}, over its hard limit of {hard} (it holds {team_used} now)",
            team_used,
            entitled,
            hard,
        )
    waste = waste_verdict(farm, request.team, request.charge) if request.charge is not None else None
    if waste is not None and waste[0] is WasteAction.REFUSE:
        return Decision(
            Verdict.REFUSE,
            f"{waste[1]}; ask for whole hosts, or use a shared pool",
            team_used,
            entitled,
            hard,
        )
    if waste is not None:
        return Decision(Verdict.NEEDS_OPERATOR, f"{waste[1]}; an operator decides", team_used, entitled, hard)
    if total <= entitled:
        return Decision(
            Verdict.APPROVE,
            f"within team {request.team}'s quota ({total} of {entitled} {where})",
            team_used,
            entitled,
            hard,
        )
    return Decision(
        Verdict.NEEDS_OPERATOR,
        f"team {request.team} would hold {total} {where}, beyond its quota of {entitled}; an operator decides",
        team_used,
        entitled,
        hard,
    )


def over_hard_limit(request: Ask, farm: FarmConfig, *, team_used: int) -> str | None:
    """Why granting `request` on top of `team_used` would break the team's hard limit, or None when it would not."""
    quota = farm.quota(request.team, request.environment, request.gpu_model)
    if quota is None or quota.hard_limit is None:
        return None
    total = team_used + request.charged
    if total <= quota.hard_limit:
        return None
    return (
        f"team {request.team} would hold {total} {request.gpu_model} in {request.environment}, over its hard limit "
        f"of {quota.hard_limit} (it holds {team_used} now)"
    )


def team_usage(
    allocations: Iterable[Allocation],
    team: str,
    environment: str,
    gpu_model: str,
    charge: Callable[[Allocation], int] | None = None,
) -> int:
    """GPUs a team holds or has been granted for one model in one pool: `charge` of each (gpu_count without one)."""
    model = gpu_model.upper()
    return sum(
        (charge(a) if charge is not None else a.gpu_count)
        for a in allocations
        if a.phase in GRANTED_PHASES
        and a.team == team
        and a.environment == environment
        and (a.gpu_model or "").upper() == model
    )


def extension_days(allocation: Allocation, farm: FarmConfig, days: int | None) -> int:
    """Days to add; ValidationFailed when the total would exceed the team's max_days."""
    add = days if days is not None else farm.defaults.extend_days
    team = farm.teams.get(allocation.team or "")
    limit = team.max_days if team else farm.defaults.duration_days
    total = (allocation.duration_days or 0) + add
    if total > limit:
        raise ValidationFailed(
            "days",
            f"{allocation.ir_label} would run {total} days, over team {allocation.team}'s limit of {limit} days",
        )
    return add


def _count(text: str | None) -> int:
    value = (text or "").strip()
    if not value:
        raise ValidationFailed("gpu_count", "say how many GPUs, e.g. /gpu request 8 H100 ...")
    return bounded.whole_number(value, "gpu_count", "the GPU count", maximum=MAX_GPU_COUNT)


def _days(text: str | None, default: int) -> int:
    value = (text or "").strip()
    if not value:
        return default
    return bounded.whole_number(value, "duration_days", "the duration in days")


def _required(raw: Mapping[str, str | None], name: str, hint: str) -> str:
    value = raw.get(name)
    if not value:
        raise ValidationFailed(name, hint)
    return value


def _only_environment(farm: FarmConfig, model: str) -> str:
    offering = farm.environments_offering(model)
    if len(offering) == 1:
        return offering[0]
    raise ValidationFailed("environment", f"say which environment, e.g. env={offering[0] if offering else 'cloud'}")


def _first_error(exc: ValidationError) -> ValidationFailed:
    errors = exc.errors(include_url=False)
    by_field = {str(err["loc"][0]) if err["loc"] else "request": err for err in errors}
    for name in (*REQUEST_FIELDS, *by_field):
        if name in by_field:
            msg = str(by_field[name]["msg"]).removeprefix("Value error, ")
            return ValidationFailed(name, f"{name.replace('_', ' ')}: {msg}")
    return ValidationFailed("request", "the request is invalid")
