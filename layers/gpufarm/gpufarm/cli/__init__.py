"""The `gpufarm` command: its own subcommands (`datadog`, `doctor`, `slack`, `report`, `rates`, `profile`,
`secrets`, one module each here, imported only when used), plus those other distributions register.

The runtime ships only its own commands. `gpufarm-sandbox` adds `sandbox`, `local` and `demo` through the
`gpufarm.commands` entry-point group, so an operator's install (or the Lambda layer) carries none of them.
"""

from __future__ import annotations

import importlib
import logging
import os
from importlib.metadata import entry_points

import click

from gpufarm import __version__

# Commands of this distribution, imported only when used so `gpufarm --help` stays fast.
OWN_COMMANDS = {
    "datadog": "gpufarm.cli.datadog:datadog",
    "doctor": "gpufarm.cli.doctor:doctor",
    "slack": "gpufarm.cli.slack:slack",
    "profile": "gpufarm.cli.profile:profile",
    "rates": "gpufarm.cli.rates:rates",
    "report": "gpufarm.cli.report:report",
    "secrets": "gpufarm.cli.secrets:secrets",
}
ENTRY_POINT_GROUP = "gpufarm.commands"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
# Every command's contract: exit 2 is bad input (click's usage errors, an invalid farm configuration, a bad
# option value), and nothing was changed.
EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    """Bad input a command refuses without a traceback: `Error: <message>` on stderr, exit 2, nothing changed."""

    exit_code = EXIT_BAD_INPUT


def plugin_commands() -> dict[str, str]:
    """`name -> module:attr` of every command installed distributions register (own commands win)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **OWN_COMMANDS}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Eager and lazy commands, sorted."""
        return sorted({*super().list_commands(ctx), *plugin_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import a lazy command when asked for it."""
        # Own commands win, so naming one needs no scan of the installed distributions' entry points.
        target = OWN_COMMANDS.get(cmd_name) or plugin_commands().get(cmd_name)
        if target is not None:
            module_name, attr = target.split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="gpufarm")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """gpufarm: GPU requests in Slack, allocations as Datadog Incidents, IR-tagged hosts, idle reclaim.

    Where the environment names no deployment, this distribution's commands use a running `gpufarm local`
    (found through its state file, gpufarm.cli.local_state): its endpoints, credentials and clock.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ctx.invoked_subcommand in OWN_COMMANDS:
        from gpufarm.cli import local_state

        ctx.call_on_close(local_state.apply(os.environ, lambda text: click.echo(text, err=True)))


def main() -> None:
    """Entry point of the `gpufarm` script."""
    cli(prog_name="gpufarm")


if __name__ == "__main__":
    main()
