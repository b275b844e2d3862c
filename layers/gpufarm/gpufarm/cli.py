"""The `gpufarm` command: sandbox, local function host, demo and Datadog setup."""

from __future__ import annotations

import importlib
import logging
import signal
import time
from typing import Any

import click

from gpufarm import __version__

# Subcommands living in their own modules, imported only when used so `gpufarm --help` stays fast.
LAZY_COMMANDS = {
    "local": "gpufarm.localhost.cli:local",
    "demo": "gpufarm.demo.runner:demo",
    "datadog": "gpufarm.setup.cli:datadog",
}


class LazyGroup(click.Group):
    """A click group whose heavier subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Eager and lazy commands, sorted."""
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import a lazy command when asked for it."""
        if cmd_name in LAZY_COMMANDS:
            module_name, attr = LAZY_COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="gpufarm")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """gpufarm: GPU requests in Slack, allocations as Datadog Incidents, IR-tagged hosts, idle reclaim."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8320, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
def sandbox(host: str, port: int) -> None:
    """Serve the Datadog + Slack sandbox until Ctrl-C."""
    from gpufarm.sandbox.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN, Sandbox
    from gpufarm.sandbox.server import ServerThread

    started = time.perf_counter()
    app = Sandbox()
    server = ServerThread(app, host, port).start()
    app.base_url = server.url
    app.monitors.start_ticker(5.0)
    click.echo(f"gpufarm sandbox on {server.url} (ready in {time.perf_counter() - started:.2f}s)")
    click.echo(f"  export GPUFARM_DATADOG_HOST={server.url}")
    click.echo(f"  export GPUFARM_SLACK_API_URL={server.url}/slack/api/")
    click.echo(f"  export DD_API_KEY={DEFAULT_DD_API_KEY} DD_APP_KEY={DEFAULT_DD_APP_KEY}")
    click.echo(f"  export SLACK_BOT_TOKEN={DEFAULT_SLACK_TOKEN}")
    click.echo("  inspect: GET /_sandbox/state, /_sandbox/slack/messages, /_sandbox/webhooks/deliveries")

    def stop() -> None:
        app.monitors.stop_ticker()
        server.stop()

    wait_for_interrupt(stop)


def wait_for_interrupt(stop: Any) -> None:
    """Block until Ctrl-C or SIGTERM, then call stop() once."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        stop()


def main() -> None:
    """Entry point of the `gpufarm` script."""
    cli(prog_name="gpufarm")


if __name__ == "__main__":
    main()
