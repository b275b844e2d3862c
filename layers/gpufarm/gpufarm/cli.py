"""The `gpufarm` command: sandbox, local function host, demo and Datadog setup."""

from __future__ import annotations

import logging
import signal
import time

import click

from gpufarm import __version__


@click.group()
@click.version_option(__version__, prog_name="gpufarm")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """gpufarm: GPU requests in Slack, allocations as Datadog Incidents, IR-tagged hosts, idle reclaim."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option(
    "--port", default=8320, show_default=True, type=click.IntRange(0, 65535), help="Port; 0 picks a free one."
)
def sandbox(host: str, port: int) -> None:
    """Serve the Datadog + Slack sandbox until Ctrl-C."""
    from gpufarm.sandbox.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN, Sandbox
    from gpufarm.sandbox.server import ServerThread

    started = time.perf_counter()
    base = f"http://{host}:{port}"
    app = Sandbox(base_url=base)
    server = ServerThread(app, host, port)
    app.base_url = server.url
    click.echo(f"gpufarm sandbox on {server.url} (ready in {time.perf_counter() - started:.2f}s)")
    click.echo(f"  export GPUFARM_DATADOG_HOST={server.url}")
    click.echo(f"  export GPUFARM_SLACK_API_URL={server.url}/slack/api/")
    click.echo(f"  export DD_API_KEY={DEFAULT_DD_API_KEY} DD_APP_KEY={DEFAULT_DD_APP_KEY}")
    click.echo(f"  export SLACK_BOT_TOKEN={DEFAULT_SLACK_TOKEN}")
    click.echo("  inspect: GET /_sandbox/state, /_sandbox/slack/messages, /_sandbox/webhooks/deliveries")
    _serve_until_interrupted(server)


def _serve_until_interrupted(server: object) -> None:
    """Run a ServerThread in the foreground; Ctrl-C or SIGTERM stops it cleanly."""
    from gpufarm.sandbox.server import ServerThread

    assert isinstance(server, ServerThread)
    server.start()

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        server.stop()


def main() -> None:
    """Entry point of the `gpufarm` script."""
    cli(prog_name="gpufarm")


if __name__ == "__main__":
    main()
