"""Stands in for the check's generated kubelet pod-resources messages; never reached without a kubelet socket."""


class ListPodResourcesRequest:
    """The request of kubelet's List call."""

    def __init__(self) -> None:
        raise RuntimeError("the benchmark's host has no kubelet socket: pod-resources discovery is not measured")
