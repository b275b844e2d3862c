"""The farm configuration: pools (environments), GPU models, team quotas, operators and idle settings.

Operators keep it as YAML: a file locally (GPUFARM_FARM_CONFIG), an SSM parameter in Lambda. It is validated with
pydantic so a typo (a quota for a model the pool does not offer, an unknown pool) fails loudly with the path of the
offending key instead of silently granting or refusing GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufarm.core.config.accounting import MAX_BUDGETS, Budget, LedgerSettings, budget_problems
from gpufarm.core.config.digest import DigestSettings
from gpufarm.core.config.enforce import EnforcementSettings, Enforcer
from gpufarm.core.config.farm_error import FarmConfigError as FarmConfigError  # noqa: PLC0414 - its home before
from gpufarm.core.config.farm_error import unknown_team
from gpufarm.core.config.idle_choice import IdleChoiceSettings
from gpufarm.core.config.inventory import InventorySettings
from gpufarm.core.config.keeps import KeepSettings
from gpufarm.core.config.lending import LendingSettings
from gpufarm.core.config.pool_kind import PoolKind as PoolKind  # noqa: PLC0414 - its home before
from gpufarm.core.config.rates import RateSettings
from gpufarm.core.config.reservations import ReservationSettings
from gpufarm.core.config.scheduling import SchedulingSettings
from gpufarm.core.config.squatters import SquatterPolicy
from gpufarm.core.config.yaml_load import MAX_NUMBER_CHARS, NumberTooLong, bounded_loader
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.model import GPU_MODEL_PATTERN, MAX_DURATION_DAYS, MAX_GPU_COUNT, SLACK_USER_PATTERN, Name

_MODEL_RE = re.compile(GPU_MODEL_PATTERN)


def _model_name(text: str) -> str:
    value = text.strip().upper()
    if not _MODEL_RE.match(value):
        raise ValueError(f"'{text}' is not a GPU model name (letters, digits, '-', '_', '.')")
    return value


ModelName = Annotated[str, AfterValidator(_model_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuModelSpec(_Strict):
    """A GPU model the farm offers."""

    description: str = ""
    memory_gb: int | None = Field(default=None, ge=1, le=4096)


class Visibility(StrEnum):
    """Who sees a lease's status, list line, links and profiler runs (gpufarm.core.governance.visibility)."""

    # Its requester, its team's members and the GPU operators.
    TEAM = "team"
    # Everyone in the workspace.
    ORG = "org"


class MetricsSource(StrEnum):
    """What reports a pool's GPU metrics, and so what its idle monitors read (gpufarm.setup.monitors)."""

    # gpufarm's own node agent: `gpufarm.gpu.*` series tagged per device with the lease (`gpu_ir`).
    GPUFARM_NODE = "gpufarm-node"
    # The Datadog Agent's GPU check: `gpu.*` series tagged `gpu_uuid`; the lease comes from the host's `ir:` tags.
    DATADOG_AGENT = "datadog-agent"


class EnvironmentSpec(_Strict):
    """A pool of GPU hosts: where GPUs come from and how they are shared."""

    kind: PoolKind = PoolKind.DEDICATED
    metrics_source: MetricsSource = MetricsSource.GPUFARM_NODE
    description: str = ""
    gpu_models: tuple[ModelName, ...] = Field(min_length=1)
    # Known clusters of the pool; placement prefers one cluster, this list only documents (hosts carry cluster tags).
    clusters: tuple[Name, ...] = ()
    # What enforces its leases (gpufarm.core.config.enforce): none, or a Slurm reservation per lease.
    enforce: Enforcer = Enforcer.NONE
    # What gpufarm does about squatters on its devices (gpufarm.core.config.squatters): report, or stop after a grace.
    squatters: SquatterPolicy = SquatterPolicy()


class ModelQuota(_Strict):
    """A team's entitlement for one model in one pool."""

    # Granted at once (approved by policy) while the team's live total stays within this.
    gpus: int = Field(ge=0, le=MAX_GPU_COUNT)
    # Beyond `gpus` and up to this total, operators decide; above it the request is refused. None: no cap
    # beyond the pool's size.
    hard_limit: int | None = Field(default=None, ge=0, le=MAX_GPU_COUNT)

    @model_validator(mode="after")
    def _limit_covers_quota(self) -> ModelQuota:
        if self.hard_limit is not None and self.hard_limit < self.gpus:
            raise ValueError(f"hard_limit ({self.hard_limit}) must be at least gpus ({self.gpus})")
        return self


USERGROUP_PATTERN = r"^S[A-Z0-9]{2,20}$"
# A team names its people by user group in the main; a listed user is for the odd guest, not a directory.
MAX_TEAM_USERS = 500


class TeamMembers(_Strict):
    """Who may act for a team: the members of a Slack user group, users named here, or both."""

    usergroup: str | None = Field(default=None, pattern=USERGROUP_PATTERN)
    users: tuple[Annotated[str, Field(pattern=SLACK_USER_PATTERN)], ...] = Field(default=(), max_length=MAX_TEAM_USERS)

    @model_validator(mode="after")
    def _names_someone(self) -> TeamMembers:
        if self.usergroup is None and not self.users:
            raise ValueError("name a usergroup (its S... id), users (U... ids), or both")
        return self


# A cost center as finance systems name them: letters, digits, and `-`, `_`, `.`, `/`, at most 40 characters.
COST_CENTER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,39}$"


class TeamSpec(_Strict):
    """A team: who belongs to it, its quotas per pool and model, and the longest allocation it may hold."""

    description: str = ""
    # None only in a farm where no team names members (membership is then not checked:
    # gpufarm.core.governance.membership).
    members: TeamMembers | None = None
    max_days: int = Field(default=30, ge=1, le=MAX_DURATION_DAYS)
    quotas: dict[Name, dict[ModelName, ModelQuota]] = Field(default_factory=dict)
    # The cost center finance charges the team's GPU-hours to (the chargeback's column; gpufarm.reporting.chargeback).
    cost_center: str | None = Field(default=None, pattern=COST_CENTER_PATTERN)
    # The team's Slack channel: its budget alerts go there (else by DM to the users `members` names).
    channel: str | None = Field(default=None, pattern=r"^[CG][A-Z0-9]{2,20}$")


class IdleKind(StrEnum):
    """The ways an allocation's GPUs can be idle; each gets its own monitor (gpufarm.setup.monitors)."""

    # No compute process on the lease's GPUs for the whole window.
    IDLE = "idle"
    # Memory held but no activity (the agent's idle_held state) for the whole window: "alive but useless".
    IDLE_HELD = "idle_held"
    # Mean utilisation below the threshold over the window.
    LOW_UTILIZATION = "low_utilization"


class PartialIdle(StrEnum):
    """What becomes of the idle hosts (or devices) of a lease whose other hosts are busy, once the grace has passed.

    A lease idle everywhere is reclaimed whole after the grace either way (gpufarm.core.idle.partial).
    """

    # The idle part is warned about (and re-warned while it stays idle); the lease keeps every host.
    WARN = "warn"
    # The idle part goes back to the pool: the lease shrinks to its busy hosts and stays open.
    RECLAIM = "reclaim"


_MAX_WINDOW = 24 * 60  # minutes: the longest start-up grace, as long as the longest monitor window
_MAX_GRACE = 7 * 24 * 60
# The evaluation windows a metric monitor query takes in every version of Datadog's monitor API reference:
# last_5m, last_10m, last_15m, last_30m, last_1h, last_2h, last_4h, last_1d (docs/datadog.md, "Monitor windows").
# An idle kind's window is one of them, so `gpufarm datadog apply` never rests on a custom window Datadog's current
# reference allows only "depending on the monitor type" (gpufarm.setup.monitors.window_text writes them).
MONITOR_WINDOW_MINUTES = (5, 10, 15, 30, 60, 120, 240, 1440)


def _monitor_window(minutes: int) -> int:
    if minutes not in MONITOR_WINDOW_MINUTES:
        allowed = ", ".join(str(m) for m in MONITOR_WINDOW_MINUTES)
        raise ValueError(f"{minutes} minutes is not one of Datadog's documented monitor windows; use {allowed}")
    return minutes


MonitorWindow = Annotated[int, AfterValidator(_monitor_window)]


class IdleKindPolicy(_Strict):
    """One idle kind: whether its monitor exists, the window it judges over, and (low utilisation) its threshold."""

    enabled: bool = True
    # Minutes, one of MONITOR_WINDOW_MINUTES.
    window_minutes: MonitorWindow = 60
    # Only low_utilization has one: "idle" counts processes, "idle_held" uses the agent's own state.
    threshold_percent: float | None = Field(default=None, ge=0, le=100)


class IdleKindOverride(_Strict):
    """An override of one idle kind: only what it sets changes."""

    enabled: bool | None = None
    window_minutes: MonitorWindow | None = None
    threshold_percent: float | None = Field(default=None, ge=0, le=100)


def _default_kinds() -> dict[IdleKind, IdleKindPolicy]:
    return {
        IdleKind.IDLE: IdleKindPolicy(window_minutes=60),
        IdleKind.IDLE_HELD: IdleKindPolicy(window_minutes=60),
        IdleKind.LOW_UTILIZATION: IdleKindPolicy(window_minutes=120, threshold_percent=5.0),
    }


class IdlePolicy(_Strict):
    """The idle policy in effect for one environment and team: what its monitors judge and how long warnings wait."""

    grace_minutes: int
    startup_grace_minutes: int
    kinds: dict[IdleKind, IdleKindPolicy]
    partial: PartialIdle = PartialIdle.RECLAIM

    def enabled(self) -> list[tuple[IdleKind, IdleKindPolicy]]:
        """The kinds whose monitors exist, in IdleKind order."""
        return [(kind, self.kinds[kind]) for kind in IdleKind if self.kinds[kind].enabled]


class IdleOverride(_Strict):
    """A per-environment or per-team change to the idle policy; keys left out inherit."""

    grace_minutes: int | None = Field(default=None, ge=1, le=_MAX_GRACE)
    startup_grace_minutes: int | None = Field(default=None, ge=0, le=_MAX_WINDOW)
    kinds: dict[IdleKind, IdleKindOverride] = Field(default_factory=dict)
    partial: PartialIdle | None = None

    @model_validator(mode="after")
    def _thresholds_where_they_mean_something(self) -> IdleOverride:
        _check_thresholds({k: v.threshold_percent for k, v in self.kinds.items()})
        return self


# Keys of the first idle section (read by nothing then); a file that still has them is told where they went.
_MOVED_KEYS = {
    "threshold_percent": "idle.kinds.low_utilization.threshold_percent",
    "window_minutes": "idle.kinds.<kind>.window_minutes",
}


class IdleSettings(_Strict):
    """Idle reclaim: the monitors' kinds, windows and thresholds, the start-up grace, and the warning's grace.

    Overrides apply per environment, then per team (a team's override wins over its environment's). The monitors
    `gpufarm datadog apply` creates are generated from this (gpufarm.setup.monitors); the grace decides when a
    warned allocation that is still idle is reclaimed.
    """

    # A warned allocation still idle this long after the warning is reclaimed (reason idle).
    grace_minutes: int = Field(default=60, ge=1, le=_MAX_GRACE)
    # A fresh allocation's GPUs are not judged for this long (the monitors' new_group_delay).
    startup_grace_minutes: int = Field(default=30, ge=0, le=_MAX_WINDOW)
    # Per kind: only what is set changes the defaults (idle and idle_held: 60 min; low_utilization: 120 min, 5 %).
    kinds: dict[IdleKind, IdleKindOverride] = Field(default_factory=dict)
    # Part of a multi-host lease idle past the grace, the rest busy: return that part (reclaim) or only warn.
    partial: PartialIdle = PartialIdle.RECLAIM
    environments: dict[Name, IdleOverride] = Field(default_factory=dict)
    teams: dict[Name, IdleOverride] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key, where in _MOVED_KEYS.items():
                if key in data:
                    raise ValueError(f"idle.{key} is no longer read; set {where} instead")
        return data

    @field_validator("kinds", mode="after")
    @classmethod
    def _thresholds(cls, kinds: dict[IdleKind, IdleKindOverride]) -> dict[IdleKind, IdleKindOverride]:
        _check_thresholds({k: v.threshold_percent for k, v in kinds.items()})
        return kinds

    def policy(self, environment: str | None = None, team: str | None = None) -> IdlePolicy:
        """The policy in effect for an allocation of `team` in `environment` (either may be unknown: None)."""
        grace, startup, partial = self.grace_minutes, self.startup_grace_minutes, self.partial
        kinds = _default_kinds()
        for kind, change in self.kinds.items():
            kinds[kind] = kinds[kind].model_copy(update=change.model_dump(exclude_none=True))
        for override in (self.environments.get(environment or ""), self.teams.get(team or "")):
            if override is None:
                continue
            grace = override.grace_minutes if override.grace_minutes is not None else grace
            if override.startup_grace_minutes is not None:
                startup = override.startup_grace_minutes
            partial = override.partial if override.partial is not None else partial
            for kind, change in override.kinds.items():
                kinds[kind] = kinds[kind].model_copy(update=change.model_dump(exclude_none=True))
        return IdlePolicy(grace_minutes=grace, startup_grace_minutes=startup, kinds=kinds, partial=partial)

    def grace_for(self, environment: str | None, team: str | None) -> int:
        """Minutes a warned allocation of this environment and team may stay idle before it is reclaimed."""
        return self.policy(environment, team).grace_minutes


def _check_thresholds(thresholds: Mapping[IdleKind, float | None]) -> None:
    for kind, value in thresholds.items():
        if value is not None and kind is not IdleKind.LOW_UTILIZATION:
            raise ValueError(f"kinds.{kind.value}.threshold_percent: only low_utilization has a threshold")


class WasteAction(StrEnum):
    """What a request that would leave most of a dedicated host unused gets (gpufarm.core.governance.charging)."""

    ALLOW = "allow"  # charged the whole host and granted as the quota allows
    OPERATORS = "operators"  # charged the whole host and sent to an operator whatever the quota says
    REFUSE = "refuse"  # refused: ask for the whole host, or use a shared pool


class ChargingPolicy(_Strict):
    """The charging policy in effect for one environment and team."""

    waste: WasteAction
    waste_threshold_percent: float


class ChargingOverride(_Strict):
    """A per-environment or per-team change to the charging policy; keys left out inherit."""

    waste: WasteAction | None = None
    waste_threshold_percent: float | None = Field(default=None, ge=0, le=100)


class ChargingSettings(_Strict):
    """Dedicated pools charge whole hosts; this says what happens to a request that would waste most of one.

    A request wastes the share of the GPUs it is charged for that it did not ask for (1 asked on an 8-GPU host:
    87.5 %); above the threshold the `waste` action applies. Overrides apply per environment, then per team.
    """

    waste: WasteAction = WasteAction.ALLOW
    waste_threshold_percent: float = Field(default=50.0, ge=0, le=100)
    environments: dict[Name, ChargingOverride] = Field(default_factory=dict)
    teams: dict[Name, ChargingOverride] = Field(default_factory=dict)

    def policy(self, environment: str | None = None, team: str | None = None) -> ChargingPolicy:
        """The policy in effect for a request of `team` in `environment`."""
        values = _overridden(self, (self.environments.get(environment or ""), self.teams.get(team or "")))
        return ChargingPolicy.model_validate(values)


_MAX_WAITING_HOURS = 90 * 24
_MAX_REMINDER_HOURS = 30 * 24


class LeasePolicy(_Strict):
    """The lease policy in effect for one environment and team."""

    waiting_max_hours: int
    reminder_hours: int


class LeaseOverride(_Strict):
    """A per-environment or per-team change to the lease policy; keys left out inherit."""

    waiting_max_hours: int | None = Field(default=None, ge=1, le=_MAX_WAITING_HOURS)
    reminder_hours: int | None = Field(default=None, ge=0, le=_MAX_REMINDER_HOURS)


class LeaseSettings(_Strict):
    """Leases: how long an approved request may wait for hosts, and when the holder is reminded of the end.

    A lease's days count from the moment its hosts are allocated; until then it waits at most
    `waiting_max_hours` from when it started waiting, then it is withdrawn. `reminder_hours` before the end the
    holder gets one reminder with Extend and Release (0: none). Overrides apply per environment, then per team.
    """

    waiting_max_hours: int = Field(default=72, ge=1, le=_MAX_WAITING_HOURS)
    reminder_hours: int = Field(default=24, ge=0, le=_MAX_REMINDER_HOURS)
    environments: dict[Name, LeaseOverride] = Field(default_factory=dict)
    teams: dict[Name, LeaseOverride] = Field(default_factory=dict)

    def policy(self, environment: str | None = None, team: str | None = None) -> LeasePolicy:
        """The policy in effect for a lease of `team` in `environment`."""
        values = _overridden(self, (self.environments.get(environment or ""), self.teams.get(team or "")))
        return LeasePolicy.model_validate(values)


def _overridden(base: BaseModel, overrides: Iterable[BaseModel | None]) -> dict[str, Any]:
    """The base settings' own values (not their override tables) with each override's set keys applied in order."""
    values = base.model_dump(exclude={"environments", "teams"})
    for override in overrides:
        if override is not None:
            values |= override.model_dump(exclude_none=True)
    return values


class Defaults(_Strict):
    """Values used when a request leaves them out."""

    duration_days: int = Field(default=7, ge=1, le=MAX_DURATION_DAYS)
    extend_days: int = Field(default=7, ge=1, le=MAX_DURATION_DAYS)


class ProfileSettings(_Strict):
    """Profiler runs (gpufarm profile upload): how many days their traces and pages are kept.

    The S3 bucket's lifecycle rule (template.yaml, parameter ProfileRetentionDays, deployed with this value)
    deletes them then, and the page links gpufarm signs expire at the same time.
    """

    retention_days: int = Field(default=30, ge=1, le=400)


class FarmConfig(_Strict):
    """The whole farm configuration."""

    operators_usergroup: str | None = Field(default=None, pattern=r"^S[A-Z0-9]{2,20}$")
    operators_channel: str | None = Field(default=None, pattern=r"^[CG][A-Z0-9]{2,20}$")
    gpu_models: dict[ModelName, GpuModelSpec] = Field(min_length=1)
    environments: dict[Name, EnvironmentSpec] = Field(min_length=1)
    teams: dict[Name, TeamSpec] = Field(default_factory=dict)
    # Who sees a lease: its team (requester, members, operators) or, opened on purpose, the whole workspace.
    visibility: Visibility = Visibility.TEAM
    idle: IdleSettings = IdleSettings()
    keeps: KeepSettings = KeepSettings()
    charging: ChargingSettings = ChargingSettings()
    leases: LeaseSettings = LeaseSettings()
    defaults: Defaults = Defaults()
    inventory: InventorySettings = InventorySettings()
    ledger: LedgerSettings = LedgerSettings()
    budgets: tuple[Budget, ...] = Field(default=(), max_length=MAX_BUDGETS)
    profiles: ProfileSettings = ProfileSettings()
    # The operators' daily digest: when it is posted and its pressure thresholds (gpufarm.core.config.digest).
    digest: DigestSettings = DigestSettings()
    enforcement: EnforcementSettings = EnforcementSettings()
    # Borrowing idle quota and preemption on notice, per pool (gpufarm.core.config.lending).
    lending: LendingSettings = LendingSettings()
    # How each pool orders its queue and withdraws unapprovable requests (gpufarm.core.config.scheduling).
    scheduling: SchedulingSettings = SchedulingSettings()
    # Bounds on the idle window and grace a request may choose (gpufarm.core.config.idle_choice).
    idle_choice: IdleChoiceSettings = IdleChoiceSettings()
    # Bookings on the pools' calendars (gpufarm.core.config.reservations).
    reservations: ReservationSettings = ReservationSettings()
    # What a GPU-hour costs per pool and model (gpufarm.core.config.rates, gpufarm.core.money.card).
    rates: RateSettings = RateSettings()

    @model_validator(mode="after")
    def _references_resolve(self) -> FarmConfig:
        agent_pools = [n for n, e in self.environments.items() if e.metrics_source is MetricsSource.DATADOG_AGENT]
        offered = {n: e.gpu_models for n, e in self.environments.items()}
        problems = self.inventory.problems(offered, agent_pools)
        problems += budget_problems(self.budgets, self.teams, priced=bool(self.rates.environments))
        problems += self.enforcement.problems({n: e.enforce for n, e in self.environments.items()}, self.teams)
        problems += self.lending.problems(self.environments, self.teams)
        problems += self.scheduling.problems(self.environments) + self.idle_choice.problems(self.environments)
        problems += self.reservations.problems(set(self.environments))
        problems += self.rates.problems(offered)
        if problems:
            raise ValueError("; ".join(problems))
        for env_name, env in self.environments.items():
            for model in env.gpu_models:
                if model not in self.gpu_models:
                    raise ValueError(f"environments.{env_name}.gpu_models: '{model}' is not listed in gpu_models")
        for team_name, team in self.teams.items():
            for env_name, models in team.quotas.items():
                pool = self.environments.get(env_name)
                if pool is None:
                    raise ValueError(f"teams.{team_name}.quotas: '{env_name}' is not an environment")
                for model in models:
                    if model not in pool.gpu_models:
                        raise ValueError(f"teams.{team_name}.quotas.{env_name}: '{env_name}' offers no '{model}'")
            if self.defaults.duration_days > team.max_days:
                raise ValueError(
                    f"teams.{team_name}.max_days ({team.max_days}) is below defaults.duration_days "
                    f"({self.defaults.duration_days})"
                )
        self._overrides_and_members_resolve()
        return self

    def _overrides_and_members_resolve(self) -> None:
        for section, settings in (("idle", self.idle), ("charging", self.charging), ("leases", self.leases)):
            for env_name in settings.environments:
                if env_name not in self.environments:
                    raise ValueError(f"{section}.environments: '{env_name}' is not an environment")
            for team_name in settings.teams:
                if team_name not in self.teams:
                    raise ValueError(f"{section}.teams: '{team_name}' is not a team")
        open_teams = sorted(name for name, team in self.teams.items() if team.members is None)
        if open_teams and len(open_teams) < len(self.teams):
            # A team left without members would let anyone charge it: once membership is on, it is on for all.
            raise ValueError(f"teams.{open_teams[0]}.members: every team names its members once one team does")

    @property
    def membership_checked(self) -> bool:
        """True when the teams name their members, so who may act for a team is checked
        (gpufarm.core.governance.membership)."""
        return any(team.members is not None for team in self.teams.values())

    @model_validator(mode="after")
    def _keep_overrides_resolve(self) -> FarmConfig:
        for env_name in self.keeps.environments:
            if env_name not in self.environments:
                raise ValueError(f"keeps.environments: '{env_name}' is not an environment")
        for team_name in self.keeps.teams:
            if team_name not in self.teams:
                raise ValueError(f"keeps.teams: '{team_name}' is not a team")
        return self

    # -- lookups that raise errors a Slack user can act on -----------------------------------------

    def environment(self, name: str) -> EnvironmentSpec:
        """The pool called `name`; ValidationFailed naming the known pools otherwise."""
        env = self.environments.get(name)
        if env is None:
            known = ", ".join(sorted(self.environments))
            raise ValidationFailed("environment", f"unknown environment '{_short(name)}'; choose one of {known}")
        return env

    def team(self, name: str) -> TeamSpec:
        """The team called `name`; ValidationFailed naming the known teams otherwise."""
        team = self.teams.get(name)
        if team is None:
            raise unknown_team(name, list(self.teams))
        return team

    def model(self, name: str) -> str:
        """The canonical (upper-case) model name; ValidationFailed naming the known models otherwise."""
        canonical = name.strip().upper()
        if canonical not in self.gpu_models:
            known = ", ".join(sorted(self.gpu_models))
            raise ValidationFailed("gpu_model", f"unknown GPU model '{_short(name)}'; choose one of {known}")
        return canonical

    def quota(self, team: str, environment: str, gpu_model: str) -> ModelQuota | None:
        """The team's quota for a model in a pool, or None when it has none."""
        spec = self.teams.get(team)
        if spec is None:
            return None
        return spec.quotas.get(environment, {}).get(gpu_model.upper())

    def environments_offering(self, gpu_model: str) -> list[str]:
        """Pools that offer a model, sorted."""
        model = gpu_model.upper()
        return sorted(name for name, env in self.environments.items() if model in env.gpu_models)

    def valid_values(self) -> dict[str, list[str]]:
        """Dropdown choices for the incident fields whose values come from this file (for `datadog apply`)."""
        return {
            "team": sorted(self.teams),
            "gpu_model": sorted(self.gpu_models),
            "environment": sorted(self.environments),
        }


def parse_farm(text: str) -> FarmConfig:
    """Parse and validate farm YAML; FarmConfigError with every problem and its path otherwise."""
    import yaml

    try:
        data: Any = yaml.load(text, Loader=bounded_loader())  # noqa: S506 - a safe loader (bounded_loader)
    except NumberTooLong as exc:
        raise FarmConfigError(
            f"farm configuration is invalid: {exc.where}: a number of {exc.length:,} characters is too long "
            f"(no farm setting takes more than {MAX_NUMBER_CHARS})"
        ) from None
    except yaml.YAMLError as exc:
        raise FarmConfigError(f"farm configuration is not valid YAML: {exc}") from None
    except ValueError:
        # Kept as a backstop: a constructor's int() or float() refusing its text is still an invalid file.
        raise FarmConfigError("farm configuration is invalid: a number in it cannot be read") from None
    if not isinstance(data, Mapping):
        raise FarmConfigError("farm configuration must be a YAML mapping")
    try:
        return FarmConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors(include_url=False)
        )
        raise FarmConfigError(f"farm configuration is invalid: {problems}") from None


def _short(text: str) -> str:
    value = str(text)[:40]
    return "".join(ch if ch.isprintable() else "?" for ch in value)
