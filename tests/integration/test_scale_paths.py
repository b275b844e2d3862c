"""Reads per path do not grow with leases and hosts the path has no business with; a sync that finds nothing writes
nothing, and one that finds drift writes each drifted host's tags once and each repaired lease's history once.

A CI-sized farm of gpufarm_sandbox.scalefarm (200 hosts, 30 leases, through the runtime's real clients against
the sandbox, counted by its request counter) is measured, then 1,200 hosts and 150 leases of other pools are
added and it is measured again: the request, approval and release paths of the first pool, and that pool's
repair, make exactly as many requests as before. Unnarrowed, the live search would take a second page at 180
leases and the host list a second page at 1,400 hosts. benchmarks/scale.py runs the same at 20,000 / 3,000.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufarm.handlers import runtime
from gpufarm_sandbox import scalefarm
from gpufarm_sandbox.scalefarm import FarmPath, PoolShare

OTHER_POOLS = (
    PoolShare("cloud-aws", "dedicated", "A100", 0.6, 0.6, ("aws-usw2",)),
    PoolShare("shared-slices", "shared", "L4", 0.4, 0.4, ("k8s-shared",)),
)


@pytest.fixture
def api(sandbox_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[scalefarm.Api]:
    farm_file = tmp_path / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml())
    for name, value in scalefarm.environment(sandbox_url, farm_file).items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    client = scalefarm.Api(sandbox_url)
    scalefarm.prepare(client)
    yield client
    runtime.reset()


def _reads(paths: dict[str, FarmPath]) -> dict[str, object]:
    repair = [c for c in paths["sync"].calls if c.name == "repair onprem-hpc"]
    return {
        "request": paths["request"].total("reads"),
        "approval": paths["approval"].total("reads"),
        "release": paths["release"].total("reads"),
        "onprem repair": [c.reads for c in repair],
    }


def _assert_drift_repaired(drift: FarmPath, *, hosts: int, leases: int) -> None:
    """One host-tag write per drifted host and one incident write (its "repaired" history entry) per lease.

    Of the two drifted hosts one lost its lease's tags and one carries a stray incident's: both are re-tagged, and
    only the lease gets an entry in its history (gpufarm.core.kernel.history), one for the sync whatever its hosts.
    """
    assert drift.expected == {"host_writes": hosts, "incident_writes": leases}
    assert drift.total("host_writes") == hosts
    assert drift.total("incident_writes") == leases
    assert drift.total("writes") == hosts + leases  # nothing else is written
    patched = sum(c.by_endpoint.get("PATCH /api/v2/incidents/<incident_id>", 0) for c in drift.calls)
    assert patched == leases


def test_reads_per_path_do_not_grow_with_unrelated_leases_and_a_quiet_sync_writes_nothing(api: scalefarm.Api) -> None:
    plan = scalefarm.layout(200, 30)
    scalefarm.seed(api, plan)
    before = scalefarm.measure(api, plan, tag="before")

    scalefarm.seed(api, scalefarm.layout(1200, 150, pools=OTHER_POOLS, prefix="other-"))
    after = scalefarm.measure(api, plan, tag="after")

    assert _reads(after) == _reads(before)
    for paths in (before, after):
        # Allocated, then released: the hosts were tagged and untagged (one write each, plus the re-checks).
        assert paths["approval"].total("writes") >= 3
        assert paths["release"].total("writes") >= 3
        assert paths["sync"].total("writes") == 0
        assert all(c.reads <= 3 for c in paths["sync"].calls if c.name.startswith("repair"))
        _assert_drift_repaired(paths["drift"], hosts=2, leases=1)


def test_a_large_pool_is_repaired_in_shards_that_each_touch_only_their_hosts(
    api: scalefarm.Api, monkeypatch: pytest.MonkeyPatch
) -> None:

    from gpufarm.core.sync import repair

    monkeypatch.setattr(repair, "SHARD_HOSTS", 40)
    plan = scalefarm.layout(200, 30)
    scalefarm.seed(api, plan)
    paths = scalefarm.measure(api, plan, tag="shards")

    repairs = [c.name for c in paths["sync"].calls if c.name.startswith("repair onprem-hpc")]
    assert repairs == [f"repair onprem-hpc {i}/3" for i in range(1, 4)]  # 100 hosts in shards of about 40
    assert paths["sync"].total("writes") == 0
    _assert_drift_repaired(paths["drift"], hosts=2, leases=1)
