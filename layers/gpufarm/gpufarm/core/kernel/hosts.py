"""Host tags that make a host part of the GPU inventory, and the allocation tags gpufarm writes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from gpufarm.core.kernel.bounded import ascii_digits
from gpufarm.core.kernel.ir import ir_tag_value

MANAGED_TAG = "gpufarm:managed"
# The monitor tag of gpufarm's squatter monitor (gpufarm.setup.squatter_monitor): its groups name a lease it hurts,
# never one that is idle, so the idle webhook leaves them out.
SQUATTER_MONITOR_TAG = "gpufarm_monitor_kind:squatter"
# A stop gpufarm publishes on a host for its node agent (stop-after, gpufarm.core.squatters):
# `gpufarm_stop:<uuid>/<unix seconds>` = stop the squatters on that device that started by then; at most
# MAX_STOP_TAGS per host, removed when the episode ends. An operator exempts a host from stops with
# EXEMPT_SQUATTERS_TAG.
STOP_KEY = "gpufarm_stop"
MAX_STOP_TAGS = 16
EXEMPT_SQUATTERS_TAG = "gpufarm_exempt:squatters"
GPU_MODEL_KEY = "gpu_model"
GPU_COUNT_KEY = "gpu_count"
ENVIRONMENT_KEY = "environment"
CLUSTER_KEY = "cluster"
PROJECT_KEY = "project"
TEAM_KEY = "team"
IR_KEY = "ir"
# The host's schedulable units as its node agent publishes them (one tag each): `gpu_unit:<index>/<uuid>` for a
# whole GPU, `gpu_unit:<index>.<gi>/<mig uuid>/<profile>` for a MIG slice (GPU instance `gi`), uuids lowercased.
GPU_UNIT_KEY = "gpu_unit"
# One per unit a lease holds on a shared host, next to its `ir:` tag: `gpu_assign:ir-<N>/<uuid>` (the node agent
# attributes the unit's series to the lease from it).
GPU_ASSIGN_KEY = "gpu_assign"
# A host publishes at most this many units (8 GPUs x 7 slices is 56); more tags than this are ignored.
MAX_UNITS = 128
MAX_GPU_INDEX = 63
_UUID_RE = re.compile(r"^(gpu|mig)-[0-9a-f][0-9a-f-]{7,79}$", re.ASCII)
# `1g.10gb`, `1g.10gb_me` (Datadog turns `+` into `_`), `unknown` when the driver's name had no profile in it.
UNKNOWN_PROFILE = "unknown"
_PROFILE_RE = re.compile(r"^([0-9]{1,2}[gc][0-9a-z._]{0,30}|unknown)$", re.ASCII)
# Tags a host carries because an incident holds it; reclaim removes exactly these.
ALLOCATION_KEYS = frozenset({IR_KEY, PROJECT_KEY, TEAM_KEY})


def tag_value(tags: Iterable[str], key: str) -> str | None:
    """The value of the first `key:value` tag, or None."""
    prefix = f"{key}:"
    for tag in tags:
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return None


def tag_values(tags: Iterable[str], key: str) -> list[str]:
    """Every value of `key:value` tags, in order."""
    prefix = f"{key}:"
    return [tag[len(prefix) :] for tag in tags if tag.startswith(prefix)]


# Distinct tags remembered normalised: a sync names the same pools, models, teams and sources on thousands of gauges,
# and a cached answer costs a tenth of normalising again (bounded: a few MB at most).
NORMALIZED_TAGS_KEPT = 32_768


@lru_cache(maxsize=NORMALIZED_TAGS_KEPT)
def normalize_tag(tag: str) -> str:
    """Datadog's normalisation: lowercase, at most 200 characters, odd characters become `_` (each distinct tag
    normalised once per process, up to NORMALIZED_TAGS_KEPT of them)."""
    return "".join(ch if ch.isalnum() or ch in "_-:./" else "_" for ch in tag.lower()[:200])


@dataclass(frozen=True)
class GpuUnit:
    """One schedulable unit of a host: a whole GPU (`gi` None) or a MIG slice of GPU `index`.

    A unit of a host whose agent publishes no units (an older agent) has neither uuid nor profile: it is known by
    its index alone.
    """

    index: int
    gi: int | None = None
    uuid: str | None = None
    profile: str | None = None

    @property
    def id(self) -> str:
        """What names the unit in `gpu_assign` tags and incident fields: its uuid, else its index."""
        return self.uuid or str(self.index)

    @property
    def label(self) -> str:
        """`3` for GPU 3, `3.1` for GPU instance 1 on GPU 3."""
        return str(self.index) if self.gi is None else f"{self.index}.{self.gi}"

    @property
    def is_mig(self) -> bool:
        """True for a MIG slice."""
        return self.gi is not None

    def tag_value(self) -> str:
        """`3/gpu-…`, `3.1/mig-…/1g.10gb`, or `3` for a unit known by index only (the gpu_unit tag's value)."""
        parts = [self.label, *([self.uuid] if self.uuid else []), *([self.profile] if self.profile else [])]
        return "/".join(parts)

    @classmethod
    def parse(cls, text: str) -> GpuUnit | None:
        """The inverse of tag_value; None for anything malformed (an index past MAX_GPU_INDEX, an odd uuid)."""
        parts = text.split("/")
        if not 1 <= len(parts) <= 3:
            return None
        label = _parse_label(parts[0])
        if label is None:
            return None
        index, gi = label
        uuid = parts[1] if len(parts) > 1 else None
        profile = parts[2] if len(parts) > 2 else None
        if not _identity_fits(gi, uuid, profile):
            return None
        return cls(index, gi, uuid, profile)


def _parse_label(text: str) -> tuple[int, int | None] | None:
    """`3` as (3, None), `3.1` as (3, 1); None for an index past MAX_GPU_INDEX or a dot with no GPU instance."""
    index_text, dot, gi_text = text.partition(".")
    index = ascii_digits(index_text, max_digits=2)
    gi = ascii_digits(gi_text, max_digits=2) if dot else None
    if index is None or index > MAX_GPU_INDEX or (dot and gi is None):
        return None
    return index, gi


def _identity_fits(gi: int | None, uuid: str | None, profile: str | None) -> bool:
    """Whether a unit's uuid and profile are well formed and match its kind (whole GPU or MIG slice)."""
    if uuid is not None and not _UUID_RE.match(uuid):
        return False
    if uuid is not None and uuid.startswith("mig-") != (gi is not None):
        return False  # a slice has a MIG uuid, a whole GPU a GPU one
    if profile is not None and (gi is None or not _PROFILE_RE.match(profile)):
        return False
    # A slice is only ever known by its uuid and profile.
    return gi is None or (uuid is not None and profile is not None)


def unit_tag(unit: GpuUnit) -> str:
    """`gpu_unit:3.1/mig-…/1g.10gb`."""
    return f"{GPU_UNIT_KEY}:{unit.tag_value()}"


def parse_units(tags: Iterable[str]) -> tuple[GpuUnit, ...]:
    """The units a host's `gpu_unit` tags publish, by GPU then GPU instance, each uuid once, at most MAX_UNITS."""
    seen: dict[str, GpuUnit] = {}
    for value in tag_values(tags, GPU_UNIT_KEY):
        unit = GpuUnit.parse(value)
        if unit is not None and unit.uuid is not None and unit.id not in seen:
            seen[unit.id] = unit
            if len(seen) == MAX_UNITS:
                break
    return tuple(sorted(seen.values(), key=lambda u: (u.index, -1 if u.gi is None else u.gi, u.id)))


def assign_tag(ir_value: str, unit_id: str) -> str:
    """`gpu_assign:ir-123/mig-…` for the lease `ir-123` holding a unit."""
    return f"{GPU_ASSIGN_KEY}:{ir_value}/{unit_id}"


def stop_tag(device: str, since_epoch: int) -> str:
    """The host tag asking its agent to stop the squatters of `device` that started by `since_epoch`."""
    return f"{STOP_KEY}:{device.lower()}/{since_epoch}"


def parse_assign(value: str) -> tuple[str, str] | None:
    """`ir-123/mig-…` as (`ir-123`, unit id); None when malformed."""
    ir_value, sep, unit_id = value.partition("/")
    number = ascii_digits(ir_value.removeprefix("ir-"), max_digits=9) if ir_value.startswith("ir-") else None
    if not sep or number is None or not unit_id or "/" in unit_id:
        return None
    return ir_value, unit_id


@dataclass(frozen=True)
class GpuHost:
    """A host of the inventory as its tags describe it."""

    name: str
    gpu_model: str
    gpu_count: int
    environment: str
    cluster: str
    tags: tuple[str, ...] = ()

    @property
    def irs(self) -> list[str]:
        """`ir-123` values of the incidents holding this host."""
        return tag_values(self.tags, IR_KEY)

    @cached_property
    def units(self) -> tuple[GpuUnit, ...]:
        """The schedulable units the host's agent publishes; GPUs 0..gpu_count-1 by index when it publishes none."""
        published = parse_units(self.tags)
        if published:
            return published
        return tuple(GpuUnit(i) for i in range(min(self.gpu_count, MAX_UNITS)))

    @property
    def assignments(self) -> dict[str, str]:
        """Unit id -> `ir-123` of the host's `gpu_assign` tags (the first one wins for a unit tagged twice)."""
        out: dict[str, str] = {}
        for value in tag_values(self.tags, GPU_ASSIGN_KEY):
            parsed = parse_assign(value)
            if parsed is not None:
                out.setdefault(parsed[1], parsed[0])
        return out

    @classmethod
    def from_tags(cls, name: str, tags: Iterable[str]) -> GpuHost | None:
        """Build from host tags; None unless the host carries the full set of inventory tags."""
        tag_list = tuple(tags)
        if MANAGED_TAG not in tag_list:
            return None
        model = tag_value(tag_list, GPU_MODEL_KEY)
        count = tag_value(tag_list, GPU_COUNT_KEY)
        env = tag_value(tag_list, ENVIRONMENT_KEY)
        gpus = ascii_digits(count or "")
        if not model or gpus is None or not env:
            return None
        cluster = tag_value(tag_list, CLUSTER_KEY) or "default"
        return cls(name, model.upper(), gpus, env, cluster, tag_list)


def host_filter(environment: str | None = None, ir: int | None = None, *, gpu_model: str | None = None) -> str:
    """The host list's filter for managed hosts of one pool (and model), or those tagged with one IR."""
    terms = [MANAGED_TAG]
    terms += [normalize_tag(f"{ENVIRONMENT_KEY}:{environment}")] if environment is not None else []
    terms += [normalize_tag(f"{GPU_MODEL_KEY}:{gpu_model}")] if gpu_model is not None else []
    terms += [f"{IR_KEY}:{ir_tag_value(ir)}"] if ir is not None else []
    return " ".join(terms)
