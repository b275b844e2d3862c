"""`gpufarm datadog ...`: set Datadog up for gpufarm (real Datadog, or the sandbox via GPUFARM_DATADOG_HOST)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import click

from gpufarm.cli import BadInput
from gpufarm.config import Settings
from gpufarm.core.config.farm import FarmConfig, FarmConfigError
from gpufarm.core.kernel.errors import GpufarmError, NotFound
from gpufarm.profiling.dashboard_links import newest_run_links
from gpufarm.setup.apply import apply_setup, execute, read_current, validate_monitors
from gpufarm.setup.changes import Change
from gpufarm.setup.dashboards import desired_dashboards, desired_metadata
from gpufarm.setup.plan import IDLE_WEBHOOK_URL_ENV, INCIDENT_WEBHOOK_URL_ENV, Plan, SetupSpec, plan_setup
from gpufarm.setup.squatter_monitor import farm_monitors

# Exit statuses of `apply`, for CI pipelines (click itself exits 2 on usage errors).
EXIT_OK = 0  # applied, or (with --dry-run) nothing to change
EXIT_FAILED = 1  # blocked plan, Datadog refused or unreachable: nothing more was changed
# 2: click's usage errors and an invalid farm configuration (gpufarm.cli.BadInput): nothing was changed.
EXIT_PENDING = 3  # --dry-run only: the plan has creates or updates

APPLY_EPILOG = """\b
Exit status:
  0  applied; with --dry-run: nothing to change
  1  blocked plan or error (nothing more was changed)
  2  bad input: a usage error or an invalid farm configuration (nothing was changed)
  3  --dry-run only: changes are pending
"""


@click.group()
def datadog() -> None:
    """Datadog setup for gpufarm."""


@datadog.command(epilog=APPLY_EPILOG)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (create / update / unchanged), each monitor to create or update validated by Datadog; "
    "change nothing; exit 3 if pending.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the plan as one JSON document on stdout (kind, name, action, differences per change; no secrets).",
)
@click.option(
    "--incident-webhook-url",
    envvar=INCIDENT_WEBHOOK_URL_ENV,
    help=f"URL of the incident webhook function [env {INCIDENT_WEBHOOK_URL_ENV}].",
)
@click.option(
    "--idle-webhook-url",
    envvar=IDLE_WEBHOOK_URL_ENV,
    help=f"URL of the idle alert function [env {IDLE_WEBHOOK_URL_ENV}].",
)
@click.option(
    "--farm-config",
    "farm_config",
    type=click.Path(dir_okay=False),
    help="Farm YAML whose teams, GPU models and environments become dropdown choices "
    "[default: GPUFARM_FARM_CONFIG or the SSM parameter GPUFARM_FARM_CONFIG_PARAMETER].",
)
@click.option(
    "--prune",
    is_flag=True,
    help="Delete gpufarm's monitors (tagged gpufarm:managed) that the farm's idle policy no longer asks for, and "
    "gpufarm's dashboards (marked [gpufarm-dashboard:...]) it no longer defines [needs the farm configuration].",
)
@click.option("--rotate-secret", is_flag=True, help="Write GPUFARM_WEBHOOK_SECRET again (secrets cannot be read back).")
@click.option(
    "--incident-type",
    default=None,
    help="Name of gpufarm's own incident type, created if missing; the runtime must use the same name "
    "[default: GPUFARM_INCIDENT_TYPE or 'GPU allocation'].",
)
def apply(
    *,
    dry_run: bool,
    as_json: bool,
    incident_webhook_url: str | None,
    idle_webhook_url: str | None,
    farm_config: str | None,
    prune: bool,
    rotate_secret: bool,
    incident_type: str | None,
) -> None:
    """Create or update gpufarm's incident type, its fields and notification rules, the webhooks and secret, the
    idle monitors generated from the farm's idle policy, gpufarm's dashboards and the metric metadata."""
    from gpufarm.adapters.aws import load_settings

    try:
        settings = load_settings()
        if farm_config:
            settings = settings.replace(farm_config=farm_config, farm_config_parameter=None)
        farm = load_farm(settings, required=bool(farm_config))
        if prune and farm is None:
            raise click.UsageError("--prune needs the farm configuration (--farm-config or GPUFARM_FARM_CONFIG)")
        spec = _setup_spec(
            settings,
            farm,
            incident_webhook_url=incident_webhook_url,
            idle_webhook_url=idle_webhook_url,
            rotate_secret=rotate_secret,
            incident_type=incident_type,
            prune=prune,
        )
        plan, done = _plan_and_apply(settings, spec, with_farm=farm is not None, dry_run=dry_run, as_json=as_json)
    except FarmConfigError as exc:
        raise BadInput(str(exc)) from None
    except GpufarmError as exc:
        # Domain and upstream errors carry a user-facing message (never a key); no traceback.
        raise click.ClickException(str(exc)) from None
    if as_json:
        _emit_json(True, settings, plan, dry_run, done)
    elif dry_run:
        click.echo(f"dry run: nothing was changed ({len(plan.pending)} change(s) pending)")
    else:
        click.echo(f"applied {len(done)} change(s)" if done else "nothing to change")
    if dry_run and plan.pending:
        click.get_current_context().exit(EXIT_PENDING)


def _setup_spec(
    settings: Settings,
    farm: FarmConfig | None,
    *,
    incident_webhook_url: str | None,
    idle_webhook_url: str | None,
    rotate_secret: bool,
    incident_type: str | None,
    prune: bool,
) -> SetupSpec:
    """What apply is asked to make true; with the farm, its monitors, dashboards, metric metadata and choices."""
    valid_values = farm.valid_values() if farm is not None else {}
    spec = SetupSpec(
        incident_webhook_url=incident_webhook_url or "",
        idle_webhook_url=idle_webhook_url or "",
        valid_values=valid_values,
        rotate_secret=rotate_secret,
        has_secret=settings.webhook_secret is not None and bool(settings.webhook_secret.get_secret_value()),
        incident_type=(incident_type or settings.incident_type).strip(),
        monitors=farm_monitors(farm) if farm is not None else None,
        prune=prune,
        dashboards=desired_dashboards(farm, newest_run_links(settings, farm)) if farm is not None else None,
        metric_metadata=desired_metadata() if farm is not None else None,
    )
    if not spec.incident_type:
        raise click.UsageError("--incident-type must not be empty")
    return spec


def _plan_and_apply(
    settings: Settings, spec: SetupSpec, *, with_farm: bool, dry_run: bool, as_json: bool
) -> tuple[Plan, list[Change]]:
    """Read what Datadog holds, have it validate the monitors to create or update, print the plan, and (unless a
    dry run) execute it; a blocked plan (a monitor Datadog refused included) changes nothing."""
    from gpufarm.adapters.datadog_admin import DatadogAdmin

    done: list[Change] = []
    admin = DatadogAdmin(settings)
    try:
        if not as_json:
            click.echo(f"Datadog at {settings.datadog_base_url()}")
        current = read_current(
            admin,
            spec.incident_type,
            with_monitors=with_farm,
            with_dashboards=with_farm,
            metrics=sorted(spec.metric_metadata or {}),
        )
        # Datadog validates every monitor to create or update before anything is changed, on a dry run too.
        plan = validate_monitors(plan_setup(current, spec), admin)
        if not as_json:
            _print_plan(plan)
        if plan.blocked:
            _emit_json(as_json, settings, plan, dry_run, done)
            raise click.ClickException(f"{len(plan.blocked)} object(s) blocked; nothing was changed")
        if not dry_run:
            done = execute(plan, admin, settings.webhook_secret)
    finally:
        admin.close()
    return plan, done


def _emit_json(as_json: bool, settings: Settings, plan: Plan, dry_run: bool, done: list[Change]) -> None:
    if not as_json:
        return
    document = {
        "datadog": settings.datadog_base_url(),
        "dry_run": dry_run,
        **plan.as_json(),
        "applied": None if dry_run or plan.blocked else len(done),
    }
    created = [c.target_id for c in done if c.kind == "incident type" and c.target_id]
    if created:
        document["incident_type"] = {"name": plan.incident_type, "id": created[0]}
    click.echo(json.dumps(document, indent=2))


def load_farm(settings: Settings, *, required: bool = False) -> FarmConfig | None:
    """The farm configuration, or None when none is configured (and not required)."""
    from gpufarm.adapters.aws import load_farm_text
    from gpufarm.core.config.farm import parse_farm

    try:
        text = load_farm_text(settings)
    except NotFound:
        if required:
            raise
        return None
    return parse_farm(text)


def _print_plan(plan: Plan) -> None:
    for line in plan.lines():
        click.echo(f"  {line}")
    for name in plan.validated_monitors:
        click.echo(f"  validated monitor {name}: Datadog accepts it")
    counts = plan.counts()
    summary = ", ".join(f"{n} {action}" for action, n in counts.items() if n)
    click.echo(f"plan: {summary}")


def run_apply(
    settings: Settings,
    *,
    incident_webhook_url: str | None = None,
    idle_webhook_url: str | None = None,
    valid_values: Mapping[str, Sequence[str]] | None = None,
    dry_run: bool = False,
    rotate_secret: bool = False,
    incident_type: str | None = None,
    env: Mapping[str, str] | None = None,
    farm: FarmConfig | None = None,
    prune: bool = False,
) -> Plan:
    """Apply against the Datadog in settings; webhook URLs default to GPUFARM_INCIDENT/IDLE_WEBHOOK_URL.

    With `farm`, its idle monitors, gpufarm's dashboards and the metric metadata are managed too (dropdown choices
    come from it unless valid_values is given).
    """
    from gpufarm.adapters.datadog_admin import DatadogAdmin

    environ = env if env is not None else os.environ
    spec = SetupSpec(
        incident_webhook_url=incident_webhook_url or environ.get(INCIDENT_WEBHOOK_URL_ENV, ""),
        idle_webhook_url=idle_webhook_url or environ.get(IDLE_WEBHOOK_URL_ENV, ""),
        valid_values=dict(valid_values if valid_values is not None else farm.valid_values() if farm else {}),
        rotate_secret=rotate_secret,
        has_secret=settings.webhook_secret is not None and bool(settings.webhook_secret.get_secret_value()),
        incident_type=incident_type or settings.incident_type,
        monitors=farm_monitors(farm) if farm is not None else None,
        prune=prune,
        dashboards=desired_dashboards(farm, newest_run_links(settings, farm)) if farm is not None else None,
        metric_metadata=desired_metadata() if farm is not None else None,
    )
    admin = DatadogAdmin(settings)
    try:
        return apply_setup(admin, spec, secret=settings.webhook_secret, dry_run=dry_run)
    finally:
        admin.close()
