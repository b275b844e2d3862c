"""A squatting pod to evict, as the agent's stopper (gpufarm_node.squatter_stops) hands it to the Kubernetes step's
evictions (gpufarm_node.enforce.kube_evict)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodStop:
    """A pod to evict: it squats `device` in the episode that began at `since` (unix seconds), as gpufarm decided."""

    namespace: str
    name: str
    device: str
    since: int
