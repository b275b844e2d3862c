"""The chart spec builder the dashboards are written in: queries from metric, scope and grouping; formulas from the
series' aliases then the chart's own; a query value's one formula; chart specs built inside groups."""

from __future__ import annotations

from gpufarm.setup.dashboards_widgets import Chart, Formula, Series, chart, group, note, scope


def _request(widget: dict[str, object]) -> dict[str, object]:
    definition = widget["definition"]
    assert isinstance(definition, dict)
    [request] = definition["requests"]
    assert isinstance(request, dict)
    return request


def test_a_table_queries_each_series_in_the_shared_scope_and_shows_aliased_series_then_the_charts_formulas() -> None:
    spec = Chart(
        "table",
        "Capacity",
        [
            Series("total", "sum:gpufarm.inventory.gpus.total", "total GPUs"),
            Series("busy", "sum:gpufarm.gpu.idle_state", filter="state:busy", aggregator="max"),
        ],
        where=scope("$environment", "$gpu_model"),
        by=" by {environment}",
        formulas=[Formula("100 * busy / total", "% busy")],
    )
    widget = chart(spec)
    assert widget["definition"]["type"] == "query_table"
    request = _request(widget)
    assert request["queries"] == [
        {
            "data_source": "metrics",
            "name": "total",
            "query": "sum:gpufarm.inventory.gpus.total{$environment,$gpu_model} by {environment}",
            "aggregator": "last",
        },
        {
            "data_source": "metrics",
            "name": "busy",
            "query": "sum:gpufarm.gpu.idle_state{$environment,$gpu_model,state:busy} by {environment}",
            "aggregator": "max",
        },
    ]
    # The unaliased series shows only through the chart's formula; the first column carries the row limit.
    assert request["formulas"] == [
        {"formula": "total", "alias": "total GPUs", "limit": {"count": 50, "order": "desc"}},
        {"formula": "100 * busy / total", "alias": "% busy"},
    ]


def test_an_empty_scope_is_every_source_and_a_timeseries_has_no_aggregators() -> None:
    spec = Chart("timeseries", "Errors", [Series("a", "sum:gpufarm.inventory.source.errors", "errors")], display="bars")
    request = _request(chart(spec))
    assert request["queries"] == [
        {"data_source": "metrics", "name": "a", "query": "sum:gpufarm.inventory.source.errors{*}"}
    ]
    assert request["formulas"] == [{"formula": "a", "alias": "errors"}]
    assert request["display_type"] == "bars"


def test_a_query_value_shows_its_first_formula_or_else_its_first_series() -> None:
    summed = Chart(
        "query_value",
        "Idle",
        [Series("a", "sum:gpufarm.ir.gpus_idle"), Series("b", "sum:gpufarm.ir.gpus_idle_held")],
        formulas=[Formula("a + b", "idle")],
    )
    single = Chart("query_value", "Held", [Series("a", "sum:gpufarm.ir.gpus")], where="$team", precision=1)
    assert _request(chart(summed))["formulas"] == [{"formula": "a + b"}]
    held = chart(single)
    assert _request(held)["formulas"] == [{"formula": "a"}]
    assert held["definition"]["precision"] == 1


def test_a_toplist_ranks_its_one_series_and_groups_build_the_specs_they_hold() -> None:
    top = Chart("toplist", "Memory", [Series("a", "sum:gpufarm.ir.memory.used", "memory used")], by=" by {gpu_ir}")
    built = group("Lease", [note("text"), top])
    inner = built["definition"]["widgets"]
    assert [w["definition"]["type"] for w in inner] == ["note", "toplist"]
    assert inner[1] == chart(top)
    assert _request(inner[1])["formulas"] == [
        {"formula": "a", "alias": "memory used", "limit": {"count": 10, "order": "desc"}}
    ]
