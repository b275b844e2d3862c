"""Registration: the node tags itself into the inventory (gpufarm:managed, gpu_model, gpu_count, environment,
cluster, one gpu_unit per schedulable GPU or MIG slice) at start and every few minutes, and reads back its `ir:`
tags for attribution.

It never removes allocation tags (`ir:`, `project:`, `team:`, `gpu_assign:`): missing registration
tags are appended with POST (no race with the allocator); only when a registration tag has a stale value (the
node moved cluster, a GPU disappeared) does it PUT the `user` source, re-reading it right before so the window
in which a concurrent allocation write could be lost is one round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpufarm_node.model import NodeSnapshot
from gpufarm_node.tags import (
    CLUSTER_KEY,
    ENVIRONMENT_KEY,
    GPU_COUNT_KEY,
    GPU_MODEL_KEY,
    GPU_UNIT_KEY,
    MANAGED_TAG,
    host_lease,
    registration_tags,
    unit_tag,
)

log = logging.getLogger("gpufarm_node.registration")

SOURCE = "user"
# A unit tag the snapshot no longer shows (a GPU gone, MIG reconfigured) is stale like a changed count.
_KEYED = frozenset({GPU_MODEL_KEY, GPU_COUNT_KEY, ENVIRONMENT_KEY, CLUSTER_KEY, GPU_UNIT_KEY})


def unit_tags(snap: NodeSnapshot) -> list[str]:
    """The `gpu_unit` tags of a snapshot's schedulable units: each GPU not in MIG mode, each MIG slice."""
    out: list[str] = []
    for gpu in snap.gpus:
        if gpu.mig_enabled:
            out += [unit_tag(gpu.index, mig.uuid, mig.gpu_instance_id, mig.profile) for mig in gpu.migs]
        else:
            out.append(unit_tag(gpu.index, gpu.uuid))
    return out


def merge_registration(current: list[str], wanted: list[str]) -> tuple[list[str], list[str]]:
    """(tags to append, full tag list to PUT or [] when appending is enough)."""
    stale = [t for t in current if t.partition(":")[0] in _KEYED and t not in wanted]
    missing = [t for t in wanted if t not in current]
    if not stale:
        return missing, []
    keep = [t for t in current if t not in stale]
    return [], keep + [t for t in wanted if t not in keep]


class HostRegistrar:
    """Keeps this host's registration tags in place and knows its `ir:` tags."""

    def __init__(
        self,
        tags_api: Any,
        hostname: str,
        environment: str,
        cluster: str,
        *,
        interval: float = 300.0,
        retry_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = tags_api
        self.hostname = hostname
        self.environment = environment
        self.cluster = cluster
        self._interval = interval
        self._retry_after = retry_after
        self._clock = clock
        self._next: float | None = None
        self.tags: list[str] = []
        self.registered = False

    def due(self) -> bool:
        """Time for another refresh."""
        return self._next is None or self._clock() >= self._next

    def host_ir(self) -> str | None:
        """The lease the whole host belongs to, as its tags read at registration say (gpufarm_node.tags.host_lease)."""
        return host_lease(self.tags)

    def refresh(self, gpu_model: str, gpu_count: int, units: Sequence[str] = ()) -> bool:
        """Ensure the registration tags (with `units`, the snapshot's unit_tags); False (and a retry sooner) when
        Datadog could not be reached."""
        from datadog_api_client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        wanted = registration_tags(gpu_model, gpu_count, self.environment, self.cluster, units)
        try:
            current = self._get()
            append, replace_all = merge_registration(current, wanted)
            if replace_all:
                # Re-read right before replacing: only registration tags change, allocation tags stay.
                _, replace_all = merge_registration(self._get(), wanted)
                if replace_all:
                    self._put(replace_all)
                    current = replace_all
                    log.info("registration tags of %s updated", self.hostname)
            elif append:
                self._post(append)
                # POST answers with what it added; the source now holds both.
                current = current + append
                log.info("%s registered: %s", self.hostname, " ".join(append))
        except (ApiException, HTTPError, OSError) as exc:
            status = getattr(exc, "status", None)
            log.warning("host registration of %s failed (%s)", self.hostname, status or type(exc).__name__)
            self._next = self._clock() + self._retry_after
            return False
        self.tags = current
        self.registered = MANAGED_TAG in current
        self._next = self._clock() + self._interval
        return True

    def _get(self) -> list[str]:
        from datadog_api_client.exceptions import ApiException

        try:
            answer = self._api.get_host_tags(host_name=self.hostname, source=SOURCE)
        except ApiException as exc:
            if exc.status == 404:
                return []  # a host Datadog has not seen yet has no tags
            raise
        return _tags_of(answer)

    def _post(self, tags: list[str]) -> None:
        from datadog_api_client.v1.model.host_tags import HostTags

        self._api.create_host_tags(host_name=self.hostname, body=HostTags(host=self.hostname, tags=tags), source=SOURCE)

    def _put(self, tags: list[str]) -> None:
        from datadog_api_client.v1.model.host_tags import HostTags

        self._api.update_host_tags(host_name=self.hostname, body=HostTags(host=self.hostname, tags=tags), source=SOURCE)


def _tags_of(answer: Any) -> list[str]:
    tags = answer.get("tags") if isinstance(answer, dict) else getattr(answer, "tags", None)
    return [str(t) for t in (tags or [])]
