"""`gpufarm sandbox`: the Datadog + Slack sandbox alone, until Ctrl-C."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpufarm_sandbox.emulator.quirks import ALL, QUIRKS, describe_quirks, parse_quirks

F = TypeVar("F", bound=Callable[..., Any])


def _quirks_value(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[str]:
    try:
        return parse_quirks(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def datadog_quirks_option(*, envvar: str | None = None) -> Callable[[F], F]:
    """`--datadog-quirks LIST`: the Datadog quirk modes the sandbox plays (a bad name is a usage error, exit 2)."""
    return click.option(
        "--datadog-quirks",
        "quirks",
        metavar="LIST",
        default=None,
        envvar=envvar,
        show_envvar=envvar is not None,
        callback=_quirks_value,
        help=f"Datadog quirk modes the sandbox plays, comma-separated, or {ALL}: {', '.join(QUIRKS)}.",
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8320, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@datadog_quirks_option()
def sandbox(host: str, port: int, quirks: frozenset[str]) -> None:
    """Serve the Datadog + Slack sandbox until Ctrl-C."""
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN, Sandbox
    from gpufarm_sandbox.emulator.server import ServerThread

    started = time.perf_counter()
    app = Sandbox(quirks=quirks)
    server = ServerThread(app, host, port).start()
    app.base_url = server.url
    app.monitors.start_ticker(5.0)
    click.echo(f"gpufarm sandbox on {server.url} (ready in {time.perf_counter() - started:.2f}s)")
    click.echo(f"  export GPUFARM_DATADOG_HOST={server.url}")
    click.echo(f"  export GPUFARM_SLACK_API_URL={server.url}/slack/api/")
    click.echo(f"  export DD_API_KEY={DEFAULT_DD_API_KEY} DD_APP_KEY={DEFAULT_DD_APP_KEY}")
    click.echo(f"  export SLACK_BOT_TOKEN={DEFAULT_SLACK_TOKEN}")
    click.echo(f"  datadog quirks: {describe_quirks(app.quirks)}")
    click.echo("  inspect: GET /_sandbox/state, /_sandbox/slack/messages, /_sandbox/webhooks/deliveries")

    def stop() -> None:
        app.monitors.stop_ticker()
        server.stop()

    wait_for_interrupt(stop)


def wait_for_interrupt(stop: Callable[[], None]) -> None:
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
