"""The node agent's Kubernetes step: its own Node labelled and tainted while a dedicated lease holds the host.

The agent's cycle hands the lease it read from the host's tags to `NodeMarker.want()` (no I/O); the marker's own
thread brings the Node there (kube_plan): one GET, and a PATCH only when the Node differs, each with bounded
timeouts. So the metrics loop never waits on the API server. The Node is also read again every `resync` seconds (5
min), so a label or taint removed by hand is put back.

A refused or failed patch (403 without the RBAC, 409 when the Node changed in between, the API server away) is
retried with exponential backoff, and reported: `gpufarm.enforce.lag_seconds` (since when the Node last held what
the lease calls for, 0 when it does) and `gpufarm.enforce.failed_ops` with the tags `enforcer:kubernetes`,
`kube_node:<node>`, `cluster:`, and an event once when a failing episode starts and once when it ends.

The same thread evicts the squatting pods gpufarm's stops name (`evictions`, gpufarm_node.enforce.kube_evict),
between the Node's steps. The `kubernetes` client (the node distribution's `k8s` extra) is imported only when the
step is on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from urllib3.exceptions import HTTPError

from gpufarm_node.enforce.kube_plan import PlanError, check_ir, describe, node_patch
from gpufarm_node.enforce.reporting import Reporter as Reporter  # noqa: PLC0414 - named here by its users
from gpufarm_node.enforce.reporting import post_event, send_gauges
from gpufarm_node.enforce.run import APPLIED_METRIC, FAILED_METRIC, LAG_METRIC

log = logging.getLogger("gpufarm_node.enforce.kube")

BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 300.0
# The Node is read again this often while nothing changes (a hand edit is put back within it); a new lease is
# applied at once.
RESYNC_S = 300.0
MAX_NODE_BYTES = 4 << 20
# Connect and read timeouts of each API call.
REQUEST_TIMEOUT = (3.0, 5.0)


class NodeApi(Protocol):
    """The two calls the marker makes on its own Node."""

    def get(self, name: str) -> dict[str, Any]: ...

    def patch(self, name: str, body: Mapping[str, Any]) -> None: ...


class Evictions(Protocol):
    """The step's evictions of squatting pods (gpufarm_node.enforce.kube_evict.PodEvictor), run in its thread."""

    def bind(self, wake: threading.Event) -> None: ...

    def due_in(self) -> float | None: ...

    def step(self) -> object: ...


class KubeApiError(RuntimeError):
    """A Kubernetes API call failed; the message says how, without credentials. `status`: the HTTP status, None
    when no answer came."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubernetesNodeApi:
    """Nodes (and the eviction of a pod, gpufarm_node.enforce.kube_evict) through the official client: in-cluster
    configuration (the pod's service account), or `host` and `token` given (tests and the demo point it at the
    sandbox)."""

    def __init__(
        self, *, host: str | None = None, token: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT
    ):
        from kubernetes import client, config

        if host is None:
            config.load_incluster_config()
            configuration = client.Configuration.get_default_copy()
        else:
            configuration = client.Configuration(host=host)
            if token:
                configuration.api_key = {"authorization": f"Bearer {token}"}
        # One try per call: the marker's backoff is the retry.
        configuration.retries = False
        self._api = client.CoreV1Api(client.ApiClient(configuration))
        self._models = client
        self._exception = client.exceptions.ApiException
        self._timeout = timeout

    def get(self, name: str) -> dict[str, Any]:
        """The Node's JSON as the API sends it (a real Node's status is tens of kilobytes: it is parsed as JSON, not
        into the client's models, and only its metadata and spec are read; kube_plan checks their shape)."""
        response = self._call(lambda: self._api.read_node(name, _request_timeout=self._timeout, _preload_content=False))
        data = response.data
        if len(data) > MAX_NODE_BYTES:
            raise KubeApiError(f"the Node's answer is over {MAX_NODE_BYTES} bytes")
        try:
            node = json.loads(data)
        except ValueError:
            raise KubeApiError("the Node's answer is not JSON") from None
        if not isinstance(node, dict):
            raise KubeApiError("the Node's answer is not an object")
        return node

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        """A merge patch of the Node (the client sends a dict body as a strategic merge patch)."""
        self._call(
            lambda: self._api.patch_node(name, dict(body), _request_timeout=self._timeout, _preload_content=False)
        )

    def evict(self, namespace: str, name: str) -> bool:
        """Evict a pod through the Eviction API (policy/v1, `POST .../pods/{name}/eviction`), which honours its
        PodDisruptionBudgets and grace period as `kubectl drain` does. True: the eviction was accepted; False: no
        such pod (gone already). A refusal (429 by a disruption budget, 403, 5xx) raises KubeApiError."""
        body = self._models.V1Eviction(metadata=self._models.V1ObjectMeta(name=name, namespace=namespace))
        try:
            self._call(
                lambda: self._api.create_namespaced_pod_eviction(
                    name, namespace, body, _request_timeout=self._timeout, _preload_content=False
                )
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _call(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._exception as exc:
            code = exc.status if isinstance(exc.status, int) else None
            raise KubeApiError(_api_error(exc.status, exc.reason, exc.body), code) from None
        except (HTTPError, OSError, ValueError) as exc:
            raise KubeApiError(f"the API server is unreachable ({type(exc).__name__})") from None


def _api_error(status: Any, reason: Any, body: Any) -> str:
    """`HTTP 403 Forbidden: <the Status's message>`, bounded."""
    message = ""
    if isinstance(body, (str, bytes)):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            message = doc["message"]
    text = f"HTTP {status} {reason or ''}".strip()
    return f"{text}: {message[:200]}" if message else text


@dataclass(frozen=True)
class StepResult:
    """What one step did: `patched` (what changed, or None), `error` (why it failed, or None)."""

    want: str | None
    patched: str | None = None
    error: str | None = None


class NodeMarker:
    """Keeps one Node's gpufarm label and taint equal to the lease the agent last read for its host."""

    def __init__(
        self,
        api: NodeApi,
        node_name: str,
        reporter: Reporter | None = None,
        *,
        cluster_tag: str = "default",
        clock: Callable[[], float] = time.time,
        backoff_first: float = BACKOFF_FIRST_S,
        backoff_max: float = BACKOFF_MAX_S,
        resync: float = RESYNC_S,
        evictions: Evictions | None = None,
    ) -> None:
        self.api, self.node_name, self.reporter = api, node_name, reporter
        # The squatting pods gpufarm's stops name, evicted in this thread between the Node's steps.
        self.evictions = evictions
        self.tags = ("enforcer:kubernetes", f"kube_node:{node_name}", f"cluster:{cluster_tag}")
        self._clock = clock
        self._backoff_first, self._backoff_max, self._resync = backoff_first, backoff_max, resync
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._want: str | None = None
        self._known = False
        self._done: str | bool | None = False  # the lease the Node last held (False: not yet known to hold one)
        self._failures = 0
        self._next_at = 0.0
        self._converged_at = clock()
        self._failing = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._told_bad = False
        self.steps = 0
        if evictions is not None:
            evictions.bind(self._wake)

    # -- the agent's side: no I/O ------------------------------------------------------------------------------

    def want(self, ir: str | None) -> None:
        """The lease holding the whole host now (`ir-<n>`), or None; the thread applies it. A value that is not a
        lease (an `ir:` tag edited by hand into something else) changes nothing and is logged once; never raises."""
        try:
            ir = check_ir(ir)
        except PlanError:
            if not self._told_bad:
                self._told_bad = True
                log.warning("%s: the host's ir: tag %r is not a lease; the Node is left as it is", self.node_name, ir)
            return
        self._told_bad = False
        with self._lock:
            changed = not self._known or ir != self._want
            self._want, self._known = ir, True
        if changed:
            self._wake.set()

    # -- the thread's side -------------------------------------------------------------------------------------

    def step(self) -> StepResult | None:
        """One bounded apply when one is due: read the Node, patch it when it differs; None when nothing was known
        yet. Never raises."""
        with self._lock:
            if not self._known:
                return None
            want = self._want
        now = self._clock()
        self.steps += 1
        try:
            node = self.api.get(self.node_name)
            patch = node_patch(node, want)
            if patch is not None:
                self.api.patch(self.node_name, patch)
        except Exception as exc:  # noqa: BLE001 - any failure: reported, retried with backoff
            result = StepResult(want, error=str(exc)[:300] or type(exc).__name__)
            self._failures += 1
            wait = min(self._backoff_max, self._backoff_first * 2 ** (self._failures - 1))
            self._next_at = now + wait
        else:
            result = StepResult(want, patched=describe(patch) if patch is not None else None)
            self._failures = 0
            self._done = want
            self._converged_at = now
            self._next_at = now + self._resync
        self._report(result, now)
        return result

    def due_in(self) -> float:
        """Seconds until the next step is due (0: now)."""
        with self._lock:
            pending = self._known and self._done != self._want
        if pending and self._failures == 0:
            return 0.0
        return max(0.0, self._next_at - self._clock())

    def run(self, stop: threading.Event) -> None:
        """Step when due or woken by a new lease (or a pod to evict), until `stop` is set."""
        while not stop.is_set():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if stop.is_set():
                return
            with self._lock:
                known = self._known
            if known and self.due_in() <= 0.0:
                self.step()
            evictions = self.evictions
            evict_in = evictions.due_in() if evictions is not None else None
            if evictions is not None and evict_in is not None and evict_in <= 0.0:
                try:
                    evictions.step()
                except Exception:  # never the thread's end: the Node's marks go on
                    log.exception("%s: the evictions' step failed", self.node_name)

    def _next_wait(self) -> float | None:
        """Seconds until the Node's step or an eviction is due; None (until woken) when neither is pending."""
        with self._lock:
            known = self._known
        waits = [self.due_in()] if known else []
        if self.evictions is not None:
            evict_in = self.evictions.due_in()
            waits += [evict_in] if evict_in is not None else []
        return min(waits) if waits else None

    def start(self) -> threading.Event:
        """Run in a daemon thread; the event returned stops it."""
        stop = self._stop
        self._thread = threading.Thread(target=self.run, args=(stop,), name="gpufarm-node-kube", daemon=True)
        self._thread.start()
        return stop

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (it finishes the step under way: each call is bounded)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def lag_seconds(self) -> float:
        """Seconds since the Node last held what the lease calls for (0 while it does)."""
        return 0.0 if not self._failing else max(0.0, self._clock() - self._converged_at)

    def _report(self, result: StepResult, now: float) -> None:
        if result.error is not None:
            log.warning("%s: could not apply lease %s to the Node: %s", self.node_name, result.want, result.error)
        elif result.patched is not None:
            log.info("%s: Node patched: %s", self.node_name, result.patched)
        failing = result.error is not None
        if failing and not self._failing:
            self._event(
                "gpufarm enforcement is lagging",
                f"Node {self.node_name} does not hold lease {result.want or '(none)'} yet: {result.error}",
                alert="error",
            )
        elif not failing and self._failing:
            self._event(
                "gpufarm enforcement caught up", f"Node {self.node_name} holds its lease again", alert="success"
            )
        self._failing = failing
        if self.reporter is None:
            return
        values = {
            LAG_METRIC: 0.0 if not failing else max(0.0, now - self._converged_at),
            FAILED_METRIC: 1.0 if failing else 0.0,
            APPLIED_METRIC: 1.0 if result.patched is not None else 0.0,
        }
        send_gauges(self.reporter, values, self.tags, now, "enforcement")

    def _event(self, title: str, text: str, *, alert: str) -> None:
        post_event(self.reporter, title, text, self.tags, alert, "enforcement")
