"""Stands in for the check's generated kubelet pod-resources stub; never reached without a kubelet socket."""

from typing import Any


class PodResourcesListerStub:
    """kubelet's PodResourcesLister client."""

    def __init__(self, channel: Any) -> None:
        raise RuntimeError("the benchmark's host has no kubelet socket: pod-resources discovery is not measured")
