"""A lease on a pool Slurm enforces tells its holder how to submit into its reservation, in the allocation DM and in
`/gpu status`; a lease on any other pool says nothing of Slurm."""

from __future__ import annotations

import itertools
import json

from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.service import GpuFarm

USER = "U0000000001"
ENFORCED = (
    FARM_YAML.replace(
        "  hpc: {kind: dedicated, gpu_models: [H100]}", "  hpc: {kind: dedicated, gpu_models: [H100], enforce: slurm}"
    )
    + "enforcement:\n  slurm:\n    users: {U0000000001: alice}\n    accounts: {nlp: nlp, vision: vision}\n"
)
_ids = itertools.count(1)


def _farm(text: str) -> tuple[GpuFarm, FakeChat]:
    clock, hosts = FakeClock(), FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
        hosts.seed(f"cloud-{i}", "A100", 8, "cloud")
    chat = FakeChat(operators=frozenset({"U0000000009"}))
    return GpuFarm(incidents=FakeIncidents(clock), hosts=hosts, chat=chat, clock=clock, farm=parse_farm(text)), chat


def _allocated(svc: GpuFarm, environment: str, model: str = "H100", count: int = 8) -> int:
    values = {"gpu_count": str(count), "gpu_model": model, "environment": environment, "team": "nlp", "project": "p"}
    request = build_request(values, svc.context.farm, requester=USER, channel=None, request_id=f"e-{next(_ids):06d}")
    alloc, _ = svc.create_request(request)
    svc.decide_request(alloc.ir)
    svc.allocate(svc.allocation(alloc.ir))
    assert svc.allocation(alloc.ir).phase.value == "allocated"
    return alloc.ir


def test_the_dm_and_status_of_a_lease_on_a_slurm_pool_say_how_to_submit() -> None:
    svc, chat = _farm(ENFORCED)
    ir = _allocated(svc, "hpc")
    hint = f"sbatch --reservation=gpufarm-ir-{ir}"
    dms = [s for s in chat.sent if f"IR-{ir} is allocated" in s.text]
    assert dms and any(hint in json.dumps(s.blocks) for s in dms)
    status = svc.status(ir, USER)
    assert hint in json.dumps(status.blocks) and hint in status.text
    svc.release(ir, USER)
    assert hint not in svc.status(ir, USER).text


def test_a_lease_on_a_pool_nothing_enforces_says_nothing_of_slurm() -> None:
    svc, chat = _farm(ENFORCED)
    ir = _allocated(svc, "cloud", "A100")
    assert not any("--reservation" in json.dumps(s.blocks) for s in chat.sent)
    assert "--reservation" not in svc.status(ir, USER).text


KUBE = FARM_YAML.replace(
    "  hpc: {kind: dedicated, gpu_models: [H100]}", "  hpc: {kind: dedicated, gpu_models: [H100], enforce: kubernetes}"
)


def test_the_dm_and_status_of_a_lease_on_a_kubernetes_pool_give_the_toleration_and_selector() -> None:
    svc, chat = _farm(KUBE)
    ir = _allocated(svc, "hpc")
    toleration = f"key: gpufarm.io/lease\\n    operator: Equal\\n    value: ir-{ir}"
    dms = [s for s in chat.sent if f"IR-{ir} is allocated" in s.text]
    assert dms and any(toleration in json.dumps(s.blocks) for s in dms)
    status = svc.status(ir, USER)
    assert f"gpufarm.io/ir: ir-{ir}" in status.text and "nodeSelector" in status.text
    assert "--reservation" not in status.text


def test_a_lease_on_a_shared_kubernetes_pool_is_told_the_pod_label_and_no_toleration() -> None:
    text = KUBE.replace(
        "  slices: {kind: shared, gpu_models: [A100, L4]}",
        "  slices: {kind: shared, gpu_models: [A100, L4], enforce: kubernetes}",
    )
    svc, chat = _farm(text)
    svc.context.hosts.seed("slice-1", "A100", 8, "slices")  # type: ignore[attr-defined]
    ir = _allocated(svc, "slices", "A100", 2)
    status = svc.status(ir, USER)
    assert f"gpufarm.io/ir: ir-{ir}" in status.text and "squatter" in status.text
    assert "tolerations" not in status.text and "nodeSelector" not in status.text
    dms = [s for s in chat.sent if f"IR-{ir} is allocated" in s.text]
    assert dms and any(f"gpufarm.io/ir: ir-{ir}" in json.dumps(s.blocks) for s in dms)
