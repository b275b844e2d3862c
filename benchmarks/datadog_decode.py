"""Bulk reads through datadog-api-client: its typed models against gpufarm's own JSON decoding, and IR lookups.

Against a sandbox in its own process (so only the client's work is on this process's CPU clock), seeded with
`--incidents` live incidents of gpufarm's type and `--hosts` hosts, it reads every incident (search pages of 100)
and every host (pages of 1,000) four ways and prints CPU and wall seconds for each:
- typed: the client's models with return-type checks (what the gateway did before), then gpufarm's conversion;
- unchecked: the same with `check_return_type=False`;
- raw: the gateway as it is (`preload_content=False`, the JSON decoded by gpufarm);
- fetch: plain HTTP and `json.loads`, the floor.
Then it counts the calls (with the sandbox's request counter) and times `get_by_ir` at a small and a large number
of live incidents, from a container that never saw the incident and from one that did. Last, a rate-limited burst:
`--burst` incident reads under an incidents budget of `--limit` per second, from one container and from four at once
(each its own gateway): calls, 429s the sandbox sent, how many succeeded, wall seconds.

Run: .venv/bin/python benchmarks/datadog_decode.py [--incidents 3000] [--hosts 20000] [--small 10] [--burst 100]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from typing import Any

from datadog_api_client import ApiClient, Configuration
from datadog_api_client.v1.api.hosts_api import HostsApi
from datadog_api_client.v2.api.incidents_api import IncidentsApi

from gpufarm.adapters import datadog as dd
from gpufarm.adapters import datadog_client as dc
from gpufarm.adapters import datadog_incidents as di
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.search import LIVE_QUERY
from gpufarm.setup.plan import INCIDENT_TYPE_DESCRIPTION, desired_fields
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
from gpufarm_sandbox.process import control, free_port, start_sandbox

warnings.filterwarnings("ignore", message="Using unstable operation")
KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
VALID_VALUES = {"team": ["nlp", "vision"], "gpu_model": ["H100", "A100"], "environment": ["onprem-hpc", "cloud"]}


def seed(url: str, type_id: str, incidents: int, hosts: int, first_incident: int = 0) -> None:
    """Live incidents of gpufarm's type over one keep-alive connection; hosts through `/_sandbox/hosts`."""
    parsed = urllib.parse.urlsplit(url)
    connection = HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=60)
    try:
        for n in range(first_incident, first_incident + incidents):
            fields = f.encode_fields(
                {
                    f.STATE: "stable",
                    f.PHASE: "allocated",
                    f.TEAM: VALID_VALUES["team"][n % 2],
                    f.PROJECT: f"project-{n % 40}",
                    f.GPU_MODEL: "H100",
                    f.GPU_COUNT: 8,
                    f.ENVIRONMENT: "onprem-hpc",
                    f.REQUESTER: f"U{n:010d}",
                    f.REQUEST_ID: f"req-{n:08d}",
                    f.HOSTS: [f"gpu-node-{n:05d}"],
                }
            )
            attributes = {
                "title": f"GPU request {n}",
                "customer_impacted": False,
                "incident_type_uuid": type_id,
                "fields": fields,
            }
            body = json.dumps({"data": {"type": "incidents", "attributes": attributes}})
            connection.request("POST", "/api/v2/incidents", body, {"Content-Type": "application/json", **KEYS})
            answer = connection.getresponse()
            text = answer.read()
            if answer.status != 201:
                raise SystemExit(f"seeding incident {n} failed: {answer.status} {text[:200]!r}")
    finally:
        connection.close()
    batch = 5000
    for start in range(0, hosts, batch):
        control(
            url,
            "/_sandbox/hosts",
            "POST",
            {
                "hosts": [
                    {
                        "name": f"gpu-node-{i:05d}",
                        "tags": {
                            "datadog": ["gpu_model:h100", "gpu_count:8", f"cluster:c{i % 7}"],
                            "user": ["gpufarm:managed", "environment:onprem-hpc"]
                            + ([f"ir:ir-{i + 1}"] if i < 3000 else []),
                        },
                    }
                    for i in range(start, min(hosts, start + batch))
                ]
            },
        )


def measure(run: Callable[[], int]) -> tuple[float, float, int]:
    """CPU seconds of this process, wall seconds and the count `run` returns."""
    cpu, wall = time.process_time(), time.perf_counter()
    count = run()
    return time.process_time() - cpu, time.perf_counter() - wall, count


def client_for(url: str, *, check: bool) -> ApiClient:
    """The client as the gateway configured it, with or without return-type checks."""
    cfg: Any = Configuration(host=url, check_return_type=check)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    cfg.unstable_operations["search_incidents"] = True
    return ApiClient(cfg)


def typed_incidents(client: ApiClient, query: str) -> Iterator[Any]:
    """Every search page through the client's models, converted as the gateway did before."""
    api, offset = IncidentsApi(client), 0
    while True:
        answer = api.search_incidents(query=query, page_size=100, page_offset=offset)
        # Without return-type checks the client leaves nested objects as dicts: read both alike.
        page = list(dc.get(dc.get(dc.get(answer, "data"), "attributes"), "incidents") or [])
        for item in page:
            yield di._record(dc.plain_dict(dc.get(item, "data")))
        offset += len(page)
        if len(page) < 100:
            return


def typed_hosts(client: ApiClient) -> Iterator[Any]:
    """Every host page through the client's models, converted as the gateway did before."""
    api, start = HostsApi(client), 0
    while True:
        page = list(dc.get(api.list_hosts(start=start, count=1000), "host_list") or [])
        for host in page:
            yield dd._host_info(host)
        start += len(page)
        if len(page) < 1000:
            return


def fetched(url: str, path: str, pages: Callable[[Any], tuple[int, bool]]) -> int:
    """Plain HTTP pages decoded by json.loads only: the floor under any client."""
    parsed = urllib.parse.urlsplit(url)
    connection = HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=120)
    total, offset = 0, 0
    try:
        while True:
            connection.request("GET", path.format(offset=offset), headers=KEYS)
            body = json.loads(connection.getresponse().read())
            got, more = pages(body)
            total += got
            offset += got
            if not more:
                return total
    finally:
        connection.close()


def decode_figures(url: str, settings: Settings, type_id: str) -> None:
    """Typed, unchecked, raw and fetch-only reads of every incident and every host."""
    query = f"incident_type:{type_id} AND ({LIVE_QUERY.text()})"
    search_path = f"/api/v2/incidents/search?query={urllib.parse.quote(query)}&page[size]=100&page[offset]={{offset}}"

    def search_page(body: Any) -> tuple[int, bool]:
        got = len(body["data"]["attributes"]["incidents"])
        return got, got == 100

    def host_page(body: Any) -> tuple[int, bool]:
        got = len(body["host_list"])
        return got, got == 1000

    gateway = DatadogGateway(settings, incident_type_id=type_id)
    with client_for(url, check=True) as checked, client_for(url, check=False) as unchecked:
        rows = {
            "incidents": {
                "typed": lambda: sum(1 for _ in typed_incidents(checked, query)),
                "unchecked": lambda: sum(1 for _ in typed_incidents(unchecked, query)),
                "raw (gateway)": lambda: sum(1 for _ in gateway.search(LIVE_QUERY)),
                "fetch only": lambda: fetched(url, search_path, search_page),
            },
            "hosts": {
                "typed": lambda: sum(1 for _ in typed_hosts(checked)),
                "unchecked": lambda: sum(1 for _ in typed_hosts(unchecked)),
                "raw (gateway)": lambda: sum(1 for _ in gateway.list_hosts()),
                "fetch only": lambda: fetched(url, "/api/v1/hosts?count=1000&start={offset}", host_page),
            },
        }
        print(f"{'read':<10} {'path':<14} {'records':>8} {'CPU s':>8} {'wall s':>8} {'CPU x raw':>10}")
        for read, paths in rows.items():
            results = {name: measure(run) for name, run in paths.items()}
            raw_cpu = results["raw (gateway)"][0] or 1e-9
            for name, (cpu, wall, count) in results.items():
                print(f"{read:<10} {name:<14} {count:>8} {cpu:>8.2f} {wall:>8.2f} {cpu / raw_cpu:>10.1f}")
    gateway.close()


def ir_figures(url: str, settings: Settings, type_id: str, live: int) -> None:
    """Calls and milliseconds of get_by_ir at `live` live incidents: an unseen IR, then the same IR again."""
    newest = live
    recent = max(1, live - 5)
    gateway = DatadogGateway(settings, incident_type_id=type_id)
    try:
        for label, ir in (("unseen recent IR", recent), ("indexed IR", newest), ("same IR again", recent)):
            control(url, "/_sandbox/requests", "DELETE")
            started = time.perf_counter()
            record = gateway.get_by_ir(ir)
            ms = (time.perf_counter() - started) * 1000
            assert record.public_id == ir
            calls = control(url, "/_sandbox/requests")["total"]
            print(f"get_by_ir  {live:>6} live  {label:<17} {calls:>3} calls {ms:>8.1f} ms")
    finally:
        gateway.close()


def _reads(gateway: DatadogGateway, count: int, done: list[int], errors: list[str]) -> None:
    for _ in range(count):
        try:
            done.append(gateway.get_by_ir(1).public_id)
        except Exception as exc:  # counted and printed: the figure is how many succeed
            errors.append(type(exc).__name__)


def burst_figures(url: str, settings: Settings, type_id: str, calls: int, limit: int) -> None:
    """`calls` get_by_ir (one GET each) under an incidents budget of `limit` a second, from 1 and from 4 gateways."""
    for containers in (1, 4):
        gateways = [DatadogGateway(settings, incident_type_id=type_id) for _ in range(containers)]
        for gateway in gateways:
            assert gateway.get_by_ir(1).public_id == 1  # indexed from here on: one GET per lookup
        control(url, "/_sandbox/ratelimits", "POST", {"groups": {"incidents": {"limit": limit, "period": 1}}})
        done: list[int] = []
        errors: list[str] = []

        share = calls // containers
        threads = [threading.Thread(target=_reads, args=(gw, share, done, errors)) for gw in gateways]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        refused = control(url, "/_sandbox/ratelimits")["groups"]["incidents"]["refused"]
        control(url, "/_sandbox/ratelimits", "DELETE")
        held = sum(gw.rate_limits.waited_s for gw in gateways)
        print(
            f"burst      {containers} container(s) {share * containers:>4} calls at {limit}/s: {refused:>3} 429s, "
            f"{len(done)} succeeded, {len(errors)} failed, {wall:.1f} s wall, {held:.1f} s held before sending"
        )
        for gateway in gateways:
            gateway.close()


def main() -> None:
    """Seed the sandbox, then print the decode and IR lookup figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--incidents", type=int, default=3000)
    parser.add_argument("--hosts", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=10, help="live incidents for the small IR lookup figure")
    parser.add_argument("--burst", type=int, default=100, help="calls in the rate-limited burst")
    parser.add_argument("--limit", type=int, default=20, help="incidents budget per second during the burst")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    port = free_port()
    proc, _ = start_sandbox(port)
    url = f"http://127.0.0.1:{port}"
    os.environ.update({"GPUFARM_DATADOG_HOST": url, "DD_API_KEY": DEFAULT_DD_API_KEY, "DD_APP_KEY": DEFAULT_DD_APP_KEY})
    settings = Settings(max_retries=1, http_timeout=120)
    try:
        admin = DatadogAdmin(settings)
        made = admin.create_incident_type(settings.incident_type, INCIDENT_TYPE_DESCRIPTION)
        type_id = str(made["id"])
        for _, attributes in desired_fields(VALID_VALUES):
            assert attributes is not None
            admin.create_field_definition(attributes, type_id)
        admin.close()
        small = min(args.small, args.incidents)
        seed(url, type_id, small, 0)
        ir_figures(url, settings, type_id, small)
        burst_figures(url, settings, type_id, args.burst, args.limit)
        started = time.perf_counter()
        seed(url, type_id, args.incidents - small, args.hosts, first_incident=small)
        print(f"seeded {args.incidents} incidents and {args.hosts} hosts in {time.perf_counter() - started:.0f} s")
        ir_figures(url, settings, type_id, args.incidents)
        decode_figures(url, settings, type_id)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
