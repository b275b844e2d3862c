"""`gpufarm rates`: the rate card as gpufarm prices GPU-hours now: every pool and model the farm offers, its price
per GPU-hour, where the price comes from (the farm file, or a cloud's list price last read and cached), when that
list price was read, and whether it is stale (the last known one, the list unreadable at the last refresh). A model
nothing prices is shown as unpriced, never as zero.

The list prices are those of the cache GPUFARM_PRICE_CACHE names (gpufarm.adapters.price_cache: the profile
bucket's `rates/prices.json` in a deployment, the local host's file beside `gpufarm local`); without one, only the
farm file's written prices. Nothing is read from a cloud here: the sync refreshes the cache.

Exit status: 0 printed; 1 the configuration is missing or a service failed; 2 bad input (an unknown pool, a bad
option, an invalid farm configuration).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click

from gpufarm.core.config.farm import FarmConfig, FarmConfigError
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard, round_cents

EXIT_FAILED = 1
EXIT_REFUSED = 2
SEAMS_GROUP = "gpufarm.seams"
RATES_EPILOG = """\b
Exit status:
  0  printed
  1  the configuration is missing, or a service failed
  2  bad input: an unknown pool, a bad option, an invalid farm configuration
"""


def card_rows(farm: FarmConfig, prices: Mapping[PriceKey, CloudPrice], pool: str | None = None) -> list[dict[str, Any]]:
    """One row per pool and model the farm offers (only `pool`'s when given): the rate or unpriced."""
    card = RateCard(farm.rates, prices)
    rows = []
    for env in sorted(farm.environments):
        if pool is not None and env != pool:
            continue
        for model in farm.environments[env].gpu_models:
            rate = card.rate(env, model)
            rows.append(
                {
                    "pool": env,
                    "model": model,
                    "per_gpu_hour": None if rate is None else str(round_cents(rate.per_gpu_hour)),
                    "currency": card.currency,
                    "unpriced": rate is None,
                    "source": None if rate is None else rate.source.value,
                    "as_of": None if rate is None or rate.as_of is None else rate.as_of.isoformat(),
                    "stale": rate is not None and rate.stale,
                }
            )
    return rows


def render_table(rows: list[dict[str, Any]], stale: list[str]) -> str:
    """The rows as an aligned table, and the stale list prices after it."""
    head = ("POOL", "MODEL", "PER GPU-HOUR", "SOURCE", "AS OF", "STALE")
    body = [
        (
            r["pool"],
            r["model"],
            "unpriced" if r["unpriced"] else f"{r['per_gpu_hour']} {r['currency']}",
            r["source"] or "-",
            (r["as_of"] or "-")[:16].replace("T", " "),
            "stale" if r["stale"] else "",
        )
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)
    ]
    if stale:
        lines += [
            "",
            "stale list prices (the last known, the list unreadable at the last refresh): " + ", ".join(stale),
        ]
    return "\n".join(lines) + "\n"


@click.command(epilog=RATES_EPILOG)
@click.option("--pool", default=None, help="Only this pool (an environment of the farm file).")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True)
@click.option(
    "--farm-config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Farm YAML [default: the runtime's GPUFARM_FARM_CONFIG or SSM parameter].",
)
def rates(*, pool: str | None, fmt: str, farm_config: Path | None) -> None:
    """The rate card: every pool and model's price per GPU-hour, its source, as-of and staleness."""
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.handlers import runtime as rt

    try:
        for point in entry_points(group=SEAMS_GROUP):
            rt.install_seams(point.load())
        runtime = rt.current()
        farm = parse_farm(farm_config.read_text()) if farm_config is not None else runtime.farm()
        if pool is not None and pool not in farm.environments:
            click.echo(f"error: '{pool[:60]}' is not a pool of the farm file", err=True)
            sys.exit(EXIT_REFUSED)
        book = runtime.prices()
        prices = book.known() if book is not None else {}
    except FarmConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    except GpufarmError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    rows = card_rows(farm, prices, pool)
    stale = [k.label() for k in RateCard(farm.rates, prices).stale_keys()]
    if fmt == "json":
        click.echo(json.dumps({"currency": farm.rates.currency, "rates": rows, "stale_list_prices": stale}, indent=2))
    else:
        click.echo(render_table(rows, stale), nl=False)
