"""The incidents a report reads: the live leases, and the ended ones that held GPUs in the period's months.

State lives in incident fields (docs/design.md, rule 1), so a report needs nothing else: two searches, both
narrowed by facets the way the budgets read (gpufarm.core.accounting.budgets): `state:(active OR stable)` for what is
live, and `state:resolved AND gpu_hours_by_month:(2026-11=* OR ...)` for what ended after accruing in the months the
period touches (every lease writes its final held hours when it ends, so a lease that held GPUs is found). A team
filter narrows both by `team:`. Reading is bounded at MAX_LEASES; a report cut there says so.

Each lease is read as the light record reports need (gpufarm.core.kernel.lease_facts): from a store that reads them
so (`LeaseReads`: the Datadog adapter's light reader, gpufarm.adapters.datadog_reads) without a model per
incident, else from any IncidentStore's records.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.ports import IncidentStore, LeaseReads
from gpufarm.core.kernel.search import IncidentQuery, live_query
from gpufarm.core.kernel.search import ended_query as ended_query  # noqa: PLC0414 - named here by its users
from gpufarm.reporting import reasons

log = logging.getLogger(__name__)

# Leases one report reads at most (live and ended together); 3,000 live leases and a month's ended ones fit.
MAX_LEASES = 50_000


@dataclass(frozen=True)
class Leases:
    """What a report read: the leases (each once), and whether the read was cut at MAX_LEASES."""

    leases: tuple[LeaseFacts, ...]
    cut: bool = False

    def projects(self) -> set[str]:
        """Projects these leases name."""
        return {a.project for a in self.leases if a.project}


def facts(source: IncidentStore | LeaseReads, query: IncidentQuery) -> Iterator[LeaseFacts]:
    """The leases the query matches, each as LeaseFacts: read light when the source can, else decoded records."""
    if isinstance(source, LeaseReads):
        yield from source.lease_facts(query)
        return
    for record in source.search(query):
        yield LeaseFacts.decode(record.public_id, record.state, record.fields, record.modified)


def read_leases(
    incidents: IncidentStore | LeaseReads, months: Sequence[str], *, team: str | None = None, limit: int = MAX_LEASES
) -> Leases:
    """The live leases, those ended after accruing in `months` and those that ended with a reason in them
    (gpufarm.reporting.reasons), deduplicated by IR, at most `limit`."""
    found: dict[int, LeaseFacts] = {}
    cut = False
    queries = [live_query(team=team)]
    queries += [ended_query(months, team), reasons.ended_query(months, team)] if months else []
    # Thousands of leases, each a few containers and none in a cycle: the cycle collector would walk every object the
    # process holds again and again while they are made and free nothing, so it waits until the read is done.
    paused = gc.isenabled()
    gc.disable()
    try:
        for query in queries:
            cut = _collect(facts(incidents, query), found, limit) or cut
            if cut:
                log.warning("report: more than %d leases, the rest not read", limit)
                break
    finally:
        if paused:
            gc.enable()
    return Leases(tuple(sorted(found.values(), key=lambda a: a.ir)), cut)


def _collect(leases: Iterable[LeaseFacts], found: dict[int, LeaseFacts], limit: int) -> bool:
    """Add leases to `found`; True when the limit stopped the read."""
    for lease in leases:
        if len(found) >= limit:
            return True
        found.setdefault(lease.ir, lease)
    return False
