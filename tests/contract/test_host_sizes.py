"""A pool's host sizes counted through the real client: host pages and Datadog's exact match count.

Charging decides on how many hosts of each (cluster, GPUs per host) a dedicated pool holds
(gpufarm.core.governance.charging). `Reads.host_sizes` counts them with a sample page and one exact count per size
instead of listing the pool; here the gateway's `host_page` runs against the sandbox, the census is compared with the
pool listed whole, and the sandbox's request counter shows what it cost. The recorded real answer carries the two fields
the count relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fakes import FakeClock, FakeIncidents
from helpers import http
from recorded import interactions, response_json

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.context.reads import CENSUS_SAMPLE, Reads, host_filter
from gpufarm.core.governance import charging
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm_node.tags import registration_tags

pytestmark = pytest.mark.contract

HOSTS = "Get all hosts with metadata deserializes successfully"


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    gw = DatadogGateway(settings)
    yield gw
    gw.close()


def _seed(sandbox_url: str) -> None:
    """A pool `hpc` of 240 H100 hosts: cluster a of 8-GPU hosts, cluster b of 4- and 8-GPU hosts; 5 A100 beside."""
    body: list[dict[str, Any]] = []
    for i in range(240):
        cluster, gpus = ("a", 8) if i < 120 else ("b", 4 if i % 2 else 8)
        tags = registration_tags("H100", gpus, "hpc", cluster)
        body.append({"name": f"hpc-{cluster}-{i:03d}", "tags": {"datadog": tags}, "reporting": True})
    for i in range(5):
        tags = registration_tags("A100", 8, "hpc", "a")
        body.append({"name": f"hpc-x-{i:03d}", "tags": {"datadog": tags}, "reporting": True})
    assert http(f"{sandbox_url}/_sandbox/hosts", "POST", {"hosts": body})[0] < 300


def _host_gets(sandbox_url: str) -> int:
    status, counts = http(f"{sandbox_url}/_sandbox/requests")
    assert status == 200
    return int(counts["by_endpoint"].get("GET /api/v1/hosts", 0))


def test_a_host_page_holds_its_count_and_says_how_many_match(gateway: DatadogGateway, sandbox_url: str) -> None:
    _seed(sandbox_url)
    pool = host_filter("hpc", gpu_model="H100")
    page = gateway.host_page(pool, 0, 7)
    assert len(page.hosts) == 7 and page.total == 240
    assert page.hosts[0].name == "hpc-a-000" and "gpu_count:8" in page.hosts[0].tags
    assert gateway.host_page(f"{pool} cluster:b gpu_count:4", 0, 1).total == 60
    assert gateway.host_page(host_filter("hpc", gpu_model="A100"), 0, 1).total == 5
    assert gateway.host_page(f"{pool} cluster:c gpu_count:8", 0, 1).total == 0
    for start, count in ((-1, 5), (0, 0), (0, 1001)):
        with pytest.raises(ValidationFailed):
            gateway.host_page(pool, start, count)


def test_the_census_through_the_client_is_the_pool_listed_whole(
    gateway: DatadogGateway, settings: Settings, sandbox_url: str
) -> None:
    _seed(sandbox_url)
    assert http(f"{sandbox_url}/_sandbox/requests", "DELETE")[0] == 200
    counted = Reads(FakeIncidents(FakeClock()), gateway).host_sizes("hpc", "H100")
    # A sample of cluster a, a probe into cluster b, one count per (cluster, size): no page of the whole pool.
    assert _host_gets(sandbox_url) == 2 + 3
    listed = (GpuHost.from_tags(h.name, h.tags) for h in gateway.list_hosts(host_filter("hpc")))
    want = charging.sizes_of(h for h in listed if h is not None and h.gpu_model == "H100")
    assert counted == want == {("a", 8): 120, ("b", 4): 60, ("b", 8): 60}
    assert CENSUS_SAMPLE < 240  # the census, not one sample holding the whole pool


def test_the_recorded_host_list_carries_the_exact_count_the_census_relies_on() -> None:
    (interaction,) = interactions("v1-hosts.json", HOSTS)
    body = response_json(interaction)
    assert body["exact_total_matching"] is True and isinstance(body["total_matching"], int)
    assert body["total_matching"] == len(body["host_list"])
