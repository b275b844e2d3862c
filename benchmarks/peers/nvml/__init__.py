"""Datadog's `nvml` check (integrations-extras), the peer benchmarks/node.py runs beside the node agent.

`nvml.py` is upstream's `nvml/datadog_checks/nvml/nvml.py` unchanged (check version 1.0.9), from
github.com/DataDog/integrations-extras at commit 57e9d599daad03d877fa75c3a4648a6e70ae9860, under its BSD 3-clause
license (LICENSE beside it). The check is not on PyPI; its base, `datadog-checks-base`, comes with the `bench` extra.
`api_pb2.py` and `api_pb2_grpc.py` stand in for upstream's generated kubelet pod-resources stubs: the check reaches
them only from its discovery thread, which it starts only when the kubelet socket exists; the benchmark's host has
none, so they are never called (they raise if they were).
"""
