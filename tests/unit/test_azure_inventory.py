"""Azure as an inventory source, through azure-mgmt-compute on a stubbed azure-core transport (recorded answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufarm.adapters.azure_inventory import AzureInventorySource, gpu_model_of
from gpufarm.core.config.inventory import AzureInventory
from gpufarm_sandbox.azurestub import AzureFarm, StubCredential, StubTransport, Vm, recorded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "azure"
SUB = "00000000-0000-4000-8000-000000000001"
SUB2 = "00000000-0000-4000-8000-000000000002"
BASE = f"/subscriptions/{SUB}/providers/Microsoft.Compute"
ENVS = ("cloud", "hpc")


def files(**overrides: list[str]) -> dict[tuple[str, str], list[Path]]:
    routes = {
        (f"{BASE}/virtualMachines", ""): ["vms_page1.json"],
        (f"{BASE}/virtualMachines", "page2"): ["vms_page2.json"],
        (f"{BASE}/skus", "location eq 'eastus'"): ["skus_eastus.json"],
        (f"{BASE}/locations/eastus/usages", ""): ["usages_eastus.json"],
    }
    names = {"vms": (f"{BASE}/virtualMachines", ""), "usages": (f"{BASE}/locations/eastus/usages", "")}
    for key, answers in overrides.items():
        routes[names[key]] = answers
    return {key: [FIXTURES / name for name in answers] for key, answers in routes.items()}


def source(transport: StubTransport, **values: Any) -> AzureInventorySource:
    base: dict[str, Any] = {"subscriptions": [SUB], "locations": ["eastus"], "default_environment": "hpc"}
    settings = AzureInventory.model_validate(base | values)
    return AzureInventorySource(settings, ENVS, credential=StubCredential(), client_options={"transport": transport})


def test_gpu_vms_with_model_count_environment_and_family_quotas() -> None:
    transport = StubTransport(recorded(files()))
    reading = source(transport).read()
    assert reading.errors == ()
    nodes = {n.names[1]: n for n in reading.nodes}
    # Not listed: the D-series VM (no GPU size) and the VM in a location not configured.
    assert sorted(nodes) == ["nc-a100-01", "nc-t4-01", "nd-gb200-01", "nd-h100-01", "nv-a10-01"]
    h100 = nodes["nd-h100-01"]
    assert (h100.gpu_model, h100.gpu_count, h100.vcpus, h100.family) == ("H100", 8, 96, "standardNDSH100v5Family")
    assert (h100.environment, h100.cluster, h100.region) == ("cloud", "az-eus", "eastus")
    assert h100.id == "6f1c2a9e-4b7d-4c1a-9e2f-0a1b2c3d4e01" and h100.source == "azure"
    assert (nodes["nc-a100-01"].gpu_model, nodes["nc-a100-01"].environment) == ("A100", "hpc")  # the default
    assert nodes["nc-t4-01"].environment == "hpc"  # a tag naming no pool of the farm
    # A size without a GPU count in its SKU, and a size the SKUs do not list: unknown, not another model.
    assert nodes["nv-a10-01"].gpu_model is None and nodes["nd-gb200-01"].gpu_model is None
    quotas = {q.family: (q.limit, q.used, q.unit) for q in reading.quotas}
    assert quotas == {
        "standardNDSH100v5Family": (192.0, 96.0, "core"),
        "StandardNCADSA100v4Family": (96.0, 24.0, "core"),
        "standardNCASv3_T4Family": (24.0, 8.0, "core"),
    }
    # Two pages of VMs, one of SKUs, one of usage; nothing per VM.
    assert reading.calls == transport.calls == 4


def test_sizes_are_read_once_per_location() -> None:
    transport = StubTransport(recorded(files()))
    azure = source(transport)
    azure.read()
    second = azure.read()
    assert second.calls == 3 and len(second.nodes) == 5


def test_throttling_is_retried_within_the_retry_policy() -> None:
    transport = StubTransport(recorded(files(usages=["throttled.json", "usages_eastus.json"])))
    reading = source(transport, max_retries=2).read()
    assert reading.errors == () and len(reading.quotas) == 3
    assert transport.calls == 5


def test_throttling_past_the_retries_skips_the_part_and_keeps_the_rest() -> None:
    transport = StubTransport(recorded(files(usages=["throttled.json"])))
    reading = source(transport, max_retries=2).read()
    assert len(reading.nodes) == 5 and reading.quotas == ()
    (error,) = reading.errors
    assert (error.where, error.throttled) == (f"{SUB}/eastus", True)
    assert error.message.startswith("usage: HttpResponseError 429")
    assert transport.calls == 3 + 3  # the VMs and SKUs, then the usage tried 1 + 2 times


def test_a_subscription_that_fails_is_skipped_and_the_others_still_count() -> None:
    healthy = AzureFarm(SUB2, vms=[Vm("nd-1", "Standard_ND96isr_H100_v5", tags={"gpufarm-environment": "cloud"})])
    broken = files()
    both = recorded(broken)

    def answer(method: str, path: str, query: Any) -> Any:
        if path.startswith(f"/subscriptions/{SUB2}/"):
            return healthy.answer(method, path, query)
        if path == f"{BASE}/virtualMachines":
            return 500, {"error": {"code": "InternalServerError", "message": "boom"}}, {}
        return both(method, path, query)

    transport = StubTransport(answer)
    reading = source(transport, subscriptions=[SUB, SUB2], max_retries=0).read()
    assert [n.names[1] for n in reading.nodes] == ["nd-1"]
    assert [e.where for e in reading.errors] == [SUB]
    assert not reading.errors[0].throttled


def test_a_generated_subscription_pages_its_vms() -> None:
    farm = AzureFarm(SUB, vms=[Vm(f"vm-{i}", "Standard_NC24ads_A100_v4") for i in range(450)])
    farm.limits = {"standardNCADSA100v4Family": 12_000}
    reading = source(farm.transport).read()
    assert len(reading.nodes) == 450 and all(n.gpu_model == "A100" for n in reading.nodes)
    assert reading.calls == 3 + 1 + 1  # 200 VMs a page, the SKUs, the usage
    (quota,) = [q for q in reading.quotas if q.family == "standardNCADSA100v4Family"]
    assert (quota.limit, quota.used) == (12_000, 450 * 24)


@pytest.mark.parametrize(
    ("size", "model"),
    [
        ("Standard_ND96isr_H100_v5", "H100"),
        ("Standard_NC40ads_H100_v5", "H100"),
        ("Standard_ND96amsr_A100_v4", "A100"),
        ("Standard_ND96asr_v4", "A100"),
        ("Standard_NC24s_v3", "V100"),
        ("Standard_NV36ads_A10_v5", "A10"),
        ("Standard_NC8as_T4_v3", "T4"),
        ("Standard_ND96isr_MI300X_v5", "MI300X"),
        ("Standard_NC99zz_v9", None),
    ],
)
def test_gpu_models_from_size_names(size: str, model: str | None) -> None:
    assert gpu_model_of(size) == model


def test_a_fifth_of_requests_throttled_is_absorbed_by_the_retry_policy() -> None:
    farm = AzureFarm(SUB, vms=[Vm(f"vm-{i}", "Standard_ND96isr_H100_v5") for i in range(450)], throttle=0.2, seed=7)
    reading = source(farm.transport, max_retries=3).read()
    assert reading.errors == () and len(reading.nodes) == 450
    assert farm.transport.calls > reading.calls  # some requests were throttled and retried
