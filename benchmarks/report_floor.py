"""The floor `benchmarks/report.py` measures `gpufarm report` against: a plain reader of the same requests.

It replays the requests the report makes (the incident type lookup, then each search's pages of 100 with the same query
text), parses each answer with `json.loads` and groups the leases with dicts: per team the leases, their held, busy,
idle, idle-held and unmeasured GPU-hours (the accrued fields as they stand), what each costs at the lease's pool rate (a
dict lookup per lease, REPORT_FLOOR_RATES: `{"pool/MODEL": price}` as JSON) and the idle warnings and keeps their
history holds; then, as the report does, one timeseries query of the inventory gauge over the last REPORT_FLOOR_DAYS
days (default 30), each pool's mean GPUs. Nothing else: no client library, no models, no validation, no farm file. It is
what reading, pricing and summing the same data costs in Python, the least a report can cost.

Run by benchmarks/report.py in its own process: `python benchmarks/report_floor.py URL TYPE QUERY [QUERY ...]`
(TYPE: the incident type's name), with
DD_API_KEY and DD_APP_KEY set; each QUERY is a search text holding `{type}` where the type's id goes. Prints one
JSON document: the requests made, the leases read and the groups.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse

import urllib3

CAPACITY = "avg:gpufarm.inventory.gpus.total{*} by {environment,gpu_model}"

PAGE = 100


def main() -> None:
    """Read, group, print."""
    url, type_name, queries = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3:]
    headers = {"DD-API-KEY": os.environ["DD_API_KEY"], "DD-APPLICATION-KEY": os.environ["DD_APP_KEY"]}
    http = urllib3.PoolManager()
    requests = 0

    def get(path: str) -> dict:
        nonlocal requests
        requests += 1
        answer = http.request("GET", url + path, headers=headers)
        if answer.status != 200:
            raise SystemExit(f"{path}: {answer.status}")
        return json.loads(answer.data)

    rates: dict[str, float] = json.loads(os.environ.get("REPORT_FLOOR_RATES") or "{}")
    types = get("/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == type_name)
    seen: set[str] = set()
    groups: dict[str, dict[str, float]] = {}
    for template in queries:
        text = urllib.parse.quote(template.replace("{type}", type_id))
        offset = 0
        while True:
            attributes = get(f"/api/v2/incidents/search?query={text}&page[size]={PAGE}&page[offset]={offset}")
            page = attributes["data"]["attributes"]["incidents"]
            for item in page:
                incident = item["data"]
                if incident["id"] in seen:
                    continue
                seen.add(incident["id"])
                values = {k: v.get("value") for k, v in (incident["attributes"].get("fields") or {}).items()}
                row = groups.setdefault(str(values.get("team")), {})
                row["leases"] = row.get("leases", 0) + 1
                rate = rates.get(f"{values.get('environment')}/{str(values.get('gpu_model') or '').upper()}")
                for name in ("held", "busy", "idle", "idle_held", "unmeasured"):
                    hours = float(values.get(f"gpu_hours_{name}") or 0)
                    row[name] = row.get(name, 0.0) + hours
                    if rate is not None:
                        row[f"cost_{name}"] = row.get(f"cost_{name}", 0.0) + round(rate * hours, 2)
                for line in values.get("gpufarm_history") or []:
                    for step in ("warned", "kept"):
                        if f" {step}: " in line:
                            row[step] = row.get(step, 0) + 1
            offset += len(page)
            if len(page) < PAGE:
                break
    capacity = read_capacity(http, url, headers, int(os.environ.get("REPORT_FLOOR_DAYS") or 30))
    requests += 1
    print(json.dumps({"requests": requests, "leases": len(seen), "groups": groups, "capacity": capacity}))


def read_capacity(http: urllib3.PoolManager, url: str, headers: dict[str, str], days: int) -> dict[str, float]:
    """Each pool's mean GPUs over the window, from one timeseries query."""
    end = int(time.time() * 1000)
    start = end - days * 86_400_000
    interval = max(60_000, -(-(end - start) // 300 // 60_000) * 60_000)
    query = {"data_source": "metrics", "name": "a", "query": CAPACITY}
    attributes = {"from": start, "to": end, "interval": interval, "queries": [query]}
    body = json.dumps({"data": {"type": "timeseries_request", "attributes": attributes}}).encode()
    sent = {**headers, "Content-Type": "application/json"}
    answer = http.request("POST", url + "/api/v2/query/timeseries", body=body, headers=sent)
    if answer.status != 200:
        raise SystemExit(f"timeseries: {answer.status}")
    data = json.loads(answer.data)["data"]["attributes"]
    out: dict[str, float] = {}
    for series, row in zip(data.get("series") or [], data.get("values") or [], strict=False):
        values = [v for v in row if v is not None]
        if values:
            out[",".join(series["group_tags"])] = sum(values) / len(values)
    return out


if __name__ == "__main__":
    main()
