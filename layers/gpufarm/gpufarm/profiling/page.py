"""The summary page of one profiler run: self-contained HTML (inline CSS and SVG, no script, nothing fetched).

The profile pages function renders it on each request from the run's stored figures (gpufarm.profiling.summary):
no page is stored, so none can be replaced by an uploaded one.

It is embedded in a Datadog iframe widget and opened from the incident's link, so it loads nothing from
elsewhere (no CDN, no fonts): the figures, a bar chart of step times, bars of busy share per stream, a timeline
of the busiest streams (each lane's busy share in equal slices of the window), and the top kernels and operators.
Every text that came from the trace or the uploader is HTML-escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from gpufarm.profiling.analysis import Figures, Stream
from gpufarm.profiling.summary import RunSummary

TIMELINE_LANES = 8
_CSS = (
    "body{font:14px system-ui,sans-serif;margin:16px;color:#1c2430}h1{font-size:18px;margin:0 0 4px}"
    "h2{font-size:15px;margin:18px 0 6px}table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}tr:nth-child(even){background:#f3f5f8}"
    ".meta{color:#5a6472}.fig{display:inline-block;margin:4px 18px 4px 0}.fig b{display:block;font-size:18px}"
    "code{font-size:12px}"
)


def render_no_run(team: str) -> str:
    """The page of a team's newest run before it has one: what to do instead of an error."""
    title = f"Team {team}: no profiler run yet"
    return "\n".join(
        [
            "<!doctype html><html lang=en><head><meta charset=utf-8>",
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            "<p class=meta>The newest run a member of the team uploads onto one of its leases shows here.</p>",
            "<p>Upload a torch.profiler trace with <code>gpufarm profile upload trace.json --ir IR-123</code>.</p>",
            "</body></html>",
        ]
    )


def render_summary(summary: RunSummary) -> str:
    """The page of a stored (validated) run summary."""
    s = summary
    return render(s.figures(), ir=s.ir, run=s.run, uploaded=s.uploaded, trace_name=s.trace_name)


def render(figures: Figures, *, ir: int, run: str, uploaded: str, trace_name: str) -> str:
    """The whole page for one run."""
    f = figures
    title = f"IR-{ir} · {run}"
    tiles = [
        ("steps", str(f.steps)),
        ("step time (mean)", _ms(f.step_mean_ms)),
        ("step time (p50 / max)", f"{_ms(f.step_p50_ms)} / {_ms(f.step_max_ms)}"),
        ("throughput", f"{f.throughput:,.1f} samples/s" if f.throughput is not None else "n/a (no batch size)"),
        ("communication share", f"{100 * f.comm_share:.1f} %" if f.comm_share is not None else "n/a (no GPU kernels)"),
        *((f"memory peak ({dev})", _bytes(peak)) for dev, peak in f.memory_peak_bytes.items()),
    ]
    streams = f.gpu_streams or f.cpu_threads
    kind = "GPU streams" if f.gpu_streams else "CPU threads (no GPU work in this trace)"
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<div class=meta>{escape(trace_name)} · uploaded {escape(uploaded)} · {f.events:,} events · "
        f"window {f.window_us / 1000:,.1f} ms</div>",
        "<div>" + "".join(f"<span class=fig>{escape(k)}<b>{escape(v)}</b></span>" for k, v in tiles) + "</div>",
        "<h2>Step times</h2>",
        _step_chart(f.step_times_ms, f.steps),
        f"<h2>Busy share: {escape(kind)}</h2>",
        _share_bars(streams[:16]),
        f"<h2>Timeline of the busiest {escape(kind.split(' (', maxsplit=1)[0])}</h2>",
        _timeline(streams[:TIMELINE_LANES]),
        "<h2>Top kernels by GPU time</h2>",
        _table(f.top_kernels, "GPU time") if f.top_kernels else "<p class=meta>No GPU kernels in this trace.</p>",
        "<h2>Top operators by CPU time (inclusive)</h2>",
        _table(f.top_operators, "CPU time"),
        "</body></html>",
    ]
    return "\n".join(parts)


def _step_chart(times: Sequence[float], steps: int) -> str:
    if not times:
        return "<p class=meta>No ProfilerStep# spans in this trace.</p>"
    # The stored summary keeps the first steps only (summary.MAX_STEP_TIMES); say so rather than redraw the chart.
    note = f"<p class=meta>The first {len(times):,} of {steps:,} steps.</p>" if steps > len(times) else ""
    width, height, top = 640, 140, max(times) or 1.0
    bar = width / len(times)
    rects = "".join(
        f'<rect x="{i * bar + 1:.1f}" y="{height - 20 - (t / top) * (height - 30):.1f}" width="{max(bar - 2, 1):.1f}"'
        f' height="{(t / top) * (height - 30):.1f}" fill="#3b6fd8"><title>step {i + 1}: {t:.3f} ms</title></rect>'
        for i, t in enumerate(times)
    )
    return (
        f'{note}<svg width="{width}" height="{height}" role="img" aria-label="step times">{rects}'
        f'<text x="0" y="{height - 4}" font-size="11">0</text>'
        f'<text x="{width - 120}" y="12" font-size="11">max {top:.3f} ms</text></svg>'
    )


def _share_bars(streams: Sequence[Stream]) -> str:
    if not streams:
        return "<p class=meta>No busy streams.</p>"
    rows = "".join(
        f"<tr><td><code>{escape(s.name)}</code></td><td><svg width=300 height=12>"
        f'<rect width="300" height="12" fill="#e4e8ee"/><rect width="{300 * s.share:.1f}" height="12" fill="#2f9e6f"/>'
        f"</svg></td><td class=n>{100 * s.share:.1f} %</td></tr>"
        for s in streams
    )
    return f"<table>{rows}</table>"


def _timeline(streams: Sequence[Stream]) -> str:
    if not streams:
        return "<p class=meta>Nothing to show.</p>"
    lane, label, width = 18, 170, 600
    cells = []
    for row, s in enumerate(streams):
        y = row * lane
        cells.append(f'<text x="0" y="{y + 13}" font-size="11">{escape(s.name[:28])}</text>')
        step = width / max(len(s.timeline), 1)
        for i, v in enumerate(s.timeline):
            if v > 0:
                cells.append(
                    f'<rect x="{label + i * step:.1f}" y="{y + 2}" width="{step + 0.3:.1f}" height="{lane - 4}"'
                    f' fill="#d8553b" fill-opacity="{0.15 + 0.85 * v:.2f}"/>'
                )
    total = len(streams) * lane
    return (
        f'<svg width="{label + width}" height="{total}" role="img" aria-label="timeline">'
        f'<rect x="{label}" y="0" width="{width}" height="{total}" fill="#f3f5f8"/>{"".join(cells)}</svg>'
    )


def _table(rows: Sequence[tuple[str, float, int]], what: str) -> str:
    body = "".join(
        f"<tr><td><code>{escape(name)}</code></td><td class=n>{t / 1000:,.3f} ms</td><td class=n>{calls:,}</td></tr>"
        for name, t, calls in rows
    )
    return f"<table><tr><th>name</th><th>{escape(what)}</th><th>calls</th></tr>{body}</table>"


def _ms(value: float | None) -> str:
    return f"{value:,.3f} ms" if value is not None else "n/a"


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.1f} {unit}" if unit != "B" else f"{value:,} B"
        size /= 1024
    return f"{value:,} B"
