"""The enforcer's Datadog traffic, outbound only: gpufarm's live incidents in, its lag and notices out.

Reads `GET /api/v2/incidents/search` for live incidents (the documented `state` facet alone) and keeps those of
gpufarm's incident type (looked up by name once); sends gauges to `/api/v2/series` and notices as events to
`/api/v1/events`. Bounded: timeouts, a page cap, a response size cap. Keys stay in the headers, never in a message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from gpufarm_node.datadog import DatadogTarget
from gpufarm_node.enforce.run import UNITS

PAGE_SIZE = 100
# 20,000 live incidents at most per run: far above any farm's leases, a bound on a runaway search.
MAX_PAGES = 200
MAX_BODY = 64 << 20
DEFAULT_TYPE_NAME = "GPU allocation"


class DatadogReadError(RuntimeError):
    """Datadog could not be read (or answered in a shape gpufarm does not know); nothing is applied on it."""


class DatadogIO:
    """One urllib3 pool to the Datadog API with the node's keys."""

    def __init__(
        self, target: DatadogTarget, *, type_name: str = DEFAULT_TYPE_NAME, timeout: float = 15.0, retries: int = 2
    ) -> None:
        import urllib3

        self.base = target.base_url.rstrip("/")
        self.type_name = type_name
        self._headers = {"Accept": "application/json", "DD-API-KEY": target.api_key}
        if target.app_key:
            self._headers["DD-APPLICATION-KEY"] = target.app_key
        self._pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
            retries=urllib3.Retry(total=retries, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504)),
        )
        self._type_id: str | None = None

    # -- in ------------------------------------------------------------------------------------------------

    def live_incidents(self) -> list[dict[str, Any]]:
        """Every live incident of gpufarm's type, as data objects."""
        type_id = self.type_id()
        out: list[dict[str, Any]] = []
        for page in range(MAX_PAGES):
            query = {"query": "state:(active OR stable)", "page[size]": PAGE_SIZE, "page[offset]": page * PAGE_SIZE}
            body = self._get("/api/v2/incidents/search?" + urlencode(query))
            attributes = ((body.get("data") or {}).get("attributes") or {}) if isinstance(body, dict) else {}
            items = attributes.get("incidents")
            if not isinstance(items, list):
                raise DatadogReadError("Datadog answered the incident search with an unexpected shape")
            for item in items:
                data = item.get("data") if isinstance(item, dict) else None
                if isinstance(data, dict) and (data.get("attributes") or {}).get("incident_type_uuid") == type_id:
                    out.append(data)
            total = attributes.get("total")
            seen = (page + 1) * PAGE_SIZE
            if len(items) < PAGE_SIZE or (isinstance(total, int) and seen >= total):
                return out
        raise DatadogReadError(f"more than {MAX_PAGES * PAGE_SIZE} live incidents: refusing a partial view")

    def type_id(self) -> str:
        """gpufarm's incident type id, by name, once."""
        if self._type_id is None:
            body = self._get("/api/v2/incidents/config/types")
            found = (
                [t for t in (body.get("data") or []) if (t.get("attributes") or {}).get("name") == self.type_name]
                if isinstance(body, dict)
                else []
            )
            if len(found) != 1:
                raise DatadogReadError(f"Datadog has {len(found)} incident types named {self.type_name!r}")
            self._type_id = str(found[0]["id"])
        return self._type_id

    def _get(self, path: str) -> Any:
        from urllib3.exceptions import HTTPError

        try:
            response = self._pool.request("GET", self.base + path, headers=self._headers, preload_content=False)
        except (HTTPError, OSError) as exc:
            raise DatadogReadError(f"Datadog unreachable ({type(exc).__name__})") from None
        try:
            data = response.read(MAX_BODY + 1)
        finally:
            response.release_conn()
        if response.status != 200:
            raise DatadogReadError(f"Datadog answered {response.status} to GET {path.split('?', maxsplit=1)[0]}")
        if len(data) > MAX_BODY:
            raise DatadogReadError("Datadog's answer is over the size gpufarm reads")
        try:
            return json.loads(data)
        except ValueError:
            raise DatadogReadError("Datadog's answer is not JSON") from None

    # -- out -----------------------------------------------------------------------------------------------

    def gauges(self, values: Mapping[str, float], tags: Sequence[str], now: float) -> None:
        """Send gauges (best effort: the next run sends them again), with their units (spec/metrics.yaml)."""
        series = [
            {
                "metric": name,
                "type": 3,
                "unit": UNITS.get(name),
                "points": [{"timestamp": int(now), "value": float(v)}],
                "tags": list(tags),
            }
            for name, v in values.items()
        ]
        self._post("/api/v2/series", {"series": series})

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        """Post an event operators see in Datadog (best effort)."""
        self._post(
            "/api/v1/events",
            {
                "title": title[:100],
                "text": text[:4000],
                "tags": list(tags),
                "alert_type": alert,
                "source_type_name": "gpufarm",
            },
        )

    def _post(self, path: str, body: Mapping[str, Any]) -> None:
        from urllib3.exceptions import HTTPError

        headers = {**self._headers, "Content-Type": "application/json"}
        try:
            response = self._pool.request("POST", self.base + path, body=json.dumps(body), headers=headers)
        except (HTTPError, OSError) as exc:
            raise DatadogReadError(f"Datadog unreachable ({type(exc).__name__})") from None
        if not 200 <= response.status <= 299:
            raise DatadogReadError(f"Datadog answered {response.status} to POST {path}")
