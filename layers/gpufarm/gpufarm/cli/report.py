"""`gpufarm report`: GPU-hours held vs busy vs idle vs unmeasured per team, project, lease or environment.

Built from the incidents (their accrued GPU-hours and history) of the deployment the settings name (Datadog, or
the sandbox beside `gpufarm local`), with the farm configuration the runtime reads (GPUFARM_FARM_CONFIG or the
SSM parameter; `--farm-config` names a file). The HTML adds charts from the ledger gauges and is self-contained.
Money is at the rate card: the farm file's written prices and the clouds' list prices the sync cached
(GPUFARM_PRICE_CACHE; without it the written prices alone).

`--outlook` writes the demand and capacity outlook instead (gpufarm.reporting.outlook: unmet demand per pool and model
over the period, free capacity four weeks ahead); `--format chargeback` the month's chargeback CSV for finance
(gpufarm.reporting.chargeback; it needs `--month`).

Exit status: 0 written; 1 a service failed or the configuration is missing; 2 bad input (a bad or too long
period, --since and --month together, an unknown team or project, a bad option, an invalid farm configuration):
nothing is written.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path

import click

from gpufarm.core.config.farm_error import FarmConfigError
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel.errors import GpufarmError, ValidationFailed
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard
from gpufarm.handlers import runtime as rt
from gpufarm.reporting.model import Report
from gpufarm.reporting.query import DEFAULT_SINCE, GroupBy

SEAMS_GROUP = "gpufarm.seams"
EXIT_FAILED = 1
EXIT_REFUSED = 2
FORMATS = ("table", "csv", "json", "html", "chargeback")
REPORT_EPILOG = """\b
Exit status:
  0  written
  1  a service failed, or the configuration is missing (nothing written)
  2  bad input: a bad or too long period, --since with --month, an unknown team or project, an invalid farm
     configuration, chargeback without --month or for a month not begun, --outlook with chargeback (nothing
     written)
"""


def render(report: Report, fmt: str) -> str:
    """The report in one of FORMATS (plotly is imported only for html)."""
    if fmt == "csv":
        from gpufarm.reporting.render_csv import render_csv

        return render_csv(report)
    if fmt == "json":
        from gpufarm.reporting.render_json import render_json

        return render_json(report)
    if fmt == "html":
        from gpufarm.reporting.render_html import render_html

        return render_html(report)
    from gpufarm.reporting.render_table import render_table

    return render_table(report)


def write_atomically(path: Path, text: str) -> None:
    """Write the whole file or nothing: a temporary file beside it, renamed into place."""
    directory = path.parent if str(path.parent) else Path()
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@click.command(epilog=REPORT_EPILOG)
@click.option(
    "--since",
    default=None,
    help=f"Period back from now: 12h, 30d, 2w, 1y (at most 366 days) [default {DEFAULT_SINCE}].",
)
@click.option("--month", default=None, help="A calendar month (UTC), e.g. 2026-11; not with --since.")
@click.option(
    "--by", "by", type=click.Choice([g.value for g in GroupBy]), default=GroupBy.TEAM.value, show_default=True
)
@click.option("--team", default=None, help="Only this team's leases (a team of the farm file).")
@click.option("--project", default=None, help="Only this project's leases.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="chargeback: the month's CSV for finance (with --month).",
)
@click.option(
    "--outlook",
    is_flag=True,
    default=False,
    help="Unmet demand per pool and model over the period, and free capacity four weeks ahead.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write here instead of stdout."
)
@click.option(
    "--farm-config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Farm YAML [default: the runtime's GPUFARM_FARM_CONFIG or SSM parameter].",
)
def report(
    *,
    since: str | None,
    month: str | None,
    by: str,
    team: str | None,
    project: str | None,
    fmt: str,
    outlook: bool,
    out: Path | None,
    farm_config: Path | None,
) -> None:
    """GPU-hours held, busy, idle and unmeasured, utilisation, leases, warnings, keeps, exemptions, reclaims,
    waiting time, quota and budget use, per group over a period."""
    try:
        text = build_text(
            since=since,
            month=month,
            by=by,
            team=team,
            project=project,
            fmt=fmt,
            farm_config=farm_config,
            outlook=outlook,
        )
        if out is not None:
            write_atomically(out, text)
    except ValidationFailed as exc:
        click.echo(f"error: {exc.message}; nothing was written", err=True)
        sys.exit(EXIT_REFUSED)
    except FarmConfigError as exc:
        click.echo(f"error: {exc}; nothing was written", err=True)
        sys.exit(EXIT_REFUSED)
    except GpufarmError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if out is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {out} ({len(text.encode()):,} bytes)")


def build_text(
    *,
    since: str | None,
    month: str | None,
    by: str,
    team: str | None,
    project: str | None,
    fmt: str,
    farm_config: Path | None,
    outlook: bool = False,
) -> str:
    """Make the report (the outlook, the chargeback) through the runtime's collaborators and render it."""
    from gpufarm.adapters.farm_dump import farm_view
    from gpufarm.reporting.make import make_report
    from gpufarm.reporting.query import parse_query

    if since is not None and month is not None:
        raise ValidationFailed("since", "give --since or --month, not both")
    # A development tool's seams (the local host's, beside `gpufarm local`) apply to the environments it made.
    for point in entry_points(group=SEAMS_GROUP):
        rt.install_seams(point.load())
    runtime = rt.current()
    # The farm as reports read it: validated once per distinct text, then read from its kept dump
    # (gpufarm.adapters.farm_dump), so an unchanged farm costs neither pydantic nor the farm's models.
    farm = farm_view(farm_config.read_text()) if farm_config is not None else runtime.farm_view()
    now = runtime.clock().now()
    if outlook or fmt == "chargeback":
        return _special(
            runtime, farm, now, since=since, month=month, team=team, project=project, fmt=fmt, outlook=outlook
        )
    # The period, grouping and team are checked before Datadog's client is built: bad input is exit 2 even where
    # no key is configured.
    parse_query(farm, now, since=since, month=month, by=by, team=team)
    built = make_report(
        runtime.lease_reads(),
        farm,
        now,
        since=since,
        month=month,
        by=by,
        team=team,
        project=project,
        # Only the HTML's charts read metrics.
        metrics=runtime.gateway() if fmt == "html" else None,
        with_usage=fmt == "html",
        card=RateCard(farm.rates, list_prices(runtime)),
    )
    return render(built, fmt)


def list_prices(runtime: rt.Runtime) -> Mapping[PriceKey, CloudPrice] | None:
    """The clouds' list prices the sync cached (GPUFARM_PRICE_CACHE), none without a cache: the farm file's written
    prices alone then."""
    book = runtime.prices()
    return book.known() if book is not None else None


def _special(
    runtime: rt.Runtime,
    farm: FarmView,
    now: datetime,
    *,
    since: str | None,
    month: str | None,
    team: str | None,
    project: str | None,
    fmt: str,
    outlook: bool,
) -> str:
    """The outlook or the chargeback, each validated before anything is read."""
    if outlook:
        from gpufarm.reporting.outlook import check_scope, make_outlook
        from gpufarm.reporting.query import parse_query
        from gpufarm.reporting.render_outlook import render_outlook

        if fmt == "chargeback":
            raise ValidationFailed("format", "--outlook is not a chargeback: choose table, csv, json or html")
        check_scope(team, project)
        parse_query(farm, now, since=since, month=month)
        return render_outlook(
            make_outlook(runtime.lease_reads(), runtime.hosts(), farm, now, since=since, month=month), fmt
        )
    from gpufarm.reporting.chargeback import check_options, make_chargeback
    from gpufarm.reporting.query import month_period
    from gpufarm.reporting.render_chargeback import render_chargeback

    chosen = check_options(month, since, team, project)
    month_period(chosen, now)
    return render_chargeback(make_chargeback(runtime.lease_reads(), farm, now, chosen, list_prices(runtime)))
