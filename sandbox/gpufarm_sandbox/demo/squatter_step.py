"""The slicing stage's squatter step: a real process squats a leased slice; gpufarm tells once, then stops it.

A child process of the demo, put on the busy lease's slice claiming another lease (`GPUFARM_IR=IR-999`), is what
the real gpufarm-node on the sliced host finds a squatter; the squatter monitor `datadog apply` made alerts on the
sandbox clock, and its webhook posts once to the operators' channel and once to the lease's holder. A replay of
that very notification posts nothing more. The pool runs `squatters: {policy: stop-after, grace: 10m}`
(config/farm.example.yaml): the monitor's re-notification past the grace publishes the stop on the host, the agent
sends the child SIGTERM, the device is clean again, the monitor recovers and the episode ends (its stop lifted).
Beside the process, a pod labelled for another lease holds the slice (the pool is `enforce: kubernetes`;
gpufarm_sandbox.demo.squatter_pod): it is reported in the same episode and, under the same stop, evicted through
the Kubernetes Eviction API by the agent's Kubernetes step.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel import history
from gpufarm_sandbox.demo import squatter_pod
from gpufarm_sandbox.example_farm import BOB, OPERATORS_CHANNEL

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
    from gpufarm_sandbox.simfarm import SimulatedFarm

CLAIMS = "IR-999"
# Simulated minutes to wait for the first post (an agent cycle and a monitor evaluation, with slack), for the stop
# (grace + re-notification + slack) and for the recovery (the monitor's five-minute window + slack).
TOLD_LIMIT_MIN = 10
STOP_LIMIT_MIN = 30
CLEAR_LIMIT_MIN = 15


def run(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, *, host: str, slot: str, ir: int) -> None:
    """Squat IR-`ir`'s slice `slot` on `host` with a real child process, and follow it to its stop."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pod: squatter_pod.SquattingPod | None = None
    try:
        uuid = nodes.squat(host, slot, child.pid, CLAIMS).lower()
        pod = squatter_pod.SquattingPod(ctx, nodes, host=host, uuid=uuid)
        if _told_once(ctx, farm, nodes, ir=ir, uuid=uuid, pid=child.pid) and _replay_posts_nothing(ctx, farm, uuid):
            _stopped(ctx, farm, nodes, host=host, ir=ir, uuid=uuid, child=child, pod=pod)
    finally:
        if pod is not None:
            pod.close()
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def _squatter_posts(farm: LocalFarm, uuid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ops = [m for m in farm.messages(channel=OPERATORS_CHANNEL, contains="squatter") if uuid in _text(m)]
    dms = [m for m in farm.messages(user=BOB.id, kind="dm") if uuid in _text(m) and "runs on" in _text(m)]
    return ops, dms


def _told_once(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, *, ir: int, uuid: str, pid: int) -> bool:
    with ctx.step(f"A process claiming {CLAIMS} starts on IR-{ir}'s slice: gpufarm tells once"):
        minutes = 0
        while minutes < TOLD_LIMIT_MIN and not _squatter_posts(farm, uuid)[0]:
            farm.minute(nodes)
            minutes += 1
        farm.wait_for(lambda: bool(_squatter_posts(farm, uuid)[1]), timeout=10)
        ops, dms = _squatter_posts(farm, uuid)
        ctx.check(
            len(ops) == 1 and len(dms) == 1,
            "one post to the operators' channel and one DM to the lease's holder",
            f"{minutes} min after it started",
        )
        ctx.check(
            bool(ops) and f"pid {pid}" in _text(ops[0]) and f"IR-{ir}" in _text(ops[0]),
            "the post names the host, the device, the process, its user and the hurt lease",
            str(ops[0]["text"])[:110] if ops else "no post",
        )
        ctx.check(
            bool(ops) and squatter_pod.NAME in _text(ops[0]),
            f"and the pod {squatter_pod.NAMESPACE}/{squatter_pod.NAME} labelled for another lease on the same slice",
        )
        ctx.check(
            bool(dms) and "stopped (SIGTERM to a process, eviction of a pod) at" in _text(dms[0]),
            "under stop-after the notice says when it will be stopped",
        )
        lease = farm.allocation(ir)
        return ctx.check(
            any(uuid in e for e in lease.squatters),
            "the episode is kept on the lease",
            lease.squatters[0] if lease.squatters else "",
        )


def _replay_posts_nothing(ctx: DemoContext, farm: LocalFarm, uuid: str) -> bool:
    with ctx.step("Datadog delivers the same notification again: nothing more is posted"):
        deliveries = farm.get("/_sandbox/webhooks/deliveries")["deliveries"]
        payload = next(
            (
                d["payload"]
                for d in reversed(deliveries)
                if d["webhook"] == "gpufarm-idle" and '"Triggered"' in d["payload"] and uuid in d["payload"]
            ),
            None,
        )
        if not ctx.check(payload is not None, "the squatter monitor's notification reached the idle webhook"):
            return False
        before = _squatter_posts(farm, uuid)
        token = {"X-Gpufarm-Token": farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
        status, _ = farm.post("/fn/idle_alert/", json.loads(str(payload)), token)
        farm.settle()
        after = _squatter_posts(farm, uuid)
        return ctx.check(
            status in (200, 202) and [len(x) for x in after] == [len(x) for x in before],
            "the replay is answered and posts nothing",
            f"HTTP {status}",
        )


def _stopped(
    ctx: DemoContext,
    farm: LocalFarm,
    nodes: SimulatedFarm,
    *,
    host: str,
    ir: int,
    uuid: str,
    child: subprocess.Popen[bytes],
    pod: squatter_pod.SquattingPod,
) -> None:
    with ctx.step("Past its 10 min grace the squatters are stopped: the process gets SIGTERM, the pod is evicted"):
        minutes = 0
        while minutes < STOP_LIMIT_MIN and child.poll() is None:
            farm.minute(nodes)
            minutes += 1
        try:
            code = child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        ctx.check(code == -signal.SIGTERM, "the real process ended on SIGTERM", f"{minutes} min after the notice")
        evicted = farm.wait_for(pod.evicted, timeout=10)
        ctx.check(
            evicted and not pod.evictor.lag_seconds,
            f"the pod {squatter_pod.NAMESPACE}/{squatter_pod.NAME} was evicted (Eviction API, 201), once",
            f"{ctx.sandbox.kube_pods.evictions} eviction call(s)",
        )
        if evicted:
            pod.gone()  # kubelet, once the pod terminated, no longer gives it the slice
        steps = _steps(farm, ir)
        ctx.check("squatter-stopped" in steps, f"IR-{ir}'s history records the stop", ", ".join(steps))
        told = farm.messages(channel=OPERATORS_CHANNEL, contains="stopping the squatter")
        ctx.check(len(told) == 1, "the operators and the holder are told of the stop")
    with ctx.step("The device is clean: the monitor recovers and the episode ends"):
        minutes = 0
        while minutes < CLEAR_LIMIT_MIN and farm.allocation(ir).squatters:
            farm.minute(nodes)
            minutes += 1
        tags = [t for t in farm.user_tags(host) if t.startswith("gpufarm_stop:")]
        ctx.check(not farm.allocation(ir).squatters and not tags, "episode closed, stop tag lifted", f"{minutes} min")


def _steps(farm: LocalFarm, ir: int) -> list[str]:
    lease = farm.allocation(ir)
    return [e.step for line in lease.history if (e := history.parse(line)) is not None and e.step.startswith("squat")]


def _text(message: dict[str, Any]) -> str:
    return str(message["text"]) + json.dumps(message.get("blocks", []))
