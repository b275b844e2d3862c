"""The Kubernetes step's evictions of squatting pods: which pod (a pod squatting the device a stop names, never on an
exempt host, never the lease's own, never a newer process's pod), once per pod per episode, refusals retried with
the step's backoff and reported, 404 taken as gone, pods no longer named dropped, all in the step's thread."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from gpufarm_node.enforce.kube import KubeApiError, NodeMarker
from gpufarm_node.enforce.kube_evict import MAX_PER_STEP, PodEvictor
from gpufarm_node.enforce.pod_stops import PodStop
from gpufarm_node.squatter_stops import EXEMPT_TAG, ProcessStarts, SquatterStopper
from gpufarm_node.squatters import PodRef, Squatter

DEV = "mig-00000000-0000-4000-8000-000000000001"
OTHER = "mig-00000000-0000-4000-8000-000000000002"
SINCE = 1_600_000_100
STOP = PodStop("team-b", "intruder", DEV, SINCE)
SPEC = yaml.safe_load((Path(__file__).resolve().parents[2] / "spec" / "metrics.yaml").read_text())


class Api:
    """Evictions answered from a script: True (201), False (404) or an exception (a refusal)."""

    def __init__(self, *answers: bool | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str]] = []

    def evict(self, namespace: str, name: str) -> bool:
        self.calls.append((namespace, name))
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


class Ops:
    def __init__(self) -> None:
        self.gauges_sent: list[dict[str, float]] = []
        self.tags: tuple[str, ...] = ()
        self.events: list[tuple[str, str]] = []

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        self.gauges_sent.append(dict(values))
        self.tags = tuple(tags)

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append((title, alert))


class Hook:
    def __init__(self) -> None:
        self.told: list[list[PodStop]] = []

    def want(self, stops: Sequence[PodStop]) -> None:
        self.told.append(list(stops))


PDB = KubeApiError("HTTP 429 Too Many Requests: Cannot evict pod as it would violate the pod's disruption budget.", 429)


def _evictor(api: Api, ops: Ops | None = None, now: list[float] | None = None) -> PodEvictor:
    clock = now or [1000.0]
    return PodEvictor(
        api, "gpu-1", ops, cluster_tag="k8s-shared", clock=lambda: clock[0], backoff_first=2, backoff_max=8
    )


def _proc(tmp_path: Path, pid: int, start_ticks: int) -> None:
    (tmp_path / "stat").write_text("cpu 0\nbtime 1600000000\n")
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) S " + " ".join(["0"] * 18) + f" {start_ticks} 0 0\n")


def test_the_stopper_hands_the_squatting_pods_a_stop_names_to_the_hook(tmp_path: Path) -> None:
    _proc(tmp_path, 21, 100)  # started at 1600000001: before the episode
    _proc(tmp_path, 22, 500_000)  # started at 1600005000: after it (a newer process)
    hook, killed = Hook(), []
    stopper = SquatterStopper(ProcessStarts(str(tmp_path), ticks=100), kill=lambda p, s: killed.append(p), evict=hook)
    squatters = [
        Squatter(DEV, "ir-5", "ir-9", pod=PodRef("team-b", "intruder")),  # pod-resources: no pid
        Squatter(DEV, "ir-5", "ir-9", 21, PodRef("team-b", "intruder")),  # a process of the same pod
        Squatter(DEV, "ir-5", "ir-9", 22, PodRef("team-c", "late")),  # newer than the episode
        Squatter(DEV, "ir-5", "ir-5", pod=PodRef("team-a", "own")),  # the lease's own pod
        Squatter(OTHER, "ir-6", "ir-9", pod=PodRef("team-b", "elsewhere")),  # no stop names its device
        Squatter(DEV, "ir-5", None, 21),  # a host process: SIGTERM, as before
    ]
    tags = ["ir:ir-5", f"gpufarm_stop:{DEV}/{SINCE}"]
    stopper.apply(tags, squatters)
    assert hook.told == [[STOP, STOP]] and killed == [21]
    stopper.apply([*tags, EXEMPT_TAG], squatters)  # exempt: nothing, and the hook drops what it held
    stopper.apply(["ir:ir-5"], squatters)  # the episode ended: its tag is gone
    stopper.apply(tags, [])  # no squatter this cycle
    assert hook.told[1:] == [[], [], []] and killed == [21]


def test_a_pod_is_evicted_once_per_episode() -> None:
    api, ops = Api(), Ops()
    evictor = _evictor(api, ops)
    evictor.want([STOP, STOP])
    assert evictor.due_in() == 0.0
    assert [e.outcome for e in evictor.step()] == ["evicted"]
    for _ in range(3):  # still squatting while it terminates: not evicted again
        evictor.want([STOP])
        assert evictor.due_in() is None and evictor.step() == []
    evictor.want([PodStop("team-b", "intruder", DEV, SINCE + 3600)])  # a new episode
    assert [e.outcome for e in evictor.step()] == ["evicted"]
    assert api.calls == [("team-b", "intruder")] * 2
    assert ops.events == [] and ops.gauges_sent[-1]["gpufarm.enforce.applied_ops"] == 1.0


def test_a_disruption_budget_refusal_is_retried_with_backoff_and_reported() -> None:
    now = [1000.0]
    api, ops = Api(PDB, PDB, PDB, True), Ops()
    evictor = _evictor(api, ops, now)
    evictor.want([STOP])
    waits = []
    for _ in range(3):
        (refused,) = evictor.step()
        assert refused.outcome == "refused" and "disruption budget" in (refused.error or "")
        waits.append(evictor.due_in())
        assert evictor.step() == []  # not due yet
        now[0] += waits[-1] or 0.0
        evictor.want([STOP])  # still named each cycle: the backoff stands
    assert waits == [2.0, 4.0, 8.0]
    assert ops.gauges_sent[-1]["gpufarm.enforce.failed_ops"] == 1.0 and evictor.lag_seconds == 14.0
    assert ops.gauges_sent[-1]["gpufarm.enforce.lag_seconds"] == 6.0
    (done,) = evictor.step()
    assert done.outcome == "evicted" and len(api.calls) == 4
    assert ops.gauges_sent[-1] == {
        "gpufarm.enforce.lag_seconds": 0.0,
        "gpufarm.enforce.failed_ops": 0.0,
        "gpufarm.enforce.applied_ops": 1.0,
    }
    assert ops.events == [
        ("gpufarm could not evict a squatting pod", "warning"),
        ("gpufarm evicted a squatting pod", "success"),
    ]


def test_a_gone_pod_is_done_and_a_pod_no_longer_named_is_dropped() -> None:
    api, ops = Api(False, PDB), Ops()
    evictor = _evictor(api, ops)
    evictor.want([STOP])
    assert [e.outcome for e in evictor.step()] == ["gone"]
    evictor.want([STOP])
    assert evictor.step() == []
    other = PodStop("team-c", "other", DEV, SINCE)
    evictor.want([other])
    assert [e.outcome for e in evictor.step()] == ["refused"]
    evictor.want([])  # the episode ended (or the host was exempted): no retry, and the gauges clear
    assert evictor.due_in() == 0.0 and evictor.step() == []
    assert evictor.due_in() is None and api.calls == [("team-b", "intruder"), ("team-c", "other")]
    assert (
        ops.gauges_sent[-1]["gpufarm.enforce.failed_ops"] == 0.0
        and ops.gauges_sent[-1]["gpufarm.enforce.lag_seconds"] == 0.0
    )


def test_names_the_api_could_not_hold_are_never_sent_and_a_step_is_bounded() -> None:
    api = Api()
    evictor = _evictor(api)
    evictor.want([PodStop("Team_B", "x", DEV, SINCE), PodStop("ns", "../x", DEV, SINCE)])
    assert evictor.due_in() is None and api.calls == []
    evictor.want([PodStop("ns", f"pod-{i}", DEV, SINCE) for i in range(MAX_PER_STEP + 3)])
    assert len(evictor.step()) == MAX_PER_STEP
    assert len(evictor.step()) == 3


def test_the_gauges_and_tags_are_declared() -> None:
    ops = Ops()
    evictor = _evictor(Api(PDB), ops)
    evictor.want([STOP])
    evictor.step()
    declared = SPEC["enforce_metrics"]
    assert set(ops.gauges_sent[-1]) <= set(declared) and "kube_op:evict" in ops.tags
    for name in ops.gauges_sent[-1]:
        tags = declared[name]["tags"]
        assert {t.partition(":")[0] for t in ops.tags} <= set(tags["required"]) | set(tags.get("optional", []))
    for tag in ops.tags:
        key, _, value = tag.partition(":")
        assert re.match(SPEC["tags"][key]["value"], value), tag


class SlowNode:
    """A Node API whose every call takes a while; the evictions still run in the step's thread."""

    def __init__(self) -> None:
        self.node = {"metadata": {"name": "gpu-1", "labels": {}}, "spec": {"taints": []}}

    def get(self, name: str) -> dict[str, object]:
        time.sleep(0.05)
        return self.node

    def patch(self, name: str, body: object) -> None:
        time.sleep(0.05)


def test_evictions_run_in_the_steps_thread_and_wanting_one_costs_no_io() -> None:
    api = Api()
    thread_of: list[str] = []
    evict = api.evict

    def evict_here(namespace: str, name: str) -> bool:
        thread_of.append(threading.current_thread().name)
        return evict(namespace, name)

    api.evict = evict_here  # type: ignore[method-assign]
    evictor = PodEvictor(api, "gpu-1", backoff_first=0.05, backoff_max=0.1)
    marker = NodeMarker(SlowNode(), "gpu-1", evictions=evictor)
    marker.start()
    try:
        started = time.perf_counter()
        evictor.want([STOP])  # what the agent's cycle does
        assert time.perf_counter() - started < 0.01
        deadline = time.monotonic() + 5
        while not api.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.calls == [("team-b", "intruder")] and thread_of == ["gpufarm-node-kube"]
        assert marker.steps == 0  # no lease known yet: the Node is left alone meanwhile
    finally:
        marker.close()


@pytest.mark.parametrize("status", [429, 500, 503, 403])
def test_every_refusal_is_retried(status: int) -> None:
    api = Api(KubeApiError(f"HTTP {status}", status), True)
    now = [0.0]
    evictor = _evictor(api, None, now)
    evictor.want([STOP])
    assert evictor.step()[0].outcome == "refused"
    now[0] += 2
    assert evictor.step()[0].outcome == "evicted"
