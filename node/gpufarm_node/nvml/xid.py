"""XID events: a watcher registers every GPU and drains the driver's events into a bounded queue, in a background
thread (the driver's wait blocks) or polled each cycle for simulations (docs/nvml.md §2)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpufarm_node.nvml.device import LOST, UNSUPPORTED, Device

log = logging.getLogger("gpufarm_node.nvml")

# The Datadog Agent retries event registration: "watching device events seems to require specific
# permission/status ... data races at initialization" (docs/nvml.md §2).
_REGISTER_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID reported by the driver."""

    gpu_uuid: str | None
    xid: int


class XidWatcher:
    """XID events into a bounded queue; drops (and counts) events when the queue is full."""

    def __init__(
        self, nvml: Any, devices: list[Device], size: int, log_once: Callable[..., None], wait_ms: int
    ) -> None:
        self._n = nvml
        # The Datadog Agent waits 1 s per call; the thread notices a stop request within that.
        self._wait_ms = wait_ms
        self._devices = devices
        self._queue: queue.Queue[XidEvent] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._dropped = 0
        self._log_once = log_once
        self._registered = 0

    def start(self, *, threaded: bool) -> bool:
        """Register every GPU for XID events; False when nothing could be registered."""
        try:
            self._event_set = self._n.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._log_once("xid:create", logging.WARNING, "XID events unavailable: %s", exc)
            return False
        for dev in self._devices:
            self._register(dev)
        if not self._registered:
            self._free()
            return False
        if threaded:
            self._thread = threading.Thread(target=self._run, name="gpufarm-xid", daemon=True)
            self._thread.start()
        return True

    def _register(self, dev: Device) -> None:
        for attempt in range(_REGISTER_ATTEMPTS):
            try:
                self._n.nvmlDeviceRegisterEvents(dev.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
            except (*UNSUPPORTED, *LOST):
                self._log_once(f"xid:unsupported:{dev.uuid}", logging.INFO, "GPU %d: no XID events", dev.index)
                return
            except pynvml.NVMLError as exc:
                if attempt == _REGISTER_ATTEMPTS - 1:
                    self._log_once(f"xid:register:{dev.uuid}", logging.WARNING, "GPU %d: XID: %s", dev.index, exc)
                    return
                self._stop.wait(0.2)
            else:
                self._registered += 1
                return

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wait_one(self._wait_ms)

    def _wait_one(self, timeout_ms: int) -> bool:
        try:
            data = self._n.nvmlEventSetWait(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return False
        except pynvml.NVMLError as exc:
            self._log_once("xid:wait", logging.WARNING, "waiting for XID events failed: %s", exc)
            if self._thread is not None:
                self._stop.wait(1.0)
            return False
        try:
            gpu_uuid: str | None = str(self._n.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            gpu_uuid = None
        try:
            self._queue.put_nowait(XidEvent(gpu_uuid, int(data.eventData)))
        except queue.Full:
            self._dropped += 1
        return True

    def drain(self) -> tuple[list[XidEvent], int]:
        """Events since the last drain (polling NVML first when there is no thread) and the drop count."""
        if self._thread is None:
            for _ in range(self._queue.maxsize + 1):
                if not self._wait_one(0):
                    break
        events = []
        while True:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                break
        dropped, self._dropped = self._dropped, 0
        return events, dropped

    def stop(self) -> None:
        """Stop the thread and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
        self._free()

    def _free(self) -> None:
        if self._event_set is not None:
            try:
                self._n.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None
