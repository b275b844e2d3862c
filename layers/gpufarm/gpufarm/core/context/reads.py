"""What one invocation has read of incidents and hosts, narrowed to what its decisions need, and kept current.

State lives only in incident fields, so every decision reads incidents; read naively, that read grows with the
whole farm and runs again for every step of an invocation. A `Reads` is built per invocation (LeaseContext.reading)
and shared by everything that invocation decides:

- live incidents are searched once per scope, narrowed by facets to the scope (a request's decision: its team in
  its pool, `state:(active OR stable) AND environment:"onprem-hpc" AND team:"nlp"`; an allocation or a repair:
  its pool; the sync and the gauges: everything). A narrower scope is answered from a wider one already read.
- hosts are listed once per scope through the host list's filter (`gpufarm:managed environment:onprem-hpc`; the
  hosts of one IR: `gpufarm:managed ir:ir-123`), each with its tags by source, so a host's `user` tags never cost a
  request of their own unless the host is about to be written (the re-check before a write stays with the caller).
- a dedicated pool's host sizes (how many hosts of each cluster and GPU count: what charging decides on) are
  counted rather than listed: one sample page of the pool's model, then one count per (cluster, GPUs per host) the
  sample shows, trusted once those counts add up to the pool's exact total (`host_sizes`); else the pool is
  listed whole. A request's decision thus costs a few small reads, not the pool's every page.
- every write the invocation makes through it (`wrote`, `tagged`) updates what was read, so a later step of the
  same invocation decides on the farm as it is after the earlier steps.

Results are always filtered here as well as by the facets: a backend that ignores a facet (or a fallback query
without one) gives the same answers, only more slowly (docs/datadog.md, "Incidents (v2)"). Caching for the
length of one invocation is safe because every writer of a pool runs in the pool's queue group one at a time
(docs/design.md, rule 7): what this invocation read of its pool cannot change under it except by its own writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpufarm.core.kernel.errors import NotFound
from gpufarm.core.kernel.hosts import (
    CLUSTER_KEY,
    ENVIRONMENT_KEY,
    GPU_COUNT_KEY,
    GPU_MODEL_KEY,
    GpuHost,
    tag_values,
)
from gpufarm.core.kernel.hosts import host_filter as host_filter  # noqa: PLC0414 - its home before
from gpufarm.core.kernel.ir import format_ir, ir_tag_value
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, IncidentRecord
from gpufarm.core.kernel.ports import HostInfo, HostPages, HostTags, IncidentStore
from gpufarm.core.kernel.search import LIVE_STATES, IncidentQuery
from gpufarm.core.kernel.search import live_query as live_query  # noqa: PLC0414

USER_SOURCE = "user"
# (environment, team, phases); None means "any".
Scope = tuple[str | None, str | None, frozenset[Phase] | None]
# Hosts of a pool's model per (cluster, GPUs per host).
Sizes = dict[tuple[str, int], int]
# The host size census: hosts per sample page, and how many more pages it samples at offsets spread over the pool
# when the first did not show every (cluster, size) the pool holds (hosts are listed by name, and names often
# follow clusters), before the pool is listed whole.
CENSUS_SAMPLE = 100
CENSUS_PROBES = 3


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


def _live_in(alloc: Allocation, scope: Scope) -> bool:
    """True for a live lease in the scope; a doctor's probe is never a lease, whatever state a check put it in."""
    return (
        alloc.state is not State.RESOLVED
        and not alloc.is_probe
        and not alloc.is_quota_override
        and _in_scope(alloc, scope)
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
    _sizes: dict[tuple[str, str], Sizes] = field(default_factory=dict)
    # Quota overrides each pool's (or the farm's) live search found, as this invocation's writes left them.
    _overrides: dict[tuple[str | None, str | None], dict[int, Allocation]] = field(default_factory=dict)

    def through(self, incidents: IncidentStore) -> Reads:
        """This view reading through another store (one command's record: gpufarm.core.commands.record), what it
        has read shared both ways."""
        return replace(self, incidents=incidents)

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
            # The latest read that covers it (a scope read `fresh` is newer than a wider one read before).
            wider = next((s for s in reversed(self._live) if _covers(s, scope)), None)
            if wider is not None:
                known = {ir: a for ir, a in self._live[wider].items() if _in_scope(a, scope)}
                self._live[scope] = known
            else:
                known = self._search(live_query(*scope), [scope])[0]
        return sorted(known.values(), key=lambda a: a.ir)

    def live_in_pools(self, team: str, environments: Iterable[str]) -> list[Allocation]:
        """A team's live allocations in some pools, in IR order: each pool this invocation has read (or read the
        team in) answered from that read, the others by one search through the team facet and the pools' values,
        kept as each pool's team scope."""
        pools = sorted(set(environments))
        unread = [env for env in pools if not self.holds_scope(env, team)]
        if unread:
            query = IncidentQuery.where(LIVE_STATES, team=team, environment=unread)
            self._search(query, [(env, team, None) for env in unread])
        return sorted((a for env in pools for a in self.live(env, team)), key=lambda a: a.ir)

    def fresh(self, environment: str | None = None, team: str | None = None) -> list[Allocation]:
        """Live allocations of a team in a pool (a pool, or all) searched now, whatever this invocation read before
        (a check that must see incidents created since: gpufarm.core.context.twins), in IR order. What it finds
        answers that scope and every scope inside it for the rest of the invocation: one read serves the check and
        the decision after it."""
        scope: Scope = (environment, team, None)
        for inside in [s for s in self._live if _covers(scope, s)]:
            del self._live[inside]
        return sorted(self._search(live_query(*scope), [scope])[0].values(), key=lambda a: a.ir)

    def _search(self, query: IncidentQuery, scopes: list[Scope]) -> list[dict[int, Allocation]]:
        """One search, kept as what the invocation read of each scope it covers (their live incidents by IR)."""
        found = {a.ir: a for a in (Allocation.from_record(r) for r in self.incidents.search(query))}
        # What this invocation wrote wins over the search, whose index may not show the write yet.
        found |= self._written
        out = []
        for scope in scopes:
            known = {ir: a for ir, a in found.items() if _live_in(a, scope)}
            self._keep_overrides(scope, found)
            self._by_ir |= {ir: a for ir, a in known.items() if ir not in self._written}
            self._live[scope] = known
            out.append(known)
        return out

    def holds_scope(self, environment: str | None = None, team: str | None = None) -> bool:
        """True when this invocation has read every live incident of a team in a pool (a pool, or all) already, so
        `live` answers that scope without a search of its own."""
        wanted: Scope = (environment, team, None)
        return any(_covers(read, wanted) for read in self._live)

    def _keep_overrides(self, scope: Scope, found: dict[int, Allocation]) -> None:
        """The quota overrides a search of a pool, a team in a pool, or the farm found, kept for `overrides`."""
        environment, team, phases = scope
        if phases is None:
            self._overrides[(environment, team)] = {
                ir: a for ir, a in found.items() if a.is_quota_override and _in_scope(a, scope)
            }

    def overrides(self, environment: str | None = None, team: str | None = None) -> list[Allocation]:
        """Live quota overrides (gpufarm.core.accounting.overrides) of a team in a pool, a pool, or all, in IR order.

        Seen by the live search of that scope (or a wider one), which `live` makes once and keeps: no search of
        their own.
        """
        wanted: Scope = (environment, team, None)
        seen = self._overrides.get((environment, team))
        if seen is None:
            wider = next((k for k in self._overrides if _covers((*k, None), wanted)), None)
            if wider is not None:
                seen = {ir: a for ir, a in self._overrides[wider].items() if _in_scope(a, wanted)}
        if seen is None:
            self.live(environment, team)
            seen = self._overrides.get((environment, team), {})
        return sorted((a for a in seen.values() if a.state is not State.RESOLVED), key=lambda a: a.ir)

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
        mine = [
            a
            for a in found
            if a.requester == user and a.state is not State.RESOLVED and not a.is_probe and not a.is_quota_override
        ]
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
        for (pool, team), seen in self._overrides.items():
            if alloc.is_quota_override and _in_scope(alloc, (pool, team, None)):
                seen[alloc.ir] = alloc
        for scope, known in self._live.items():
            if alloc.state is not State.RESOLVED and not alloc.is_quota_override and _in_scope(alloc, scope):
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
        counted = None if units else self._sizes.get((environment, model))
        if counted is not None:
            return sum(gpus * n for (_, gpus), n in counted.items())
        total = 0
        for info in self.hosts.list_hosts(host_filter(environment)):
            host = GpuHost.from_tags(info.name, info.tags)
            if host is not None and host.environment == environment and host.gpu_model == model:
                total += size(host)
                if total >= need:
                    break
        return total

    def host_sizes(self, environment: str, gpu_model: str) -> Sizes:
        """Hosts of a pool's model per (cluster, GPUs per host), as the pool is now; read once per invocation.

        From a listing of the pool this invocation already holds; else counted (`_census`); else listed whole.
        gpufarm's own writes change hosts' allocation tags, never their inventory tags, so what was read stays true.
        """
        model = gpu_model.upper()
        known = self._sizes.get((environment, model))
        if known is None:
            listed = host_filter(environment) in self._listed or host_filter() in self._listed
            known = None if listed else self._census(environment, model)
            if known is None:
                known = {}
                for host in self.inventory(environment):
                    if host.gpu_model == model:
                        known[(host.cluster, host.gpu_count)] = known.get((host.cluster, host.gpu_count), 0) + 1
            self._sizes[(environment, model)] = known
        return dict(known)

    def _census(self, environment: str, model: str) -> Sizes | None:
        """The pool's sizes from sample pages and exact counts; None when they cannot be trusted (list it whole).

        Each (cluster, size) a sample shows is counted once through the host list's filter (`... cluster:hpc-a
        gpu_count:8`, Datadog's exact `total_matching`). The counts are the pool only when they add up to the
        pool's own exact total: every host is then of a size already seen. A sampled host the filter could not
        count as its inventory reads it (no cluster tag, two of one inventory key, a malformed count, another
        pool: a backend that ignored the filter) stops the census, as does a sum over the total (a host counted
        twice) or a count the backend will not give exactly. A host whose tags name two pools, clusters or sizes
        is malformed inventory; outside the samples it is caught only where it makes the sum disagree.
        """
        pages = self.hosts
        if not isinstance(pages, HostPages):
            return None
        pool = host_filter(environment, gpu_model=model)
        first = pages.host_page(pool, 0, CENSUS_SAMPLE)
        total = first.total
        if total is None:
            return None
        counted: Sizes = {}
        for probe in range(CENSUS_PROBES + 1):
            sample = first if probe == 0 else pages.host_page(pool, total * probe // (CENSUS_PROBES + 1), CENSUS_SAMPLE)
            tallied = _tally(sample.hosts, environment, model)
            if tallied is None:
                return None
            seen, tally = tallied
            if probe == 0 and total <= len(sample.hosts):
                return tally  # the whole pool is in the sample
            if not _count_sizes(pages, pool, seen, counted):
                return None
            found = sum(counted.values())
            if found == total:
                return {pair: n for pair, n in counted.items() if n}
            if found > total:
                return None
        return None

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


def _tally(hosts: Iterable[HostInfo], environment: str, model: str) -> tuple[dict[tuple[str, int], str], Sizes] | None:
    """A sample's (cluster, GPUs per host) pairs with the filter terms that count each, and how many hosts of each.

    None as soon as one host cannot be counted by a filter (_countable): the census cannot be trusted then.
    """
    seen: dict[tuple[str, int], str] = {}
    tally: Sizes = {}
    for info in hosts:
        countable = _countable(info, environment, model)
        if countable is None:
            return None
        pair, terms = countable
        seen[pair] = terms
        tally[pair] = tally.get(pair, 0) + 1
    return seen, tally


def _count_sizes(pages: HostPages, pool: str, seen: dict[tuple[str, int], str], counted: Sizes) -> bool:
    """Count each (cluster, size) not counted yet through the host list's filter into `counted`, in `seen`'s order.

    False when the backend will not give one of the counts exactly (the census stops there).
    """
    for pair, terms in seen.items():
        if pair not in counted:
            n = pages.host_page(f"{pool} {terms}", 0, 1).total
            if n is None:
                return False
            counted[pair] = n
    return True


def _countable(info: HostInfo, environment: str, model: str) -> tuple[tuple[str, int], str] | None:
    """A listed host's (cluster, GPUs per host) and the filter terms that count its like; None if they cannot."""
    host = GpuHost.from_tags(info.name, info.tags)
    clusters, counts = tag_values(info.tags, CLUSTER_KEY), tag_values(info.tags, GPU_COUNT_KEY)
    if host is None or host.environment != environment or host.gpu_model != model:
        return None
    single = (tag_values(info.tags, ENVIRONMENT_KEY), tag_values(info.tags, GPU_MODEL_KEY), clusters, counts)
    if any(len(values) != 1 for values in single):
        return None
    return (host.cluster, host.gpu_count), f"{CLUSTER_KEY}:{clusters[0]} {GPU_COUNT_KEY}:{counts[0]}"
