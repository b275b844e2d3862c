"""The approval card's utilisation query (gpufarm.core.chat.cards) through the real Datadog adapter, against the
sandbox: the node agent's per-device series, grouped by the IR it attributes them to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.leases import operators

pytestmark = pytest.mark.contract


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    gw = DatadogGateway(settings)
    yield gw
    gw.close()


def _lease(ir: int) -> Allocation:
    return Allocation(incident_id=str(ir), ir=ir, title="t", state="stable", phase="allocated", hosts=("gpu-a",))


def test_the_card_reads_each_leases_mean_utilisation_over_seven_days(gateway: DatadogGateway) -> None:
    now = int(time.time())
    values = {("gpu-a", "0", "ir-4"): 80.0, ("gpu-a", "1", "ir-4"): 40.0, ("gpu-b", "0", "ir-9"): 3.0}
    gateway.submit(
        [
            MetricSeries(
                "gpufarm.gpu.utilization",
                tuple(MetricPoint(now - 3600 * k, v) for k in range(6)),
                tags=(f"node:{host}", f"device:{device}", f"gpu_ir:{ir}"),
                host=host,
                unit="percent",
            )
            for (host, device, ir), v in values.items()
        ]
    )
    text = operators.utilisation(gateway, [_lease(4), _lease(9), _lease(12)], datetime.fromtimestamp(now + 60, UTC))
    assert text == "mean 32 % over 7 days (IR-4 60 %, IR-9 3 %)"


def test_a_lease_without_series_is_said_so(gateway: DatadogGateway) -> None:
    now = datetime.fromtimestamp(time.time(), UTC)
    assert operators.utilisation(gateway, [_lease(77)], now) == "no utilisation measured over 7 days"
