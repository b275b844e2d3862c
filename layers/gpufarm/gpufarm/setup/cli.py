"""`gpufarm datadog ...`: set Datadog up for gpufarm (real Datadog, or the sandbox via GPUFARM_DATADOG_HOST)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import click

from gpufarm.config import Settings
from gpufarm.core.errors import GpufarmError, NotFound
from gpufarm.setup.apply import (
    IDLE_WEBHOOK_URL_ENV,
    INCIDENT_WEBHOOK_URL_ENV,
    Plan,
    SetupSpec,
    execute,
    plan_setup,
    read_current,
)


@click.group()
def datadog() -> None:
    """Datadog setup for gpufarm."""


@datadog.command()
@click.option("--dry-run", is_flag=True, help="Print the plan (create / update / unchanged) and change nothing.")
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
@click.option("--rotate-secret", is_flag=True, help="Write GPUFARM_WEBHOOK_SECRET again (secrets cannot be read back).")
@click.option("--incident-type", default=None, help="Incident type the fields belong to [default: the org's default].")
def apply(
    *,
    dry_run: bool,
    incident_webhook_url: str | None,
    idle_webhook_url: str | None,
    farm_config: str | None,
    rotate_secret: bool,
    incident_type: str | None,
) -> None:
    """Create or update gpufarm's incident fields, webhooks, secret variable and notification rules."""
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.config import load_settings

    try:
        settings = load_settings()
        if farm_config:
            settings = settings.model_copy(update={"farm_config": farm_config, "farm_config_parameter": None})
        valid_values = farm_valid_values(settings, required=bool(farm_config))
        spec = SetupSpec(
            incident_webhook_url=incident_webhook_url or "",
            idle_webhook_url=idle_webhook_url or "",
            valid_values=valid_values,
            rotate_secret=rotate_secret,
            has_secret=settings.webhook_secret is not None and bool(settings.webhook_secret.get_secret_value()),
            incident_type=incident_type,
        )
        gateway = DatadogGateway(settings)
        try:
            click.echo(f"Datadog at {settings.datadog_base_url()}")
            plan = plan_setup(read_current(gateway), spec)
            _print_plan(plan)
            if plan.blocked:
                raise click.ClickException(f"{len(plan.blocked)} object(s) blocked; nothing was changed")
            if dry_run:
                click.echo("dry run: nothing was changed")
                return
            done = execute(plan, gateway, settings.webhook_secret)
        finally:
            gateway.close()
    except GpufarmError as exc:
        # Domain and upstream errors carry a user-facing message (never a key); no traceback.
        raise click.ClickException(str(exc)) from None
    click.echo(f"applied {len(done)} change(s)" if done else "nothing to change")


def farm_valid_values(settings: Settings, *, required: bool = False) -> Mapping[str, Sequence[str]]:
    """Dropdown choices from the farm configuration, or {} when none is configured (and not required)."""
    from gpufarm.adapters.aws import load_farm_text
    from gpufarm.core.farm import parse_farm

    try:
        text = load_farm_text(settings)
    except NotFound:
        if required:
            raise
        return {}
    return parse_farm(text).valid_values()


def _print_plan(plan: Plan) -> None:
    for line in plan.lines():
        click.echo(f"  {line}")
    counts = plan.counts()
    summary = ", ".join(f"{n} {action}" for action, n in counts.items() if n)
    click.echo(f"plan: {summary}")
