"""Sandbox module: Datadog hosts (v1 `/api/v1/hosts`) and host tags by source (v1 `/api/v1/tags/hosts`).

Hosts come into being when a metric names them, when tags are set on them, or when seeded through
`POST /_sandbox/hosts`. Only hosts that reported in the past three hours of the sandbox clock are listed, as Datadog
lists them. Tags are normalised the way Datadog normalises them and kept per source; `tags_for()` merges the sources for
the metrics module, which stamps them onto points at ingest. Under the `tag-source-User` quirk the host list names
the `user` source `User`; the tags API still takes and answers `source=user`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.quirks import TAG_SOURCE_USER
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, empty_response, json_body, json_response, query_int

LIVE_WINDOW_S = 3 * 3600  # Datadog lists hosts that reported in the past 3 hours
UP_WINDOW_S = 15 * 60  # a host counts as `up` while it reported within this long (Datadog shows `???` after)
DEFAULT_SOURCE = "user"  # v1.yaml: "If no source is specified, defaults to 'user'"
MAX_COUNT = 1000
DEFAULT_COUNT = 100
MAX_HOST_NAME = 255
MAX_TAGS_PER_SOURCE = 1000
MAX_EPOCH_S = 2**42  # far beyond any real timestamp, well inside float range
_FIRST_HOST_ID = 1_000_000_001
FILTER_CACHE = 32  # host filters whose matching hosts are kept between pages
_SORT_FIELDS = {"name", "host_name", "id", "apps", "status", "up", "last_reported_time", "cpu", "iowait", "load"}
_TAG_RUNS = re.compile(r"__+")


def normalize(tag: str) -> str:
    """Datadog tag normalisation: lowercase, odd characters to `_` (runs collapsed), start with a letter, <= 200."""
    out = _TAG_RUNS.sub("_", normalize_tag(tag))
    while out and not out[0].isalpha():
        out = out[1:]
    return out.rstrip("_")[:200]


def normalize_tags(tags: Any, what: str = "tags") -> list[str]:
    """Validate a JSON list of tag strings and normalise it (order kept, duplicates and empties dropped)."""
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ApiError(400, f"Invalid {what}: expected a list of strings")
    return list(dict.fromkeys(n for n in (normalize(t) for t in tags) if n))


@dataclass
class _Host:
    name: str
    id: int
    tags_by_source: dict[str, list[str]] = field(default_factory=dict)
    last_reported: float | None = None
    reporting: bool = False  # seeded "agent running": last_reported follows the clock
    merged: tuple[str, ...] | None = None  # cache of tags_for(); reset on every tag change

    def reported_at(self, now: float) -> float | None:
        """When the host last reported (now, for a seeded host whose agent keeps reporting)."""
        return now if self.reporting else self.last_reported


class HostsModule(BaseModule):
    """Hosts list, host tags by source, and the inventory seeding endpoint."""

    name = "hosts"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self._hosts: dict[str, _Host] = {}
        self._next_id = _FIRST_HOST_ID
        # Bumped when a host appears or its tags change: a filter's hosts in name order are computed once per
        # version and each page is cut from them (only whether a host reported recently is checked per page).
        self._version = 0
        self._filtered: dict[tuple[tuple[str, ...], bool], tuple[int, list[_Host]]] = {}

    # -- public API for sibling modules --------------------------------------------------------------------------

    def tags_for(self, host: str) -> list[str]:
        """Every tag of a host, all sources merged, deduplicated in source order ([] for an unknown host)."""
        with self.ctx.lock:
            h = self._hosts.get(host)
            if h is None:
                return []
            return list(self._merged(h))

    def touch(self, host: str, at: float) -> None:
        """Mark a host as reporting at `at` (epoch seconds), creating it if new."""
        with self.ctx.lock:
            h = self._ensure(host)
            if h.last_reported is None or at > h.last_reported:
                h.last_reported = at

    def exists(self, host: str) -> bool:
        """Whether the sandbox knows this host."""
        with self.ctx.lock:
            return host in self._hosts

    # -- module plumbing -----------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Hosts and tags endpoints plus the seeding control endpoint."""
        return [
            Route("/api/v1/hosts", ("GET",), self._list_hosts),
            Route("/api/v1/tags/hosts", ("GET",), self._list_tags),
            Route("/api/v1/tags/hosts/<path:host_name>", ("GET",), self._get_tags),
            Route("/api/v1/tags/hosts/<path:host_name>", ("POST",), self._add_tags),
            Route("/api/v1/tags/hosts/<path:host_name>", ("PUT",), self._replace_tags),
            Route("/api/v1/tags/hosts/<path:host_name>", ("DELETE",), self._delete_tags),
            Route("/_sandbox/hosts", ("POST",), self._seed, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget every host."""
        with self.ctx.lock:
            self._hosts.clear()
            self._next_id = _FIRST_HOST_ID
            self._version += 1
            self._filtered.clear()

    def dump(self) -> dict[str, Any]:
        """Every host with its tags by source and last report time."""
        with self.ctx.lock:
            now = self.ctx.clock.now()
            return {
                "count": len(self._hosts),
                "hosts": {
                    name: {
                        "id": h.id,
                        "tags_by_source": {s: list(t) for s, t in h.tags_by_source.items()},
                        "last_reported": h.reported_at(now),
                    }
                    for name, h in sorted(self._hosts.items())
                },
            }

    # -- internals -----------------------------------------------------------------------------------------------

    def _ensure(self, name: str) -> _Host:
        h = self._hosts.get(name)
        if h is None:
            h = _Host(name=name, id=self._next_id)
            self._next_id += 1
            self._hosts[name] = h
            self._version += 1
        return h

    @staticmethod
    def _merged(h: _Host) -> tuple[str, ...]:
        if h.merged is None:
            h.merged = tuple(dict.fromkeys(t for tags in h.tags_by_source.values() for t in tags))
        return h.merged

    def _set_source(self, h: _Host, source: str, tags: list[str]) -> None:
        if tags:
            h.tags_by_source[source] = tags[:MAX_TAGS_PER_SOURCE]
        else:
            h.tags_by_source.pop(source, None)
        h.merged = None
        self._version += 1

    def _live(self, h: _Host, now: float, since: float) -> bool:
        reported = h.reported_at(now)
        return reported is not None and reported >= since

    # -- GET /api/v1/hosts ---------------------------------------------------------------------------------------

    def _list_hosts(self, request: Request) -> Response:
        start = query_int(request, "start", 0) or 0
        count = query_int(request, "count", DEFAULT_COUNT, maximum=MAX_COUNT)
        since = query_int(request, "from", None, maximum=MAX_EPOCH_S)
        sort_field, sort_dir = _sort_args(request)
        with_meta = _query_bool(request, "include_hosts_metadata")
        # Hosts are never muted in the sandbox, so the mute details are always the same; the flag is still checked.
        _query_bool(request, "include_muted_hosts_data")
        terms = [t.lower() for t in (request.args.get("filter") or "").split()]
        with self.ctx.lock:
            now = self.ctx.clock.now()
            floor = float(since) if since is not None else now - LIVE_WINDOW_S
            matching = self._matching(terms, now, floor, sort_field, reverse=sort_dir == "desc")
            page = matching[start : start + (count or 0)]
            # How tags_by_source spells the `user` source: unconfirmed for Datadog (the quirk plays `User`).
            user = "User" if TAG_SOURCE_USER in self.ctx.quirks else DEFAULT_SOURCE
            host_list = [self._host_json(h, now, with_meta, user) for h in page]
        return json_response(
            {
                "exact_total_matching": True,
                "total_returned": len(host_list),
                "host_list": host_list,
                "total_matching": len(matching),
            }
        )

    def _matching(self, terms: list[str], now: float, floor: float, sort_field: str, *, reverse: bool) -> list[_Host]:
        """Live hosts matching the filter terms, in the order asked for."""
        if sort_field in ("name", "host_name"):
            return [h for h in self._by_name(terms, reverse=reverse) if self._live(h, now, floor)]
        matching = [h for h in self._hosts.values() if self._live(h, now, floor) and self._matches(h, terms)]
        matching.sort(key=lambda h: _sort_key(h, sort_field, now), reverse=reverse)
        return matching

    def _by_name(self, terms: list[str], *, reverse: bool) -> list[_Host]:
        key = (tuple(terms), reverse)
        cached = self._filtered.get(key)
        if cached is None or cached[0] != self._version:
            hosts = sorted((h for h in self._hosts.values() if self._matches(h, terms)), key=lambda h: h.name)
            if reverse:
                hosts.reverse()
            if len(self._filtered) >= FILTER_CACHE:
                self._filtered.pop(next(iter(self._filtered)))
            cached = (self._version, hosts)
            self._filtered[key] = cached
        return cached[1]

    def _matches(self, h: _Host, terms: list[str]) -> bool:
        if not terms:
            return True
        name = h.name.lower()
        tags = self._merged(h)
        return all(term in name or term in tags for term in terms)

    def _host_json(self, h: _Host, now: float, with_meta: bool, user_source: str) -> dict[str, Any]:
        reported = h.reported_at(now) or now
        return {
            "last_reported_time": int(reported),
            "name": h.name,
            "is_muted": False,
            "mute_timeout": None,
            "apps": ["agent"],
            "tags_by_source": {
                (user_source if s == DEFAULT_SOURCE else s): list(t) for s, t in h.tags_by_source.items()
            },
            "up": now - reported <= UP_WINDOW_S,
            "metrics": {"load": None, "iowait": None, "cpu": None},
            "sources": ["agent"],
            "meta": _meta(h, with_meta),
            "host_name": h.name,
            "id": h.id,
            "aliases": [h.name],
        }

    # -- tags ----------------------------------------------------------------------------------------------------

    def _host_arg(self, host_name: str) -> str:
        name = host_name.strip()
        if not name or len(name) > MAX_HOST_NAME:
            raise ApiError(400, "Invalid host name")
        return name

    def _source_arg(self, request: Request, default: str | None) -> str | None:
        source = request.args.get("source")
        if source is None or not source.strip():
            return default
        return source.strip()

    def _get_tags(self, request: Request, host_name: str) -> Response:
        name = self._host_arg(host_name)
        source = self._source_arg(request, None)
        with self.ctx.lock:
            h = self._hosts.get(name)
            if h is None:
                raise ApiError(404, "Not Found")
            tags = list(h.tags_by_source.get(source, [])) if source else list(self._merged(h))
        return json_response({"host": name, "tags": tags})

    def _tag_body(self, request: Request) -> list[str]:
        body = json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid JSON: expected an object")
        if "tags" not in body:
            raise ApiError(400, "Missing 'tags' in the request body")
        if "host" in body and body["host"] is not None and not isinstance(body["host"], str):
            raise ApiError(400, "Invalid host: expected a string")
        return normalize_tags(body["tags"])

    def _add_tags(self, request: Request, host_name: str) -> Response:
        name = self._host_arg(host_name)
        source = self._source_arg(request, DEFAULT_SOURCE) or DEFAULT_SOURCE
        tags = self._tag_body(request)
        with self.ctx.lock:
            h = self._new_or_existing(name)
            current = h.tags_by_source.get(source, [])
            self._set_source(h, source, list(dict.fromkeys([*current, *tags])))
            result = list(h.tags_by_source.get(source, []))
        return json_response({"host": name, "tags": result}, 201)

    def _replace_tags(self, request: Request, host_name: str) -> Response:
        name = self._host_arg(host_name)
        source = self._source_arg(request, DEFAULT_SOURCE) or DEFAULT_SOURCE
        tags = self._tag_body(request)
        with self.ctx.lock:
            h = self._new_or_existing(name)
            self._set_source(h, source, tags)
            result = list(h.tags_by_source.get(source, []))
        return json_response({"host": name, "tags": result}, 201)

    def _delete_tags(self, request: Request, host_name: str) -> Response:
        name = self._host_arg(host_name)
        source = self._source_arg(request, DEFAULT_SOURCE) or DEFAULT_SOURCE
        with self.ctx.lock:
            h = self._hosts.get(name)
            if h is None:
                raise ApiError(404, "Not Found")
            self._set_source(h, source, [])
        return empty_response(204)

    def _new_or_existing(self, name: str) -> _Host:
        # A host tagged before it ever reported still appears in the inventory: count the tag call as its first sign.
        h = self._hosts.get(name)
        if h is None:
            h = self._ensure(name)
            h.last_reported = self.ctx.clock.now()
        return h

    def _list_tags(self, request: Request) -> Response:
        source = self._source_arg(request, None)
        out: dict[str, list[str]] = {}
        with self.ctx.lock:
            for name in sorted(self._hosts):
                h = self._hosts[name]
                tags = h.tags_by_source.get(source, []) if source else self._merged(h)
                for tag in tags:
                    out.setdefault(tag, []).append(name)
        return json_response({"tags": out})

    # -- POST /_sandbox/hosts ------------------------------------------------------------------------------------

    def _seed(self, request: Request) -> Response:
        body = json_body(request)
        hosts = body.get("hosts") if isinstance(body, dict) else None
        if not isinstance(hosts, list):
            raise ApiError(400, 'body must be {"hosts": [{"name": ..., "tags": {"<source>": [...]}}]}')
        parsed = [_parse_seed(i, item) for i, item in enumerate(hosts)]
        with self.ctx.lock:
            now = self.ctx.clock.now()
            for name, by_source, last_reported, reporting in parsed:
                h = self._ensure(name)
                for source, tags in by_source.items():
                    self._set_source(h, source, tags)
                h.last_reported = now if last_reported is None else last_reported
                h.reporting = reporting
        return json_response({"ok": True, "hosts": len(parsed)})


def _parse_seed(i: int, item: Any) -> tuple[str, dict[str, list[str]], float | None, bool]:
    if not isinstance(item, dict):
        raise ApiError(400, f"hosts[{i}]: expected an object")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_HOST_NAME:
        raise ApiError(400, f"hosts[{i}].name: expected a non-empty host name")
    tags = item.get("tags", {})
    if isinstance(tags, list):  # a bare list means the default source
        tags = {DEFAULT_SOURCE: tags}
    if not isinstance(tags, dict):
        raise ApiError(400, f"hosts[{i}].tags: expected an object of source -> [tags]")
    by_source = {
        str(src).strip() or DEFAULT_SOURCE: normalize_tags(t, f"hosts[{i}].tags.{src}") for src, t in tags.items()
    }
    last = item.get("last_reported")
    if last is not None and (
        isinstance(last, bool) or not isinstance(last, (int, float)) or not 0 <= last <= MAX_EPOCH_S  # NaN fails too
    ):
        raise ApiError(400, f"hosts[{i}].last_reported: expected epoch seconds")
    reporting = item.get("reporting", False)
    if not isinstance(reporting, bool):
        raise ApiError(400, f"hosts[{i}].reporting: expected true or false")
    return name.strip(), by_source, None if last is None else float(last), reporting


def _query_bool(request: Request, name: str) -> bool:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return False
    value = raw.strip().lower()
    if value not in {"true", "false", "1", "0"}:
        raise ApiError(400, f"Invalid parameter {name}: expected true or false")
    return value in {"true", "1"}


def _sort_args(request: Request) -> tuple[str, str]:
    sort_field = (request.args.get("sort_field") or "name").strip().lower()
    sort_dir = (request.args.get("sort_dir") or "asc").strip().lower()
    if sort_field not in _SORT_FIELDS:
        raise ApiError(400, f"Invalid sort_field {sort_field!r}; use one of {', '.join(sorted(_SORT_FIELDS))}")
    if sort_dir not in {"asc", "desc"}:
        raise ApiError(400, "Invalid sort_dir; use asc or desc")
    return sort_field, sort_dir


def _sort_key(h: _Host, sort_field: str, now: float) -> tuple[Any, str]:
    if sort_field == "id":
        return (h.id, h.name)
    if sort_field in {"last_reported_time", "status", "up"}:
        return (h.reported_at(now) or 0.0, h.name)
    # apps and the cpu/iowait/load metrics are the same for every sandbox host: name order decides.
    return ("", h.name)


def _meta(h: _Host, full: bool) -> dict[str, Any]:
    """Host metadata as the agent reports it; the full agent/platform details only with include_hosts_metadata.

    The lean default also keeps client-side deserialization of 1000-host pages cheap.
    """
    meta: dict[str, Any] = {"socket-hostname": h.name, "socket-fqdn": h.name, "host_id": h.id}
    if full:
        meta.update(
            {
                "nixV": ["ubuntu", "22.04", ""],
                "cpuCores": 0,
                "network": None,
                "macV": ["", "", ""],
                "timezones": ["UTC"],
                "winV": ["", "", ""],
                "pythonV": "3.11",
                "fbsdV": ["", "", ""],
                "gohai": "{}",
                "logs_agent": {"transport": ""},
                "agent_checks": [],
                "agent_flavor": "agent",
                "platform": "linux",
                "machine": "amd64",
                "install_method": {"tool": "gpufarm-sandbox", "installer_version": "0", "tool_version": "sandbox"},
                "agent_version": "7.0.0",
                "processor": "sandbox",
            }
        )
    return meta
