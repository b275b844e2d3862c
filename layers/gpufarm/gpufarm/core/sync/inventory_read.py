"""The sync's read of the inventory: every source (the farm file's static hosts, the Datadog Agent's GPU check, the
clouds the runtime built) read once and merged with the registered hosts (gpufarm.core.inventory.sources)."""

from __future__ import annotations

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.inventory import agent_source
from gpufarm.core.inventory.sources import Ledger, StaticSource, agent_node, merge, read_all
from gpufarm.core.kernel.ports import InventorySource, SourceReading


def inventory_sources(ctx: LeaseContext) -> list[InventorySource]:
    """The farm file's static list, the Datadog Agent's GPU check and the sources the runtime built (the clouds; a
    runtime that built the Agent's source itself, a benchmark measuring it, keeps its own)."""
    static = ctx.farm.inventory.static
    built = {s.name for s in ctx.sources}
    agent = None if agent_source.SOURCE in built else agent_source.for_farm(ctx.farm, ctx.usage, ctx.clock)
    return [*([StaticSource(static)] if static else []), *([agent] if agent else []), *ctx.sources]


def read_ledger(ctx: LeaseContext, readings: list[SourceReading] | None = None) -> Ledger:
    """Every inventory source read once (unless already read) and merged with the registered hosts."""
    settings = ctx.farm.inventory
    if readings is None:
        readings = read_all(inventory_sources(ctx))
    reads = ctx.reads()
    agents = [agent_node(h, reads.listed_info(h.name)) for h in ctx.inventory()]
    now = ctx.now().timestamp()
    return merge(
        agents,
        readings,
        now=now,
        down_after_minutes=settings.down_after_minutes,
        environments=ctx.farm.environments,
    )
