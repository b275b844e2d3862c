"""Sandbox throughput through the real datadog-api-client: incident and host-tag round trips, host listing,
metric intake, and the sandbox process's start-up time and peak RSS.

Run: .venv/bin/python benchmarks/sandbox.py [--iterations 200] [--hosts 10000] [--points 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
import warnings
from pathlib import Path

from datadog_api_client import ApiClient, Configuration
from datadog_api_client.v1.api.hosts_api import HostsApi
from datadog_api_client.v1.api.tags_api import TagsApi
from datadog_api_client.v1.model.host_tags import HostTags
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from datadog_api_client.v2.api.metrics_api import MetricsApi
from datadog_api_client.v2.model.incident_create_attributes import IncidentCreateAttributes
from datadog_api_client.v2.model.incident_create_data import IncidentCreateData
from datadog_api_client.v2.model.incident_create_request import IncidentCreateRequest
from datadog_api_client.v2.model.incident_field_attributes_single_value import IncidentFieldAttributesSingleValue
from datadog_api_client.v2.model.incident_field_attributes_single_value_type import (
    IncidentFieldAttributesSingleValueType,
)
from datadog_api_client.v2.model.incident_type import IncidentType
from datadog_api_client.v2.model.incident_update_attributes import IncidentUpdateAttributes
from datadog_api_client.v2.model.incident_update_data import IncidentUpdateData
from datadog_api_client.v2.model.incident_update_request import IncidentUpdateRequest
from datadog_api_client.v2.model.metric_content_encoding import MetricContentEncoding
from datadog_api_client.v2.model.metric_intake_type import MetricIntakeType
from datadog_api_client.v2.model.metric_payload import MetricPayload
from datadog_api_client.v2.model.metric_point import MetricPoint
from datadog_api_client.v2.model.metric_resource import MetricResource
from datadog_api_client.v2.model.metric_series import MetricSeries

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
from gpufarm_sandbox.process import free_port, start_sandbox

warnings.filterwarnings("ignore", message="Using unstable operation")


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def configuration(url: str) -> Configuration:
    """The real client aimed at the sandbox, incident operations enabled."""
    cfg = Configuration(host=url)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    for name in ("create_incident", "update_incident"):
        cfg.unstable_operations[name] = True
    return cfg


def bench_round_trips(client: ApiClient, iterations: int) -> dict[str, float]:
    """Create an incident, patch it, tag a host: each timed separately."""
    incidents, tags = IncidentsApi(client), TagsApi(client)
    timings = {"incident_create": 0.0, "incident_patch": 0.0, "host_tag_add": 0.0}
    for i in range(iterations):
        t0 = time.perf_counter()
        created = incidents.create_incident(
            IncidentCreateRequest(
                data=IncidentCreateData(
                    type=IncidentType.INCIDENTS,
                    attributes=IncidentCreateAttributes(title=f"bench {i}", customer_impacted=False),
                )
            )
        )
        t1 = time.perf_counter()
        incidents.update_incident(
            created.data.id,
            IncidentUpdateRequest(
                data=IncidentUpdateData(
                    id=created.data.id,
                    type=IncidentType.INCIDENTS,
                    attributes=IncidentUpdateAttributes(
                        fields={
                            "state": IncidentFieldAttributesSingleValue(
                                type=IncidentFieldAttributesSingleValueType.DROPDOWN, value="stable"
                            )
                        }
                    ),
                )
            ),
        )
        t2 = time.perf_counter()
        tags.create_host_tags(f"bench-host-{i % 50}", HostTags(host=f"bench-host-{i % 50}", tags=[f"ir:ir-{i + 1}"]))
        t3 = time.perf_counter()
        timings["incident_create"] += t1 - t0
        timings["incident_patch"] += t2 - t1
        timings["host_tag_add"] += t3 - t2
    return {name: iterations / total for name, total in timings.items()}


def bench_hosts(url: str, client: ApiClient, count: int) -> tuple[float, float, int]:
    """Seed `count` hosts, then list them all through list_hosts pages of 1000."""
    hosts = [
        {"name": f"gpu-node-{i:05d}", "tags": {"user": ["gpufarm:managed", "gpu_model:h100", "gpu_count:8"]}}
        for i in range(count)
    ]
    t0 = time.perf_counter()
    request = urllib.request.Request(
        f"{url}/_sandbox/hosts",
        data=json.dumps({"hosts": hosts}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60):
        pass
    seeded = time.perf_counter() - t0
    api = HostsApi(client)
    listed, start = 0, 0
    t1 = time.perf_counter()
    while True:
        page = api.list_hosts(start=start, count=1000)
        got = len(page.host_list)
        listed += got
        start += got
        if got < 1000:
            break
    return seeded, time.perf_counter() - t1, listed


def bench_series(client: ApiClient, points: int) -> tuple[float, int, int]:
    """Submit `points` points as 1000-point gzip batches (100 series x 10 points), as the node agent batches them."""
    api = MetricsApi(client)
    now = int(time.time())
    per_series, series_per_batch = 10, 100
    batches = points // (per_series * series_per_batch)
    sent = 0
    t0 = time.perf_counter()
    for b in range(batches):
        series = [
            MetricSeries(
                metric="gpufarm.gpu.utilization",
                type=MetricIntakeType.GAUGE,
                points=[
                    MetricPoint(timestamp=now - 600 + p * 15, value=float((b + s + p) % 100)) for p in range(per_series)
                ],
                resources=[MetricResource(name=f"gpu-node-{(b * series_per_batch + s) % 1000:05d}", type="host")],
                tags=[f"gpu:{s % 8}"],
            )
            for s in range(series_per_batch)
        ]
        api.submit_metrics(MetricPayload(series=series), content_encoding=MetricContentEncoding.GZIP)
        sent += per_series * series_per_batch
    return time.perf_counter() - t0, sent, batches


def main() -> None:
    """Run every benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    port = free_port()
    proc, ready_s = start_sandbox(port)
    url = f"http://127.0.0.1:{port}"
    try:
        with ApiClient(configuration(url)) as client:
            rates = bench_round_trips(client, args.iterations)
            seeded, listed_s, listed = bench_hosts(url, client, args.hosts)
            series_s, sent, batches = bench_series(client, args.points)
        rss = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"sandbox process ready in          {ready_s * 1000:8.0f} ms")
    for name, rate in rates.items():
        print(f"{name:<33} {rate:8.0f} round trips/s ({args.iterations} through datadog-api-client)")
    print(f"seed {args.hosts} hosts                 {seeded * 1000:8.0f} ms")
    print(f"list {listed} hosts (pages of 1000)  {listed_s * 1000:8.0f} ms")
    print(f"submit {sent} points ({batches} gzip batches) {series_s * 1000:8.0f} ms = {sent / series_s:,.0f} points/s")
    print(f"sandbox peak RSS                  {rss:8.1f} MB")


if __name__ == "__main__":
    main()
