"""The Kubernetes step's evictions: a squatting pod whose stop gpufarm decided is evicted through the Eviction API.

gpufarm decides a stop (gpufarm.core.squatters: the episode outlasted the pool's `stop-after` grace, the host is not
exempt) and publishes it on the host's tags; the agent's stopper (gpufarm_node.squatter_stops) turns this cycle's
squatting pods under a stop into `PodStop`s and hands the whole set to `PodEvictor.want()` each cycle, with no I/O.
The Kubernetes step's thread (gpufarm_node.enforce.kube.NodeMarker runs it beside the Node's marks) then evicts each
pod once per episode (namespace, name, episode start): `POST /api/v1/namespaces/{ns}/pods/{name}/eviction`, which
honours the pod's PodDisruptionBudgets and termination grace as `kubectl drain` does.

- accepted (201): done for this episode; the pod terminates on its own grace.
- 404: the pod is gone already; done.
- refused (429: a PodDisruptionBudget allows no disruption now; 403 without the RBAC; 5xx; the API server away):
  retried with the step's backoff (2 s doubling to 5 min) while gpufarm's stop still names the pod, and reported:
  the gauges `gpufarm.enforce.lag_seconds` (since the oldest refused eviction was first tried), `failed_ops` and
  `applied_ops` tagged `kube_op:evict` beside the Node's own, an event when a pod's eviction is first refused and
  one when it goes through after all.

A pod no longer named (the episode ended, the host was exempted, the pod stopped squatting) is dropped, whatever its
backoff. At most MAX_PENDING pods are held and MAX_PER_STEP tried per step, so a storm of squatters costs the API
server a bounded rate. The stop itself is recorded on the hurt lease by gpufarm when it publishes it
(`squatter-stopped` in the lease's history), for a pod as for a process.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufarm_node.enforce.kube import BACKOFF_FIRST_S, BACKOFF_MAX_S
from gpufarm_node.enforce.pod_stops import PodStop
from gpufarm_node.enforce.reporting import Reporter, post_event, send_gauges
from gpufarm_node.enforce.run import APPLIED_METRIC, FAILED_METRIC, LAG_METRIC

log = logging.getLogger("gpufarm_node.enforce.kube_evict")

MAX_PENDING = 64
MAX_PER_STEP = 8
# Evictions done (namespace, name, episode) remembered; past this many the memory starts over.
_MAX_DONE = 4096
# A namespace is a DNS label, a pod name a DNS subdomain: anything else is not sent to the API.
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

Key = tuple[str, str, int]


class EvictApi(Protocol):
    """The one call the evictor makes (gpufarm_node.enforce.kube.KubernetesNodeApi.evict)."""

    def evict(self, namespace: str, name: str) -> bool: ...


def valid(stop: PodStop) -> bool:
    """True when the pod's namespace and name are ones the API could hold (they come from the node's pod list)."""
    return bool(_NAMESPACE.match(stop.namespace) and _POD.match(stop.name))


@dataclass
class _Pending:
    stop: PodStop
    first_at: float | None = None
    next_at: float = 0.0
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Eviction:
    """One eviction tried: the pod, and `outcome` (`evicted`, `gone` or `refused`) with the API's answer."""

    stop: PodStop
    outcome: str
    error: str | None = None


@dataclass
class _Tally:
    applied: int = 0
    failed: int = 0
    done: list[Eviction] = field(default_factory=list)


class PodEvictor:
    """Evicts the squatting pods gpufarm's stops name, once per pod per episode (see the module docstring)."""

    def __init__(
        self,
        api: EvictApi,
        node_name: str,
        reporter: Reporter | None = None,
        *,
        cluster_tag: str = "default",
        clock: Callable[[], float] = time.time,
        backoff_first: float = BACKOFF_FIRST_S,
        backoff_max: float = BACKOFF_MAX_S,
    ) -> None:
        self.api, self.node_name, self.reporter = api, node_name, reporter
        self.tags = ("enforcer:kubernetes", f"kube_node:{node_name}", f"cluster:{cluster_tag}", "kube_op:evict")
        self._clock = clock
        self._backoff_first, self._backoff_max = backoff_first, backoff_max
        self._lock = threading.Lock()
        self._pending: dict[Key, _Pending] = {}
        self._done: set[Key] = set()
        self._told_bad: set[Key] = set()
        self._wake: threading.Event | None = None
        self._failing = False
        self._owe_report = False

    def bind(self, wake: threading.Event) -> None:
        """The event that wakes the step's thread when a new eviction is wanted."""
        self._wake = wake

    # -- the agent's side: no I/O ------------------------------------------------------------------------------

    def want(self, stops: Sequence[PodStop]) -> None:
        """The pods gpufarm's stops name this cycle; those not named any more are dropped. Never raises."""
        named = self._named(stops)
        new = False
        with self._lock:
            for key in [k for k in self._pending if k not in named]:
                del self._pending[key]
                # A refused eviction no longer wanted: the gauges say so on the next step.
                new = new or self._failing
                self._owe_report = self._owe_report or self._failing
            new = self._add(named) or new
        if new and self._wake is not None:
            self._wake.set()

    def _named(self, stops: Sequence[PodStop]) -> dict[Key, PodStop]:
        """The stops whose pod the API could hold, by key; a name it could not is said once and left out."""
        named: dict[Key, PodStop] = {}
        for stop in stops:
            key = (stop.namespace, stop.name, stop.since)
            if valid(stop):
                named.setdefault(key, stop)
            elif key not in self._told_bad and len(self._told_bad) < _MAX_DONE:
                self._told_bad.add(key)
                log.warning("squatting pod %r/%r is not a name the API could hold; not evicted", *key[:2])
        return named

    def _add(self, named: dict[Key, PodStop]) -> bool:
        """Pend the named pods not yet done or pending, within MAX_PENDING (the lock held); True when one was."""
        new = False
        for key, stop in named.items():
            if key in self._done or key in self._pending:
                continue
            if len(self._pending) >= MAX_PENDING:
                log.warning("%d pod evictions pending; %s/%s waits", MAX_PENDING, stop.namespace, stop.name)
                break
            self._pending[key] = _Pending(stop)
            new = True
        return new

    # -- the thread's side -------------------------------------------------------------------------------------

    def due_in(self) -> float | None:
        """Seconds until an eviction is due (0: now); None when none is pending."""
        with self._lock:
            if self._owe_report:
                return 0.0
            if not self._pending:
                return None
            soonest = min(p.next_at for p in self._pending.values())
        return max(0.0, soonest - self._clock())

    def step(self) -> list[Eviction]:
        """Try the evictions that are due (at most MAX_PER_STEP), each one bounded call. Never raises."""
        now = self._clock()
        with self._lock:
            due = sorted((p for p in self._pending.values() if p.next_at <= now), key=lambda p: p.next_at)
        tally = _Tally()
        for pending in due[:MAX_PER_STEP]:
            tally.done.append(self._try(pending, now, tally))
        with self._lock:
            owed, self._owe_report = self._owe_report, False
        if tally.done or owed:
            self._report(tally, now)
        return tally.done

    def _try(self, pending: _Pending, now: float, tally: _Tally) -> Eviction:
        stop = pending.stop
        key = (stop.namespace, stop.name, stop.since)
        try:
            accepted = self.api.evict(stop.namespace, stop.name)
        except Exception as exc:  # noqa: BLE001 - any refusal: reported, retried with backoff
            error = str(exc)[:300] or type(exc).__name__
            tally.failed += 1
            first = pending.failures == 0
            with self._lock:
                pending.failures += 1
                pending.first_at = now if pending.first_at is None else pending.first_at
                pending.next_at = now + min(self._backoff_max, self._backoff_first * 2 ** (pending.failures - 1))
                pending.error = error
            log.warning("could not evict squatting pod %s/%s on %s: %s", stop.namespace, stop.name, stop.device, error)
            if first:
                self._event(
                    "gpufarm could not evict a squatting pod",
                    f"Pod {stop.namespace}/{stop.name} squats {stop.device} on Node {self.node_name} past its grace; "
                    f"the eviction was refused and is retried: {error}",
                    alert="warning",
                )
            return Eviction(stop, "refused", error)
        with self._lock:
            self._pending.pop(key, None)
            if len(self._done) >= _MAX_DONE:
                self._done.clear()
            self._done.add(key)
        outcome = "evicted" if accepted else "gone"
        if accepted:
            tally.applied += 1
            log.warning("evicted squatting pod %s/%s on %s, as gpufarm decided", stop.namespace, stop.name, stop.device)
        else:
            log.info("squatting pod %s/%s on %s is gone already", stop.namespace, stop.name, stop.device)
        if pending.failures:
            self._event(
                "gpufarm evicted a squatting pod" if accepted else "a squatting pod gpufarm could not evict is gone",
                f"Pod {stop.namespace}/{stop.name} on Node {self.node_name} ({stop.device}), after "
                f"{pending.failures} refusal(s)",
                alert="success",
            )
        return Eviction(stop, outcome)

    @property
    def lag_seconds(self) -> float:
        """Seconds since the oldest refused eviction still pending was first tried (0 when none is)."""
        now = self._clock()
        with self._lock:
            firsts = [p.first_at for p in self._pending.values() if p.first_at is not None]
        return max(0.0, now - min(firsts)) if firsts else 0.0

    def _report(self, tally: _Tally, now: float) -> None:
        lag = self.lag_seconds
        self._failing = bool(tally.failed) or lag > 0
        if self.reporter is None:
            return
        values = {
            LAG_METRIC: lag,
            FAILED_METRIC: float(tally.failed),
            APPLIED_METRIC: float(tally.applied),
        }
        send_gauges(self.reporter, values, self.tags, now, "eviction")

    def _event(self, title: str, text: str, *, alert: str) -> None:
        post_event(self.reporter, title, text, self.tags, alert, "eviction")
