"""The sandbox's metric query engine: parsing, tag filters, grouping, rollups, space aggregation, formulas."""

from __future__ import annotations

import pytest

from gpufarm_sandbox.emulator.query import (
    GroupSeries,
    QueryError,
    SeriesData,
    evaluate,
    parse_filter,
    parse_queries,
    parse_query,
    pick_interval,
    reduce_points,
)
from gpufarm_sandbox.emulator.query_formulas import formula_scalars, formula_series, parse_formula

T0 = 1_700_000_040.0  # a multiple of 60, so 60 s buckets start exactly here


def series(*tags: str, points: list[tuple[float, float]], is_count: bool = False) -> SeriesData:
    ts = [t for t, _ in points]
    return SeriesData(frozenset(tags), ts, [v for _, v in points], is_count)


def run(text: str, data: list[SeriesData], interval: int = 60, start: float = T0, end: float = T0 + 600) -> dict:
    return {g.group_tags: g.points for g in evaluate(parse_query(text), data, start, end, interval)}


# -- parsing ---------------------------------------------------------------------------------------------------------


def test_parse_full_query() -> None:
    q = parse_query("max:gpufarm.gpu.utilization{gpufarm:managed,env:prod} by {ir, host}.rollup(avg, 60)")
    assert (q.space_agg, q.explicit_agg, q.metric) == ("max", True, "gpufarm.gpu.utilization")
    assert q.scope == "gpufarm:managed,env:prod"
    assert q.group_by == ("ir", "host")
    assert (q.rollup, q.rollup_seconds) == ("avg", 60)
    assert q.expression(["ir:ir-1"]) == "max:gpufarm.gpu.utilization{gpufarm:managed,env:prod,ir:ir-1}.rollup(avg, 60)"


def test_parse_defaults_and_modifier_order() -> None:
    q = parse_query("system.cpu.idle{*}")
    assert (q.space_agg, q.explicit_agg, q.group_by, q.rollup) == ("avg", False, (), None)
    assert q.expression() == "system.cpu.idle{*}"
    q = parse_query("sum:jobs.done{*}.as_count().rollup(sum) by {team}")
    assert (q.modifier, q.rollup, q.rollup_seconds, q.group_by) == ("as_count", "sum", None, ("team",))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty query"),
        ("avg:{*}", "expected a metric name"),
        ("avg:cpu", "expected '{'"),
        ("avg:cpu{env:prod", "unclosed"),
        ("avg:cpu{}", "empty scope"),
        ("avg:cpu{*} by {}", "invalid group-by"),
        ("avg:cpu{*}.rollup(median)", ".rollup() takes"),
        ("avg:cpu{*}.rollup(avg, -5)", "rollup interval"),
        ("avg:cpu{*}.fill(zero)", "not supported"),
        ("p95:cpu{*}", "distribution"),
        ("avg:cpu{*} garbage", "unexpected"),
        ("avg:cpu{(env:prod}", "missing ')'"),
        ("avg:cpu{env:a OR}", "unexpected end"),
        ("avg:cpu{env IN a, b}", "expected '(' after IN"),
    ],
)
def test_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(QueryError, match="Error parsing query") as info:
        parse_query(text)
    assert fragment in str(info.value)


def test_parse_queries_splits_top_level_commas_only() -> None:
    queries = parse_queries("avg:a{env:prod,team:x} by {ir},sum:b{*}")
    assert [(q.metric, q.scope) for q in queries] == [("a", "env:prod,team:x"), ("b", "*")]


# -- filters ---------------------------------------------------------------------------------------------------------

TAGS = frozenset({"env:prod", "ir:ir-12", "team:nlp", "host:gpu-1", "gpufarm:managed"})


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("*", True),
        ("env:prod", True),
        ("ENV:Prod", True),  # tags are lowercase; filters are compared lowercased
        ("env:dev", False),
        ("ir:ir-1*", True),
        ("ir:ir-2*", False),
        ("*:nlp", True),
        ("!env:prod", False),
        ("NOT env:dev", True),
        ("env:prod,team:nlp", True),
        ("env:prod,team:cv", False),
        ("env:prod AND team:cv", False),
        ("env:dev OR team:nlp", True),
        ("env:dev OR team:cv", False),
        ("(env:dev OR team:nlp) AND !ir:ir-12", False),
        ("env:prod team:nlp", True),  # adjacency reads as AND
        ("team IN (cv, nlp)", True),
        ("team IN (cv, vision)", False),
        ("team NOT IN (cv, vision)", True),
        ("env:dev OR env:prod, team:nlp", True),  # comma binds tighter than OR
        ("host:gpu-1", True),
    ],
)
def test_filters(scope: str, expected: bool) -> None:
    assert parse_filter(scope)(TAGS) is expected


# -- evaluation ------------------------------------------------------------------------------------------------------


def test_group_by_space_aggregates_per_bucket() -> None:
    data = [
        series("ir:ir-1", "gpu:0", points=[(T0, 10.0), (T0 + 60, 20.0)]),
        series("ir:ir-1", "gpu:1", points=[(T0, 30.0), (T0 + 60, 40.0)]),
        series("ir:ir-2", "gpu:0", points=[(T0, 90.0)]),
    ]
    assert run("avg:m{*} by {ir}", data) == {
        ("ir:ir-1",): [(T0, 20.0), (T0 + 60, 30.0)],
        ("ir:ir-2",): [(T0, 90.0)],
    }
    assert run("sum:m{*} by {ir}", data)[("ir:ir-1",)] == [(T0, 40.0), (T0 + 60, 60.0)]
    assert run("min:m{*} by {ir}", data)[("ir:ir-1",)] == [(T0, 10.0), (T0 + 60, 20.0)]
    assert run("max:m{*} by {ir}", data)[("ir:ir-1",)] == [(T0, 30.0), (T0 + 60, 40.0)]
    assert run("count:m{*} by {ir}", data)[("ir:ir-1",)] == [(T0, 2.0), (T0 + 60, 2.0)]
    assert run("avg:m{*}", data) == {(): [(T0, 130.0 / 3), (T0 + 60, 30.0)]}


def test_missing_group_key_goes_to_na_and_multi_valued_series_join_each_group() -> None:
    data = [
        series("ir:ir-1", "ir:ir-2", points=[(T0, 50.0)]),  # a shared node held by two IRs
        series("team:x", points=[(T0, 7.0)]),
    ]
    assert run("avg:m{*} by {ir}", data) == {
        ("ir:N/A",): [(T0, 7.0)],
        ("ir:ir-1",): [(T0, 50.0)],
        ("ir:ir-2",): [(T0, 50.0)],
    }
    two_keys = run("avg:m{*} by {ir,team}", data)
    assert set(two_keys) == {("ir:N/A", "team:x"), ("ir:ir-1", "team:N/A"), ("ir:ir-2", "team:N/A")}


def test_filter_and_time_window_bounds() -> None:
    data = [
        series("ir:ir-1", points=[(T0 - 60, 1.0), (T0, 2.0), (T0 + 600, 3.0), (T0 + 660, 4.0)]),
        series("ir:ir-9", points=[(T0, 100.0)]),
    ]
    assert run("avg:m{!ir:ir-9}", data) == {(): [(T0, 2.0), (T0 + 600, 3.0)]}


def test_rollup_time_aggregation_then_space_aggregation() -> None:
    pts = [(T0 + s, float(s)) for s in range(0, 120, 15)]  # 0..105 in two 60 s buckets
    data = [series("h:a", points=pts)]
    assert run("avg:m{*}", data) == {(): [(T0, 22.5), (T0 + 60, 82.5)]}
    assert run("avg:m{*}.rollup(max)", data) == {(): [(T0, 45.0), (T0 + 60, 105.0)]}
    assert run("avg:m{*}.rollup(sum)", data) == {(): [(T0, 90.0), (T0 + 60, 330.0)]}
    assert run("avg:m{*}.rollup(count)", data) == {(): [(T0, 4.0), (T0 + 60, 4.0)]}
    assert run("avg:m{*}.rollup(min)", data, interval=120) == {(): [(T0, 0.0)]}


def test_count_metrics_sum_within_a_bucket_and_as_rate_divides() -> None:
    data = [series("h:a", points=[(T0, 3.0), (T0 + 10, 3.0)], is_count=True)]
    assert run("sum:m{*}", data) == {(): [(T0, 6.0)]}
    assert run("sum:m{*}.as_rate()", data) == {(): [(T0, 0.1)]}


def test_pick_interval_follows_datadog_ladder() -> None:
    assert pick_interval(86400) == 300  # the recorded v1 query: one day -> 300 s, 288 points
    assert pick_interval(3600) == 15
    assert pick_interval(3600, 5) == 5  # a requested interval is kept when it fits
    assert pick_interval(86400 * 7, 5) == 600  # ... and widened when it would give too many points
    assert pick_interval(0.2) == 1


def test_reduce_points() -> None:
    pts = [(0.0, 1.0), (60.0, 3.0), (120.0, 2.0)]
    assert reduce_points(pts, "avg") == 2.0
    assert reduce_points(pts, "mean") == 2.0
    assert reduce_points(pts, "sum") == 6.0
    assert reduce_points(pts, "min") == 1.0
    assert reduce_points(pts, "max") == 3.0
    assert reduce_points(pts, "last") == 2.0
    assert reduce_points(pts, "l2norm") == pytest.approx(14**0.5)
    assert reduce_points(pts, "area", 60) == 360.0
    assert reduce_points([], "avg") is None
    with pytest.raises(QueryError, match="Unsupported aggregator"):
        reduce_points(pts, "percentile")


# -- formulas --------------------------------------------------------------------------------------------------------


def test_formula_precedence_and_constants() -> None:
    f = parse_formula("a / b * 100 - -c")
    assert f.names == ("a", "b", "c")
    assert f.compute({"a": 1.0, "b": 4.0, "c": 2.0}) == 27.0
    assert parse_formula("(a + b) / 2").compute({"a": 1.0, "b": 3.0}) == 2.0
    assert parse_formula("a / b").compute({"a": 1.0, "b": 0.0}) is None
    assert parse_formula("a + 1").compute({}) is None


@pytest.mark.parametrize("text", ["", "a +", "abs(a)", "a $ b", "(a + b", "a b"])
def test_formula_errors(text: str) -> None:
    with pytest.raises(QueryError, match="formula"):
        parse_formula(text)


def test_formula_series_matches_groups_and_broadcasts_ungrouped() -> None:
    used = [GroupSeries(("ir:ir-1",), [(T0, 4.0), (T0 + 60, 8.0)]), GroupSeries(("ir:ir-2",), [(T0, 1.0)])]
    total = [GroupSeries(("ir:ir-1",), [(T0, 8.0), (T0 + 60, 8.0)]), GroupSeries(("ir:ir-3",), [(T0, 8.0)])]
    out = formula_series(parse_formula("a / b * 100"), {"a": used, "b": total})
    assert out == [GroupSeries(("ir:ir-1",), [(T0, 50.0), (T0 + 60, 100.0)])]
    flat = [GroupSeries((), [(T0, 2.0)])]
    out = formula_series(parse_formula("a * k"), {"a": used, "k": flat})
    assert [(g.group_tags, g.points) for g in out] == [(("ir:ir-1",), [(T0, 8.0)]), (("ir:ir-2",), [(T0, 2.0)])]
    with pytest.raises(QueryError, match="unknown query name 'z'"):
        formula_series(parse_formula("z"), {"a": used})


def test_formula_scalars() -> None:
    a = {("ir:ir-1",): 4.0, ("ir:ir-2",): None}
    b = {(): 2.0}
    assert formula_scalars(parse_formula("a / b"), {"a": a, "b": b}) == {("ir:ir-1",): 2.0, ("ir:ir-2",): None}
