"""Datadog's metric query language for the sandbox: parsing, tag filters, time buckets and aggregation (formulas over
named queries are in `query_formulas`).

Pure: no HTTP, no clock, no storage. The metrics module hands in stored series as `SeriesData`; this module turns a
query such as `avg:gpufarm.gpu.utilization{gpufarm:managed,!ir:ir-9} by {ir}.rollup(max, 60)` into one point list per
group, as Datadog does: each series is rolled up into time buckets first (time aggregation), then the series of a group
are combined bucket by bucket (space aggregation).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product

SPACE_AGGREGATORS = frozenset({"avg", "sum", "min", "max", "count"})
ROLLUP_METHODS = frozenset({"avg", "sum", "min", "max", "count"})
# Reducers for scalar queries and monitor time aggregation; `percentile` needs distribution metrics, which the
# sandbox does not store, so it is refused rather than faked.
SCALAR_REDUCERS = frozenset({"avg", "mean", "sum", "min", "max", "last", "l2norm", "area"})
# Bucket widths Datadog steps through when it picks (or widens) an interval, in seconds.
INTERVAL_LADDER = (
    1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800, 604800,
)  # fmt: skip
DEFAULT_MAX_POINTS = 300  # v1 picks ~300 buckets: one day -> 300 s buckets, 288 points, as recorded
MAX_POINTS = 1500  # a requested interval is widened when it would give more buckets than this
NA = "N/A"  # group value for series that lack a group-by key, as Datadog shows it

_METRIC_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.]*")
_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]*")
_METHOD_RE = re.compile(r"\.\s*([A-Za-z_]+)\s*\(([^()]*)\)")


class QueryError(ValueError):
    """The query cannot be parsed or evaluated; the message is shown to the API caller."""


Matcher = Callable[[frozenset[str]], bool]


@dataclass(frozen=True)
class GroupSeries:
    """One group's space-aggregated points: epoch seconds (bucket start) and value, sorted by time."""

    group_tags: tuple[str, ...]
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class SeriesData:
    """A stored series as the engine sees it: tags, sorted timestamps (s) and values, and whether it is a count."""

    tags: frozenset[str]
    timestamps: Sequence[float]
    values: Sequence[float]
    is_count: bool = False


@dataclass(frozen=True)
class MetricQuery:
    """A parsed `<space_agg>:<metric>{<filter>} by {<keys>}` query with its optional modifiers."""

    text: str
    metric: str
    space_agg: str
    explicit_agg: bool
    scope: str
    group_by: tuple[str, ...]
    rollup: str | None = None
    rollup_seconds: int | None = None
    modifier: str | None = None  # "as_count" or "as_rate"
    matches: Matcher = field(default=lambda tags: True, compare=False, repr=False)

    def expression(self, group_tags: Sequence[str] = ()) -> str:
        """The query narrowed to one group, as Datadog writes a series' `expression`."""
        scope = scope_for(self.scope, group_tags)
        prefix = f"{self.space_agg}:" if self.explicit_agg else ""
        suffix = ""
        if self.modifier:
            suffix += f".{self.modifier}()"
        if self.rollup:
            suffix += f".rollup({self.rollup}{f', {self.rollup_seconds}' if self.rollup_seconds else ''})"
        return f"{prefix}{self.metric}{{{scope}}}{suffix}"


def scope_for(scope: str, group_tags: Sequence[str]) -> str:
    """A series' scope: the filter plus its group tags, comma separated (`*` alone only when nothing narrows it)."""
    parts = [] if scope.strip() == "*" else [scope.strip()]
    parts.extend(group_tags)
    return ",".join(parts) or "*"


# -- parsing: metric queries -----------------------------------------------------------------------------------------


def parse_query(text: str) -> MetricQuery:
    """Parse one metric query; raises QueryError with a Datadog-style explanation."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("Error parsing query: empty query")
    src = text.strip()
    pos = 0
    space_agg, explicit = "avg", False
    head = re.match(r"([A-Za-z0-9_]+):", src)
    if head and head.group(1).lower() in SPACE_AGGREGATORS | {"p50", "p75", "p90", "p95", "p99"}:
        space_agg, explicit = head.group(1).lower(), True
        if space_agg not in SPACE_AGGREGATORS:
            raise QueryError(f"Error parsing query: aggregator {space_agg} needs a distribution metric")
        pos = head.end()
    metric_match = _METRIC_RE.match(src, pos)
    if not metric_match:
        raise QueryError(f"Error parsing query: expected a metric name at position {pos} in {src!r}")
    metric = metric_match.group(0)
    if len(metric) > 200:
        raise QueryError("Error parsing query: metric name longer than 200 characters")
    pos = metric_match.end()
    if pos >= len(src) or src[pos] != "{":
        raise QueryError(f"Error parsing query: expected '{{' after the metric name in {src!r}")
    close = src.find("}", pos)
    if close < 0:
        raise QueryError(f"Error parsing query: unclosed '{{' in {src!r}")
    scope = src[pos + 1 : close].strip()
    if not scope:
        raise QueryError(f"Error parsing query: empty scope in {src!r}; use {{*}} for everything")
    matcher = parse_filter(scope)
    group_by, rollup, rollup_seconds, modifier = _modifiers(src[close + 1 :], src)
    return MetricQuery(
        text=src,
        metric=metric,
        space_agg=space_agg,
        explicit_agg=explicit,
        scope=scope,
        group_by=group_by,
        rollup=rollup,
        rollup_seconds=rollup_seconds,
        modifier=modifier,
        matches=matcher,
    )


def _modifiers(rest: str, src: str) -> tuple[tuple[str, ...], str | None, int | None, str | None]:
    """`by {keys}` and `.rollup()` / `.as_count()` / `.as_rate()`, in either order."""
    group_by: tuple[str, ...] = ()
    rollup: str | None = None
    rollup_seconds: int | None = None
    modifier: str | None = None
    while rest.strip():
        stripped = rest.lstrip()
        by = re.match(r"by\s*\{([^{}]*)\}", stripped, re.IGNORECASE)
        method = _METHOD_RE.match(stripped)
        if by and not group_by:
            group_by = _group_keys(by.group(1), src)
            rest = stripped[by.end() :]
        elif method:
            name, args = method.group(1).lower(), method.group(2)
            if name == "rollup":
                rollup, rollup_seconds = _rollup_args(args, src)
            elif name in {"as_count", "as_rate"} and not args.strip():
                modifier = name
            else:
                raise QueryError(f"Error parsing query: function .{name}() is not supported in {src!r}")
            rest = stripped[method.end() :]
        else:
            raise QueryError(f"Error parsing query: unexpected {stripped[:40]!r} in {src!r}")
    return group_by, rollup, rollup_seconds, modifier


def parse_queries(text: str) -> list[MetricQuery]:
    """Parse a v1 query string that may hold several comma-separated queries (commas inside `{}`/`()` stay)."""
    if not isinstance(text, str):
        raise QueryError("Error parsing query: empty query")
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [parse_query(p) for p in parts]


def _group_keys(raw: str, src: str) -> tuple[str, ...]:
    keys = tuple(k.strip().lower() for k in raw.split(","))
    if not keys or any(not _KEY_RE.fullmatch(k) for k in keys):
        raise QueryError(f"Error parsing query: invalid group-by keys {{{raw}}} in {src!r}")
    return tuple(dict.fromkeys(keys))


def _rollup_args(args: str, src: str) -> tuple[str, int | None]:
    parts = [a.strip().strip("'\"").lower() for a in args.split(",")]
    if not parts or parts[0] not in ROLLUP_METHODS or len(parts) > 2:
        raise QueryError(
            f"Error parsing query: .rollup() takes one of {', '.join(sorted(ROLLUP_METHODS))} "
            f"and an optional number of seconds in {src!r}"
        )
    seconds: int | None = None
    if len(parts) == 2:
        if not parts[1].isdigit() or int(parts[1]) <= 0:
            raise QueryError(f"Error parsing query: rollup interval must be a positive integer in {src!r}")
        seconds = int(parts[1])
    return parts[0], seconds


# -- parsing: tag filters --------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:(\()|(\))|(,)|([^\s(),]+))")


def parse_filter(text: str) -> Matcher:
    """Compile a scope (`*`, `k:v`, `k:pre*`, `!k:v`, `NOT`, `AND`, `OR`, `,`, `( )`, `k IN (a, b)`) to a matcher."""
    tokens = _tokenize(text)
    parser = _FilterParser(tokens, text)
    matcher = parser.parse()
    return matcher


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(text, pos)
        if not m:  # pragma: no cover - the pattern accepts every non-space character
            raise QueryError(f"Error parsing query: cannot read scope {text!r}")
        tokens.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return tokens


class _FilterParser:
    """Recursive descent over filter tokens; comma and AND bind tighter than OR, as in Datadog's search syntax."""

    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.i = 0

    def parse(self) -> Matcher:
        """The whole scope as one matcher; leftover tokens are an error."""
        if not self.tokens:
            raise QueryError("Error parsing query: empty scope")
        matcher = self._or()
        if self.i != len(self.tokens):
            raise self._error(f"unexpected {self.tokens[self.i]!r}")
        return matcher

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise self._error("unexpected end of scope")
        self.i += 1
        return token

    def _error(self, what: str) -> QueryError:
        return QueryError(f"Error parsing query: {what} in scope {{{self.text}}}")

    def _or(self) -> Matcher:
        parts = [self._and()]
        while self._peek() == "OR":
            self.i += 1
            parts.append(self._and())
        if len(parts) == 1:
            return parts[0]
        return lambda tags: any(p(tags) for p in parts)

    def _and(self) -> Matcher:
        parts = [self._unary()]
        while True:
            token = self._peek()
            if token in {",", "AND"}:
                self.i += 1
                parts.append(self._unary())
            elif token is not None and token not in {")", "OR"}:
                parts.append(self._unary())  # adjacency reads as AND
            else:
                break
        if len(parts) == 1:
            return parts[0]
        return lambda tags: all(p(tags) for p in parts)

    def _unary(self) -> Matcher:
        token = self._peek()
        if token == "NOT":
            self.i += 1
            inner = self._unary()
            return lambda tags: not inner(tags)
        if token is not None and token.startswith("!") and len(token) > 1:
            self.i += 1
            inner = _term(token[1:], self.text)
            return lambda tags: not inner(tags)
        return self._primary()

    def _primary(self) -> Matcher:
        token = self._take()
        if token == "(":
            inner = self._or()
            if self._peek() != ")":
                raise self._error("missing ')'")
            self.i += 1
            return inner
        if token in {")", ",", "AND", "OR", "IN"}:
            raise self._error(f"unexpected {token!r}")
        if self._peek() == "IN":
            self.i += 1
            return _any_of(token, self._in_list())
        if self._peek() == "NOT" and self.i + 1 < len(self.tokens) and self.tokens[self.i + 1] == "IN":
            self.i += 2
            inner = _any_of(token, self._in_list())
            return lambda tags: not inner(tags)
        return _term(token, self.text)

    def _in_list(self) -> list[str]:
        if self._take() != "(":
            raise self._error("expected '(' after IN")
        values: list[str] = []
        while True:
            token = self._take()
            if token in {"(", ")", ","}:
                raise self._error("expected a value in the IN list")
            values.append(token)
            sep = self._take()
            if sep == ")":
                return values
            if sep != ",":
                raise self._error("expected ',' or ')' in the IN list")


def _any_of(key: str, values: list[str]) -> Matcher:
    matchers = [_term(f"{key}:{v}", key) for v in values]
    return lambda tags: any(m(tags) for m in matchers)


def _term(raw: str, text: str) -> Matcher:
    """One tag term: `*` matches all, `*` inside a term is a wildcard, anything else is an exact (lowercased) tag."""
    tag = raw.strip().strip("\"'").lower()
    if not tag:
        raise QueryError(f"Error parsing query: empty tag in scope {{{text}}}")
    if tag == "*":
        return lambda tags: True
    if "*" in tag:
        pattern = re.compile("^" + ".*".join(re.escape(p) for p in tag.split("*")) + "$")
        return lambda tags: any(pattern.match(t) for t in tags)
    return lambda tags: tag in tags


# -- intervals and buckets -------------------------------------------------------------------------------------------


def pick_interval(span: float, requested: float | None = None, *, max_points: int | None = None) -> int:
    """Bucket width in seconds: the requested one (widened along Datadog's ladder when too fine), else ~300 buckets."""
    span = max(span, 1.0)
    limit = max_points or (MAX_POINTS if requested else DEFAULT_MAX_POINTS)
    floor = max(1, math.ceil(requested)) if requested else 1
    if span / floor <= limit:
        return floor
    for step in INTERVAL_LADDER:
        if step >= floor and span / step <= limit:
            return step
    return INTERVAL_LADDER[-1]


def _rollup(ts: Sequence[float], vals: Sequence[float], interval: int, method: str) -> dict[float, float]:
    """Time aggregation of one series into buckets aligned on multiples of `interval` since the epoch."""
    out: dict[float, float] = {}
    counts: dict[float, int] = {}
    for t, v in zip(ts, vals, strict=True):
        b = float(int(t // interval) * interval)
        if b not in out:
            out[b] = 1.0 if method == "count" else v
            counts[b] = 1
            continue
        counts[b] += 1
        if method in {"avg", "sum"}:
            out[b] += v
        elif method == "min":
            out[b] = min(out[b], v)
        elif method == "max":
            out[b] = max(out[b], v)
        elif method == "count":
            out[b] += 1.0
    if method == "avg":
        for b, n in counts.items():
            if n > 1:
                out[b] /= n
    return out


def _groups(tags: frozenset[str], keys: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The groups a series belongs to: one per combination of its values for the keys (`key:N/A` when absent)."""
    if not keys:
        return [()]
    per_key: list[list[str]] = []
    for key in keys:
        prefix = f"{key}:"
        values = sorted(t for t in tags if t.startswith(prefix))
        per_key.append(values or [f"{key}:{NA}"])
    return [tuple(combo) for combo in product(*per_key)]


def evaluate(
    query: MetricQuery, series: Iterable[SeriesData], start: float, end: float, interval: int
) -> list[GroupSeries]:
    """Run a parsed query over stored series between start and end (inclusive, epoch seconds)."""
    # Per group and bucket: [sum, count, min, max] of the rolled-up values of its series.
    acc: dict[tuple[str, ...], dict[float, list[float]]] = {}
    for s in series:
        if not query.matches(s.tags):
            continue
        lo = bisect_left(s.timestamps, start)
        hi = bisect_right(s.timestamps, end)
        if lo >= hi:
            continue
        method = query.rollup or ("sum" if s.is_count or query.modifier else "avg")
        rolled = _rollup(s.timestamps[lo:hi], s.values[lo:hi], interval, method)
        if query.modifier == "as_rate":
            rolled = {b: v / interval for b, v in rolled.items()}
        for group in _groups(s.tags, query.group_by):
            buckets = acc.setdefault(group, {})
            for b, v in rolled.items():
                cell = buckets.get(b)
                if cell is None:
                    buckets[b] = [v, 1.0, v, v]
                else:
                    cell[0] += v
                    cell[1] += 1.0
                    cell[2] = min(cell[2], v)
                    cell[3] = max(cell[3], v)
    pick = _SPACE[query.space_agg]
    return [
        GroupSeries(group, [(b, pick(buckets[b])) for b in sorted(buckets)]) for group, buckets in sorted(acc.items())
    ]


_SPACE: dict[str, Callable[[list[float]], float]] = {
    "avg": lambda c: c[0] / c[1],
    "sum": lambda c: c[0],
    "count": lambda c: c[1],
    "min": lambda c: c[2],
    "max": lambda c: c[3],
}


def reduce_points(points: Sequence[tuple[float, float]], method: str, interval: float = 1.0) -> float | None:
    """Reduce a point list to one value (scalar queries, monitor time aggregation); None when there are no points."""
    if not points:
        return None
    values = [v for _, v in points]
    if method in {"avg", "mean"}:
        return sum(values) / len(values)
    if method == "sum":
        return sum(values)
    if method == "min":
        return min(values)
    if method == "max":
        return max(values)
    if method == "last":
        return values[-1]
    if method == "l2norm":
        return math.sqrt(sum(v * v for v in values))
    if method == "area":
        return sum(values) * interval
    raise QueryError(f"Unsupported aggregator {method!r}; use one of {', '.join(sorted(SCALAR_REDUCERS))}")


# -- formulas --------------------------------------------------------------------------------------------------------
