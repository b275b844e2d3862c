"""What one invocation has read of incidents and hosts, narrowed to what its decisions need, and kept current.

State lives only in incident fields, so every decision reads incidents; read naively, that read grows with the
whole farm and runs again for every step of an invocation. A `Reads` is built per invocation (GpuFarm.reading)
and shared by everything that invocation decides:

- live incidents are searched once per scope, narrowed by facets to the scope (a request's decision: its team in
  its pool, `state:(active OR stable) AND environment:"onprem-hpc" AND team:"nlp"`; an allocation or a repair:
  its pool; the sync and the gauges: everything). A narrower scope is answered from a wider one already read.
- hosts are listed once per scope through the host list's filter (`gpufarm:managed environment:onprem-hpc`; the
  hosts of one IR: `gpufarm:managed ir:ir-123`), each with its tags by source, so a host's `user` tags never cost a
  request of their own unless the host is about to be written (the re-check before a write stays with the caller).
- every write the invocation makes through it (`wrote`, `tagged`) updates what was read, so a later step of the
  same invocation decides on the farm as it is after the earlier steps.

Results are always filtered here as well as by the facets: a backend that ignores a facet (or a fallback query
without one) gives the same answers, only more slowly (docs/datadog.md, "Incidents (v2)"). Caching for the
length of one invocation is safe because every writer of a pool runs in the pool's queue group one at a time
(docs/design.md, rule 7): what this invocation read of its pool cannot change under it except by its own writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufarm.core.errors import NotFound
from gpufarm.core.inventory import ENVIRONMENT_KEY, IR_KEY, MANAGED_TAG, GpuHost, normalize_tag
from gpufarm.core.ir import format_ir, ir_tag_value
from gpufarm.core.lifecycle import Phase, State
from gpufarm.core.model import Allocation, IncidentRecord
from gpufarm.core.ports import HostInfo, HostTags, IncidentStore

LIVE_QUERY = "state:(active OR stable)"
USER_SOURCE = "user"
# (environment, team, phases); None means "any".
Scope = tuple[str | None, str | None, frozenset[Phase] | None]


def live_query(
    environment: str | None = None,
    team: str | None = None,
    phases: Iterable[Phase] | None = None,
    *,
    requester: str | None = None,
) -> str:
    """The live-incident search narrowed by the environment, team, phase and requester fields (values quoted)."""
    terms = [LIVE_QUERY]
    terms += [f"requester:{json.dumps(requester)}"] if requester is not None else []
    terms += [f"environment:{json.dumps(environment)}"] if environment is not None else []
    terms += [f"team:{json.dumps(team)}"] if team is not None else []
    if phases is not None:
        terms.append("phase:(" + " OR ".join(json.dumps(p.value) for p in sorted(phases)) + ")")
    return " AND ".join(terms)


def host_filter(environment: str | None = None, ir: int | None = None) -> str:
    """The host list's filter for managed hosts of one pool, or those tagged with one IR."""
    terms = [MANAGED_TAG]
    terms += [normalize_tag(f"{ENVIRONMENT_KEY}:{environment}")] if environment is not None else []
    terms += [f"{IR_KEY}:{ir_tag_value(ir)}"] if ir is not None else []
    return " ".join(terms)


def _in_scope(alloc: Allocation, scope: Scope) -> bool:
    environment, team, phases = scope
    return (
        (environment is None or alloc.environment == environment)
        and (team is None or alloc.team == team)
        and (phases is None or alloc.phase in phases)
    )


def _covers(wide: Scope, narrow: Scope) -> bool:
    (w_env, w_team, w_phases), (n_env, n_team, n_phases) = wide, narrow
    return (
        (w_env is None or w_env == n_env)
        and (w_team is None or w_team == n_team)
        and (w_phases is None or (n_phases is not None and n_phases <= w_phases))
    )


@dataclass
class Reads:
    """One invocation's view of the incidents and hosts it decides on (see the module docstring)."""

    incidents: IncidentStore
    hosts: HostTags
    _live: dict[Scope, dict[int, Allocation]] = field(default_factory=dict)
    _by_ir: dict[int, Allocation] = field(default_factory=dict)
    _written: dict[int, Allocation] = field(default_factory=dict)
    # Listed hosts by host filter, each as the list gave it, `user` tags updated by this invocation's writes.
    _listed: dict[str, dict[str, HostInfo]] = field(default_factory=dict)
    _inventory: dict[str, GpuHost | None] = field(default_factory=dict)

    # -- incidents --------------------------------------------------------------------------------------------

    def live(
        self, environment: str | None = None, team: str | None = None, phases: Iterable[Phase] | None = None
    ) -> list[Allocation]:
        """Live allocations in a scope (a pool, a team in a pool, some phases, or all), in IR order.

        One search per scope; a scope inside one already read is answered from it.
        """
        scope: Scope = (environment, team, frozenset(phases) if phases is not None else None)
        known = self._live.get(scope)
        if known is None:
            wider = next((s for s in self._live if _covers(s, scope)), None)
            if wider is not None:
                known = {ir: a for ir, a in self._live[wider].items() if _in_scope(a, scope)}
            else:
                query = live_query(*scope)
                found = {a.ir: a for a in (Allocation.from_record(r) for r in self.incidents.search(query))}
                # What this invocation wrote wins over the search, whose index may not show the write yet.
                found |= self._written
                known = {ir: a for ir, a in found.items() if a.state is not State.RESOLVED and _in_scope(a, scope)}
                self._by_ir |= {ir: a for ir, a in known.items() if ir not in self._written}
            self._live[scope] = known
        return sorted(known.values(), key=lambda a: a.ir)

    def requested_by(self, user: str) -> list[Allocation]:
        """A user's live allocations, in IR order: one search narrowed by the requester field, whatever the farm holds.

        Answered from an unnarrowed read when the invocation made one; not kept as a scope (nothing else decides
        on one user's leases), but what it finds serves later lookups by IR.
        """
        everything: Scope = (None, None, None)
        if everything in self._live:
            found = list(self._live[everything].values())
        else:
            found = [Allocation.from_record(r) for r in self.incidents.search(live_query(requester=user))]
            found = [self._written.get(a.ir, a) for a in found]
            self._by_ir |= {a.ir: a for a in found if a.ir not in self._written}
            found += [a for a in self._written.values() if a.ir not in {b.ir for b in found}]
        mine = [a for a in found if a.requester == user and a.state is not State.RESOLVED]
        return sorted(mine, key=lambda a: a.ir)

    def get(self, ir: int) -> Allocation:
        """One allocation by IR: from what this invocation already read or wrote, else one lookup."""
        alloc = self._by_ir.get(ir)
        if alloc is None:
            try:
                alloc = self._note(self.incidents.get_by_ir(ir))
            except NotFound:
                raise NotFound(f"{format_ir(ir)} does not exist") from None
        return alloc

    def get_by_id(self, incident_id: str) -> Allocation:
        """One allocation by incident UUID, read fresh (the incident webhook's message names the UUID)."""
        return self._note(self.incidents.get(incident_id))

    def wrote(self, record: IncidentRecord) -> Allocation:
        """An incident as a write of this invocation left it: every scope read so far, and later, sees it so."""
        alloc = self._note(record)
        self._written[alloc.ir] = alloc
        return alloc

    def _note(self, record: IncidentRecord) -> Allocation:
        alloc = Allocation.from_record(record)
        self._by_ir[alloc.ir] = alloc
        for scope, known in self._live.items():
            if alloc.state is not State.RESOLVED and _in_scope(alloc, scope):
                known[alloc.ir] = alloc
            else:
                known.pop(alloc.ir, None)
        return alloc

    # -- hosts --------------------------------------------------------------------------------------------------

    def inventory(self, environment: str | None = None) -> list[GpuHost]:
        """Managed hosts of a pool (or all) with complete inventory tags, as listed; one list per scope."""
        if environment is not None and host_filter() in self._listed and host_filter(environment) not in self._listed:
            # Everything is listed already: the pool is a part of it.
            return [h for h in self._hosts(host_filter()) if h.environment == environment]
        return [h for h in self._hosts(host_filter(environment)) if environment is None or h.environment == environment]

    def capacity(self, environment: str, gpu_model: str, need: int, *, units: bool = False) -> int:
        """GPUs of a pool's model: exact, or (listing no further than needed) at least `need` once it is reached.

        A decision only asks whether a request could ever fit; only a refusal quotes the pool's size, and a
        refusal has read the whole pool. With `units` (a shared pool) the hosts' schedulable units are counted:
        GPUs and MIG slices (GpuHost.units).
        """
        model = gpu_model.upper()

        def size(host: GpuHost) -> int:
            return len(host.units) if units else host.gpu_count

        if host_filter(environment) in self._listed or host_filter() in self._listed:
            return sum(size(h) for h in self.inventory(environment) if h.gpu_model == model)
        total = 0
        for info in self.hosts.list_hosts(host_filter(environment)):
            host = GpuHost.from_tags(info.name, info.tags)
            if host is not None and host.environment == environment and host.gpu_model == model:
                total += size(host)
                if total >= need:
                    break
        return total

    def tagged_with(self, ir: int, environment: str | None = None) -> list[GpuHost]:
        """Managed hosts carrying one IR's tag: from a listing already read, else the host list filtered by it."""
        tag = ir_tag_value(ir)
        wide = next((k for k in (host_filter(environment), host_filter()) if k in self._listed), None)
        return [h for h in self._hosts(wide or host_filter(ir=ir)) if tag in h.irs]

    def listed_user_tags(self, host: str) -> list[str] | None:
        """A host's `user` tags as the host list gave them (None when no listing read so far holds the host)."""
        for listing in self._listed.values():
            info = listing.get(host)
            if info is not None:
                return list(info.tags_by_source.get(USER_SOURCE, ()))
        return None

    def listed_info(self, host: str) -> HostInfo | None:
        """A host as the host list gave it (its report time included); None when no listing read so far holds it."""
        for listing in self._listed.values():
            info = listing.get(host)
            if info is not None:
                return info
        return None

    def tagged(self, host: str, user_tags: Iterable[str]) -> None:
        """A host's `user` tags as a write of this invocation left them."""
        tags = tuple(user_tags)
        self._inventory.pop(host, None)
        for listing in self._listed.values():
            info = listing.get(host)
            if info is None:
                continue
            by_source = {**info.tags_by_source, USER_SOURCE: tags}
            merged = tuple(dict.fromkeys(t for source in by_source.values() for t in source))
            listing[host] = HostInfo(info.name, merged, by_source, info.last_reported)

    def _hosts(self, filter_text: str) -> list[GpuHost]:
        listing = self._listed.get(filter_text)
        if listing is None:
            listing = {info.name: info for info in self.hosts.list_hosts(filter_text)}
            self._listed[filter_text] = listing
        out = []
        for name, info in listing.items():
            if name not in self._inventory:
                self._inventory[name] = GpuHost.from_tags(name, info.tags)
            host = self._inventory[name]
            if host is not None:
                out.append(host)
        return out
