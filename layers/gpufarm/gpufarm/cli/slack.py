"""`gpufarm slack check`: every Slack user group the farm configuration names exists, and who is in each
(gpufarm.setup.slack_check says it)."""

from __future__ import annotations

import sys

import click

from gpufarm.cli import BadInput
from gpufarm.core.config.farm import FarmConfigError
from gpufarm.core.kernel.errors import NotFound
from gpufarm.setup.slack_check import report


@click.group()
def slack() -> None:
    """Checks against the Slack workspace the app is installed in."""


@slack.command()
@click.option("--farm-config", type=click.Path(exists=True, dir_okay=False), help="Farm YAML file to check.")
def check(farm_config: str | None) -> None:
    """Resolve the operators' group and every team's members through Slack (usergroups.users.list)."""
    from gpufarm.adapters.slack import SlackChat
    from gpufarm.cli.datadog import load_farm
    from gpufarm.config import Settings

    settings = Settings()
    if farm_config:
        settings = settings.replace(farm_config=farm_config, farm_config_parameter=None)
    try:
        farm = load_farm(settings, required=True)
        chat = SlackChat.from_settings(settings)
    except FarmConfigError as exc:
        raise BadInput(str(exc)) from None
    except (NotFound, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    assert farm is not None
    sys.exit(report(farm, chat, click.echo))
