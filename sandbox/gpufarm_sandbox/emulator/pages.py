"""The pages gpufarm's links open locally: an incident page and a minimal metrics explorer, plain HTML, no script.

gpufarm's messages link to a lease's incident (`/incidents/<n>`, the number after IR-) and to its GPUs' metrics
(`/metric/explorer?exp_metric=...&exp_scope=...&exp_group=...`) under GPUFARM_PUBLIC_URL, which `gpufarm local`
points at the sandbox (gpufarm.core.chat.links). These pages are what those links show there: the incident's title,
state and every field, and a timeline put together from what the sandbox saw (created and modified, the monitor
notifications for the lease, the Slack messages that name it); and the metric's series over the last hours on the
sandbox clock, one line per group, drawn as inline SVG with a table of last / mean / min / max.

Every query-string input is bounded and validated (metric name, scope, group keys, window); a bad one is answered
400 with a page that says which, and nothing runs. Everything shown is HTML-escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.incidents import IncidentsModule
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.monitor_evaluator import MonitorEvaluator
from gpufarm_sandbox.emulator.query import GroupSeries, QueryError
from gpufarm_sandbox.emulator.slack_state import SlackState
from gpufarm_sandbox.emulator.web import Auth, Route

MAX_SCOPE = 500
MAX_TIMELINE = 200
DEFAULT_HOURS = 4
MAX_HOURS = 7 * 24
_METRIC_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,199}$")
_GROUP_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-/]{0,99}$")
_PUBLIC_ID_RE = re.compile(r"^[0-9]{1,9}$")
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
    "th{background:#f4f4f4}.muted{color:#777}code{background:#f4f4f4;padding:0 3px}"
)


class PageError(ValueError):
    """A page request the sandbox will not run; the message says which input."""


class PagesModule(BaseModule):
    """`/incidents`, `/incidents/<n>` and `/metric/explorer`: HTML for people, not Datadog's API."""

    name = "pages"

    def __init__(
        self,
        context: SandboxContext,
        incidents: IncidentsModule,
        metrics: MetricsModule,
        monitors: MonitorEvaluator,
        slack: SlackState,
    ) -> None:
        super().__init__(context)
        self.incidents = incidents
        self.metrics = metrics
        self.monitors = monitors
        self.slack = slack

    def routes(self) -> list[Route]:
        """The pages' routes (no credentials: they are what a browser opens from a Slack link)."""
        return [
            Route("/incidents", ("GET",), self._incidents, Auth.NONE),
            Route("/incidents/<public_id>", ("GET",), self._incident, Auth.NONE),
            Route("/metric/explorer", ("GET",), self._explorer, Auth.NONE),
        ]

    # -- incidents -----------------------------------------------------------------------------------------------

    def _incidents(self, request: Request) -> Response:
        incidents = sorted(self.incidents.dump()["incidents"], key=lambda i: int(i["public_id"]))
        rows = [
            _row(f'<a href="/incidents/{int(i["public_id"])}">IR-{int(i["public_id"])}</a>', i["title"], i["state"])
            for i in incidents
        ]
        body = _table(("Incident", "Title", "State"), rows) if rows else "<p class=muted>No incidents.</p>"
        return _page("Incidents", f"<h1>Incidents</h1>{body}")

    def _incident(self, request: Request, public_id: str) -> Response:
        if not _PUBLIC_ID_RE.match(public_id):
            return _page("Not found", "<h1>Not found</h1><p>An incident page is /incidents/&lt;number&gt;.</p>", 404)
        number = int(public_id)
        found = next((i for i in self.incidents.dump()["incidents"] if int(i["public_id"]) == number), None)
        if found is None:
            return _page("Not found", f"<h1>IR-{number}</h1><p>No such incident in the sandbox.</p>", 404)
        fields = found.get("fields") or {}
        field_rows = [_row(_code(k), _value(v)) for k, v in sorted(fields.items()) if v not in (None, "", [])]
        timeline = self._timeline(number, found)
        parts = [
            f"<h1>IR-{number}: {_esc(found['title'])}</h1>",
            f"<p>State <b>{_esc(found['state'])}</b> · created {_esc(found['created'])} · "
            f"modified {_esc(found['modified'])}</p>",
            "<h2>Fields</h2>",
            _table(("Field", "Value"), field_rows) if field_rows else "<p class=muted>No fields set.</p>",
            "<h2>Timeline</h2>",
            _table(("When (UTC)", "What"), [_row(_esc(w), t) for w, t in timeline]),
            '<p><a href="/incidents">All incidents</a></p>',
        ]
        return _page(f"IR-{number}", "".join(parts))

    def _timeline(self, number: int, incident: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(time, html) of what the sandbox saw about the incident, oldest first, at most MAX_TIMELINE entries."""
        lease = {f"ir:ir-{number}", f"gpu_ir:ir-{number}"}
        mention = re.compile(rf"\bIR-{number}\b")
        entries: list[tuple[float, str]] = [(_epoch(incident["created"]), "Incident created")]
        for cell in incident.get("initial_cells") or []:
            content = ((cell.get("content") or {}).get("content")) if isinstance(cell, dict) else None
            if content:
                entries.append((_epoch(incident["created"]), f"Note: {_esc(str(content)[:500])}"))
        for event in self.monitors.events():
            if lease & set(str(event.get("group", "")).split(",")):
                what = f"Monitor {_esc(event['monitor_name'])}: <b>{_esc(event['transition'])}</b> on "
                what += f"<code>{_esc(event['group'])}</code> (value {_esc(event.get('value'))})"
                entries.append((float(event["at"]), what))
        with self.ctx.lock:
            messages = [m.to_json() for m in self.slack.messages if not m.deleted]
        for message in messages:
            if mention.search(str(message.get("text", ""))):
                who = message.get("target") or message.get("channel")
                text = _esc(str(message["text"])[:300])
                entries.append((float(message["ts"]), f"Slack {_esc(message['kind'])} to {_esc(who)}: {text}"))
        if incident["modified"] != incident["created"]:
            entries.append((_epoch(incident["modified"]), f"Last modified (state {_esc(incident['state'])})"))
        entries.sort(key=lambda e: e[0])
        return [(_iso(at), what) for at, what in entries[-MAX_TIMELINE:]]

    # -- metrics explorer ----------------------------------------------------------------------------------------

    def _explorer(self, request: Request) -> Response:
        try:
            metric, scope, groups, hours = explorer_inputs(request.args)
        except PageError as exc:
            return _page("Bad request", f"<h1>Metrics explorer</h1><p>{_esc(exc)}</p>", 400)
        by = f" by {{{','.join(groups)}}}" if groups else ""
        query = f"avg:{metric}{{{scope}}}{by}"
        end = self.ctx.clock.now()
        start = end - hours * 3600
        try:
            series = self.metrics.query_series(query, start, end)
        except QueryError as exc:
            return _page("Bad request", f"<h1>Metrics explorer</h1><p>{_esc(exc)}</p>", 400)
        rows = [_row(_swatch(i), _esc(",".join(s.group_tags) or "*"), *_stats(s)) for i, s in enumerate(series)]
        parts = [
            f"<h1>{_esc(metric)}</h1>",
            f"<p>Query <code>{_esc(query)}</code>, the last {hours} h to {_iso(end)} (sandbox clock).</p>",
            _chart(series, start, end) if series else "<p class=muted>No data in this window.</p>",
            _table(("", "Group", "Last", "Mean", "Min", "Max"), rows) if rows else "",
        ]
        return _page(f"{metric} explorer", "".join(parts))


def explorer_inputs(args: Mapping[str, str]) -> tuple[str, str, list[str], int]:
    """The explorer's metric, scope, group keys and window (hours) from the query string; PageError when bad."""
    metric = str(args.get("exp_metric", "")).strip()
    if not _METRIC_RE.match(metric):
        raise PageError("exp_metric must be a metric name (letters, digits, '_' and '.', at most 200)")
    scope = str(args.get("exp_scope", "") or "*").strip()
    if len(scope) > MAX_SCOPE or any(c in scope for c in "{}") or not scope.isprintable():
        raise PageError(f"exp_scope must be a tag filter of at most {MAX_SCOPE} printable characters, no braces")
    raw_groups = [g.strip() for g in str(args.get("exp_group", "")).split(",") if g.strip()]
    if len(raw_groups) > 4 or not all(_GROUP_RE.match(g) for g in raw_groups):
        raise PageError("exp_group must be at most 4 tag keys, comma separated")
    raw_hours = str(args.get("hours", DEFAULT_HOURS)).strip()
    if not raw_hours.isascii() or not raw_hours.isdigit() or not 1 <= int(raw_hours) <= MAX_HOURS:
        raise PageError(f"hours must be a whole number from 1 to {MAX_HOURS}")
    return metric, scope, raw_groups, int(raw_hours)


def _chart(series: Sequence[GroupSeries], start: float, end: float, width: int = 720, height: int = 240) -> str:
    """One polyline per group, time left to right, values bottom to top, with the value range labelled."""
    values = [v for s in series for _, v in s.points]
    low, high = min(0.0, *values), max(values)
    high = high if high > low else low + 1.0
    span = max(end - start, 1.0)
    lines = []
    for i, s in enumerate(series):
        points = " ".join(
            f"{(t - start) / span * width:.1f},{height - (v - low) / (high - low) * height:.1f}" for t, v in s.points
        )
        colour = _COLOURS[i % len(_COLOURS)]
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 60}" height="{height + 20}" role="img">'
        f'<g transform="translate(50,5)"><rect width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>'
        f"{''.join(lines)}</g>"
        f'<text x="0" y="15" font-size="11">{_num(high)}</text>'
        f'<text x="0" y="{height + 5}" font-size="11">{_num(low)}</text></svg>'
    )


def _stats(series: GroupSeries) -> list[str]:
    values = [v for _, v in series.points]
    if not values:
        return ["-"] * 4
    return [_num(values[-1]), _num(sum(values) / len(values)), _num(min(values)), _num(max(values))]


def _page(title: str, body: str, status: int = 200) -> Response:
    document = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_esc(title)} · gpufarm sandbox</title>"
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )
    return Response(document, status=status, mimetype="text/html")


def _table(headers: Iterable[str], rows: Iterable[str]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _row(*cells: str) -> str:
    """A table row; cells are HTML already (escape text with _esc first)."""
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _swatch(i: int) -> str:
    return f'<span style="color:{_COLOURS[i % len(_COLOURS)]}">&#9632;</span>'


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_esc(v) for v in value)
    return _esc(value)


def _code(text: str) -> str:
    return f"<code>{_esc(text)}</code>"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float) -> str:
    return f"{value:.4g}"


def _epoch(iso: str) -> float:
    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")
