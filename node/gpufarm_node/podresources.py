"""kubelet's pod-resources API (`v1.PodResourcesLister/List` on a unix socket): which pod holds which GPU.

Used only when grpcio is installed and the socket exists; otherwise the agent runs without it. The answer is
decoded with a few lines of protobuf wire-format reading, so neither protobuf nor generated stubs are needed.
Messages (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto):

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from gpufarm_node.attribution import PodDevices

log = logging.getLogger("gpufarm_node.podresources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def kubelet_lister(socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0) -> Callable[[], list[PodDevices]] | None:
    """A List() caller for the socket, or None when grpcio is missing or the socket is absent."""
    if not Path(socket_path).exists():
        log.info("no kubelet pod-resources socket at %s: device ownership from kubelet is off", socket_path)
        return None
    if importlib.util.find_spec("grpc") is None:
        log.info("grpcio is not installed: device ownership from kubelet pod-resources is off")
        return None
    grpc = importlib.import_module("grpc")
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=bytes)

    def lister() -> list[PodDevices]:
        return decode_list_response(call(None, timeout=timeout))

    return lister


def decode_list_response(data: bytes) -> list[PodDevices]:
    """(namespace, pod, container, resource name, device ids) for every device a container holds."""
    out: list[PodDevices] = []
    for number, pod in _fields(data):
        if number != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for field, value in _fields(pod):
            if field == 1 and isinstance(value, bytes):
                name = value.decode()
            elif field == 2 and isinstance(value, bytes):
                namespace = value.decode()
            elif field == 3 and isinstance(value, bytes):
                containers.append(value)
        for container in containers:
            out.extend(_container_devices(namespace, name, container))
    return out


def _container_devices(namespace: str, pod: str, data: bytes) -> Iterator[PodDevices]:
    name, devices = _named_list(data)
    for device in devices:
        resource, ids = _named_list(device)
        yield namespace, pod, name, resource, [i.decode() for i in ids]


def _named_list(data: bytes) -> tuple[str, list[bytes]]:
    """A message's string field 1 and its repeated field 2: ContainerResources' name and devices, ContainerDevices'
    resource name and device ids (a field 1 given twice: the last wins, as protobuf reads it)."""
    name = ""
    items: list[bytes] = []
    for field, value in _fields(data):
        if field == 1 and isinstance(value, bytes):
            name = value.decode()
        elif field == 2 and isinstance(value, bytes):
            items.append(value)
    return name, items


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs: varints as int, length-delimited fields as bytes; fixed-size skipped."""
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise WireError("a length-delimited field runs past the end")
            yield number, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")
        if pos > end:
            raise WireError("a fixed-size field runs past the end")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
