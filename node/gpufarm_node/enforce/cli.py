"""`gpufarm-node enforce slurm`: the Slurm enforcer, run next to slurmctld.

Exit status: 0 done (with --once: Slurm holds the leases), 1 a --once run that did not converge, 2 bad arguments,
farm file or Datadog settings.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
from typing import Any

import click

EXIT_NOT_CONVERGED = 1
EXIT_USAGE = 2
_TAG_VALUE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,99}$")


def _tag_value(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not _TAG_VALUE.match(value):
        raise click.BadParameter("starts with a letter; letters, digits and _ . : / - only (it becomes a tag)")
    return value.lower()


@click.group()
def enforce() -> None:
    """Make the farm's own schedulers enforce gpufarm's leases."""


@enforce.command("slurm")
@click.option(
    "--farm",
    "farm",
    required=True,
    envvar="GPUFARM_FARM_CONFIG",
    type=click.Path(dir_okay=False),
    help="The farm YAML (its environments' `enforce: slurm` and `enforcement.slurm`).",
)
@click.option(
    "--interval",
    type=click.FloatRange(5, 3600),
    default=20.0,
    show_default=True,
    envvar="GPUFARM_ENFORCE_INTERVAL",
    help="Seconds between runs.",
)
@click.option("--once", is_flag=True, help="One run, then exit (1 when Slurm does not hold the leases after it).")
@click.option(
    "--cluster",
    default="default",
    show_default=True,
    envvar="GPUFARM_CLUSTER",
    callback=_tag_value,
    help="Cluster tag of the enforcer's gauges and events.",
)
@click.option("--scontrol", "scontrol", default="scontrol", show_default=True, help="The scontrol binary.")
@click.option(
    "--timeout",
    type=click.FloatRange(1, 300),
    default=15.0,
    show_default=True,
    help="Seconds one scontrol call may take.",
)
@click.option(
    "--incident-type",
    default="GPU allocation",
    show_default=True,
    envvar="GPUFARM_INCIDENT_TYPE",
    help="Name of gpufarm's incident type.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="GPUFARM_NODE_LOG_LEVEL",
)
def slurm(**opts: Any) -> None:
    """Hold a Slurm reservation gpufarm-ir-<n> for each live lease on a pool with `enforce: slurm`."""
    from gpufarm_node.datadog import DatadogConfigError, target_from_env
    from gpufarm_node.enforce.config import EnforceConfigError, load_slurm_names
    from gpufarm_node.enforce.datadog_io import DatadogIO
    from gpufarm_node.enforce.run import SlurmEnforcer
    from gpufarm_node.enforce.scontrol import Scontrol

    logging.basicConfig(
        level=getattr(logging, opts["log_level"].upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        names = load_slurm_names(opts["farm"])
        target = target_from_env()
    except (EnforceConfigError, DatadogConfigError) as exc:
        click.echo(f"gpufarm-node enforce slurm: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if not target.app_key:
        click.echo("gpufarm-node enforce slurm: set DD_APP_KEY (or DD_APP_KEY_FILE): it reads incidents", err=True)
        sys.exit(EXIT_USAGE)
    if not names.pools:
        click.echo("gpufarm-node enforce slurm: no environment of the farm file has `enforce: slurm`", err=True)
        sys.exit(EXIT_USAGE)
    scontrol = Scontrol(opts["scontrol"], timeout=opts["timeout"])
    if not scontrol.available():
        click.echo(f"gpufarm-node enforce slurm: {opts['scontrol']} not found", err=True)
        sys.exit(EXIT_USAGE)
    io = DatadogIO(target, type_name=opts["incident_type"])
    enforcer = SlurmEnforcer(io, scontrol, names, io, cluster_tag=opts["cluster"])
    if opts["once"]:
        report = enforcer.run_once()
        for line in report.lines():
            click.echo(line)
        sys.exit(0 if report.converged else EXIT_NOT_CONVERGED)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    enforcer.run(stop, opts["interval"])
