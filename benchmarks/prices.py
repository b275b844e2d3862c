"""The price-list refresh (gpufarm.core.sync.prices): how long the sync's refresh takes and how large its cache is,
for a realistic card: 2 AWS regions x 12 GPU instance types and 2 Azure locations x 10 GPU VM sizes (44 list
prices), against the simulated price lists (gpufarm_sandbox.pricelists: gpufarm's own AWS and Azure adapters, their
requests answered in this process in the APIs' shapes, so botocore and azure-core parse each answer as they parse
the clouds').

Measured, each `--runs` times in the same run, into a cache file:
- first: an empty cache, every key read and written (the cold refresh);
- again: the same, due again (a refresh_hours later);
- not due: the cache read and nothing else (what 95 of the sync's 96 daily runs do at refresh_hours 24);
- outage: every key unreadable (503), each kept at its last price, marked stale and said once;
- with `--latency-ms` per answer (default 150, a round trip to the APIs from a Lambda in another region), the
  cold refresh again: the refresh reads one key at a time, so this is the time a real refresh waits, bounded by
  its budget (gpufarm.adapters.price_lists.REFRESH_BUDGET_S).
Wall and CPU seconds (median of the runs), the calls made, and the cache's size in bytes; apart, what building the
two clients takes (once per container, before a refresh's first call; not in the refreshes' figures).

Run: .venv/bin/python benchmarks/prices.py [--runs 5] [--latency-ms 150]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufarm.adapters.azure_prices import GPUS_PER_SIZE
from gpufarm.adapters.price_cache import PriceCache
from gpufarm.adapters.price_lists import REFRESH_BUDGET_S
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.rates import Cloud
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.ports import Event
from gpufarm.core.money.card import PriceKey
from gpufarm.core.money.prices import PriceFeed
from gpufarm.core.sync.prices import PriceRefresh, refresh_prices
from gpufarm_sandbox.pricelists import SimulatedPriceLists

INSTANCE_TYPES = (
    ("p5.48xlarge", 8, "98.32"),
    ("p5e.48xlarge", 8, "108.49"),
    ("p5en.48xlarge", 8, "110.20"),
    ("p4d.24xlarge", 8, "32.7726"),
    ("p4de.24xlarge", 8, "40.9657"),
    ("p3.2xlarge", 1, "3.06"),
    ("p3.8xlarge", 4, "12.24"),
    ("p3.16xlarge", 8, "24.48"),
    ("g6e.xlarge", 1, "1.861"),
    ("g6e.12xlarge", 4, "10.493"),
    ("g5.xlarge", 1, "1.006"),
    ("g5.12xlarge", 4, "5.672"),
)
REGIONS = ("us-east-1", "us-west-2")
VM_SIZES = tuple(sorted(GPUS_PER_SIZE))[:10]
LOCATIONS = ("eastus", "westeurope")


def card_yaml() -> str:
    """A farm whose four cloud pools name 44 list prices (a model per instance type or VM size)."""
    models = [f"M{n:02d}" for n in range(1, 13)]
    lines = ["operators_channel: C0000000001", "gpu_models:"]
    lines += [f"  {m}: {{}}" for m in models]
    lines += ["environments:"]
    pools = [f"aws-{r}" for r in REGIONS] + [f"azure-{loc}" for loc in LOCATIONS]
    for pool in pools:
        offered = models if pool.startswith("aws") else models[: len(VM_SIZES)]
        lines.append(f"  {pool}: {{kind: dedicated, gpu_models: [{', '.join(offered)}]}}")
    lines += ["teams:", "  nlp: {max_days: 30, quotas: {}}", "defaults: {duration_days: 7, extend_days: 7}"]
    lines += ["rates:", "  currency: USD", "  refresh_hours: 24", "  environments:"]
    for region in REGIONS:
        types = ", ".join(f"{m}: {t}" for m, (t, _, _) in zip(models, INSTANCE_TYPES, strict=True))
        lines.append(f"    aws-{region}: {{cloud: aws, region: {region}, instance_types: {{{types}}}}}")
    for location in LOCATIONS:
        sizes = ", ".join(f"{m}: {s}" for m, s in zip(models, VM_SIZES, strict=False))
        lines.append(f"    azure-{location}: {{cloud: azure, location: {location}, vm_sizes: {{{sizes}}}}}")
    return "\n".join(lines) + "\n"


def list_prices() -> dict[tuple[str, str], tuple[str, int]]:
    """The simulated lists' prices for every key of the card."""
    table = {(r, t): (usd, gpus) for r in REGIONS for t, gpus, usd in INSTANCE_TYPES}
    table |= {(loc, s): (f"{3.1 * GPUS_PER_SIZE[s]:.4f}", GPUS_PER_SIZE[s]) for loc in LOCATIONS for s in VM_SIZES}
    return table


class _Clock:
    def __init__(self) -> None:
        self.current = datetime(2026, 12, 7, 6, tzinfo=UTC)

    def now(self) -> datetime:
        return self.current


class _Told:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.posts: list[str] = []

    def post_event(self, event: Event) -> None:
        self.events.append(event)

    def post_message(self, channel: str, text: str, blocks: Sequence[Any] | None = None) -> str:
        self.posts.append(text)
        return "1"


def context(path: Path, lists: SimulatedPriceLists, clock: _Clock, told: _Told) -> LeaseContext:
    """A context with only what the refresh reads: the farm, the clock, the feed, events and the operators' chat."""
    cache = PriceCache(str(path), max_age_s=0)
    none: Any = None
    return LeaseContext(
        incidents=none,
        hosts=none,
        chat=told,  # type: ignore[arg-type]
        clock=clock,
        farm=parse_farm(card_yaml()),
        events=told,
        prices=cache,
        price_feed=PriceFeed(lists.lists(), cache),
    )


def measure(step: Callable[[], PriceRefresh]) -> tuple[float, float, PriceRefresh]:
    wall, cpu = time.perf_counter(), time.process_time()
    report = step()
    return time.perf_counter() - wall, time.process_time() - cpu, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=150.0)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float, int]]] = {}
    sizes: list[int] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "prices.json"
            lists, clock, told = SimulatedPriceLists(prices=list_prices()), _Clock(), _Told()
            ctx = context(path, lists, clock, told)
            # (name, hours the clock moves first, every key down)
            for name, hours, down in (
                ("first", 0, False),
                ("again", 24, False),
                ("not due", 1, False),
                ("outage", 24, True),
            ):
                clock.current += timedelta(hours=hours)
                if down:
                    lists.down = set(all_keys())
                calls = lists.calls
                wall, cpu, report = measure(lambda c=ctx: refresh_prices(c))
                figures.setdefault(name, []).append((wall, cpu, lists.calls - calls))
                if name == "first":
                    assert report.read == 44, report
                    sizes.append(path.stat().st_size)
                if name == "outage":
                    assert len(report.stale) == 44 and len(told.events) == 1, report
        with tempfile.TemporaryDirectory() as tmp:
            slow = SimulatedPriceLists(prices=list_prices(), latency_s=args.latency_ms / 1000)
            ctx = context(Path(tmp) / "prices.json", slow, _Clock(), _Told())
            wall, cpu, report = measure(lambda c=ctx: refresh_prices(c))
            figures.setdefault(f"first, {args.latency_ms:g} ms a call", []).append((wall, cpu, slow.calls))
            assert report.read == 44, report
    print(
        f"card: {len(REGIONS)} regions x {len(INSTANCE_TYPES)} instance types + {len(LOCATIONS)} locations x "
        f"{len(VM_SIZES)} VM sizes = 44 list prices; {args.runs} runs, medians; budget {REFRESH_BUDGET_S:g} s"
    )
    print(f"{'refresh':<24} {'wall s':>8} {'CPU s':>8} {'calls':>6}")
    for name, rows in figures.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{name:<24} {wall:>8.3f} {cpu:>8.3f} {rows[0][2]:>6}")
    print(f"cache: {statistics.median(sizes):,.0f} bytes (44 entries)")
    built = time.perf_counter()
    SimulatedPriceLists().lists()
    print(
        f"the clients (botocore's pricing client, azure-core's pipeline): {time.perf_counter() - built:.3f} s to build"
    )


def all_keys() -> list[PriceKey]:
    """Every list price of the card."""
    return [PriceKey(Cloud.AWS if "-" in region else Cloud.AZURE, region, sku) for region, sku in list_prices()]


if __name__ == "__main__":
    main()
