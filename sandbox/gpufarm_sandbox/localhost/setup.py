"""The Datadog setup `gpufarm local` makes before it accepts requests: `gpufarm datadog apply` on its own sandbox.

The same plan and apply code as the operator command (gpufarm.cli.datadog.run_apply), with what the local functions
use: the sandbox's keys, the local webhook secret, the incident webhook's and idle alert's Function URLs, and the
farm configuration the functions read (its dropdown choices and idle monitors). So the first `/gpu request` finds
gpufarm's incident type, fields, webhooks, notification rules and idle monitors in place. Applying again changes
nothing (every object reads back unchanged; the secret variable cannot be read back and is kept). Without a farm
configuration (a template elsewhere than this repository, no GPUFARM_FARM_CONFIG) there is nothing to give the team,
GPU model and environment fields as choices, so the setup is skipped and says so.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpufarm.setup.plan import Plan

# Plan kinds as the summary names them, in the order apply makes them.
KIND_LABELS = (
    ("incident type", "incident type"),
    ("field", "fields"),
    ("custom variable", "secret variable"),
    ("webhook", "webhooks"),
    ("notification rule", "notification rules"),
    ("monitor", "monitors"),
    ("dashboard", "dashboards"),
    ("metric metadata", "metric metadata"),
)
ACTIONS = ("create", "update", "delete", "unchanged")
PAST = {"create": "created", "update": "updated", "delete": "deleted", "unchanged": "unchanged"}


SKIPPED = (
    "datadog setup: skipped, no farm configuration (GPUFARM_FARM_CONFIG, or config/farm.example.yaml beside the "
    "template): `gpufarm datadog apply --farm-config FILE` sets the sandbox up by hand"
)


@dataclass(frozen=True)
class LocalSetup:
    """What the local setup did: the applied plan (None: skipped, no farm configuration), how long it took, and
    where the farm configuration came from."""

    plan: Plan | None
    seconds: float
    farm: str | None

    def counts(self, kind: str | None = None) -> dict[str, int]:
        """Objects per action (created, updated, deleted, unchanged), of one kind or of all."""
        changes = self.plan.changes if self.plan is not None else ()
        found = Counter(c.action.value for c in changes if kind is None or c.kind == kind)
        return {PAST[action]: found[action] for action in ACTIONS}

    def lines(self) -> list[str]:
        """The printed summary: totals, then one line per kind of object; names and counts only, never a value."""
        if self.plan is None:
            return [SKIPPED]
        totals = _counted(self.counts()) or "nothing"
        lines = [f"datadog setup (gpufarm datadog apply on the sandbox) in {self.seconds:.2f}s: {totals}"]
        lines += [f"  {label:<19} {_counted(self.counts(kind)) or 'none'}" for kind, label in KIND_LABELS]
        lines.append(f"  farm configuration  {self.farm}")
        return lines


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {action}" for action, n in counts.items() if n)


class Running(Protocol):
    """A running local environment (start_local's LocalEnv): the variables its functions were given."""

    @property
    def env(self) -> dict[str, str]:
        """The environment the local functions read."""


def apply_local_setup(env: Running) -> LocalSetup:
    """Run `gpufarm datadog apply` against env's sandbox with the local functions' URLs, secret and farm.

    Reads the settings from the environment start_local has set (os.environ). Raises what apply raises: a
    ValidationFailed when the plan is blocked (nothing is changed then), an UpstreamError when the sandbox refuses.
    """
    from gpufarm.cli.datadog import load_farm, run_apply
    from gpufarm.config import Settings
    from gpufarm.setup.plan import IDLE_WEBHOOK_URL_ENV, INCIDENT_WEBHOOK_URL_ENV

    started = time.perf_counter()
    settings = Settings()
    farm = load_farm(settings)
    if farm is None:
        return LocalSetup(plan=None, seconds=time.perf_counter() - started, farm=None)
    plan = run_apply(
        settings,
        incident_webhook_url=env.env[INCIDENT_WEBHOOK_URL_ENV],
        idle_webhook_url=env.env[IDLE_WEBHOOK_URL_ENV],
        env=env.env,
        farm=farm,
    )
    where = settings.farm_config_parameter or settings.farm_config
    return LocalSetup(plan=plan, seconds=time.perf_counter() - started, farm=where)
