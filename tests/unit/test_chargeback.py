"""The month's chargeback (`gpufarm report --month 2026-11 --format chargeback`): one row per team x project x
environment with its cost center, GPU-hours by kind and their cost; totals that equal the month's ledger to the cent;
unpriced rows flagged and left out of the money; a bad month is exit 2 and writes nothing."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import FARM_YAML, FakeClock, FakeIncidents

from gpufarm.cli.report import report
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.money.card import round_cents
from gpufarm.handlers import runtime as rt
from gpufarm.reporting.chargeback import DEFAULT_COST_CENTER, make_chargeback
from gpufarm.reporting.render_chargeback import COLUMNS, TOTAL, render_chargeback

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, tzinfo=UTC)
RATES = {
    ("hpc", "H100"): Decimal("2.10"),
    ("cloud", "H100"): Decimal("3.000001"),
    ("slices", "A100"): Decimal("1.234567"),
}
FARM = (
    FARM_YAML.replace("  nlp:\n    max_days: 30\n", "  nlp:\n    max_days: 30\n    cost_center: CC-4100\n")
    + """rates:
  currency: EUR
  environments:
    hpc: {per_gpu_hour: {H100: 2.10}}
    cloud: {per_gpu_hour: {H100: 3.000001}}
    slices: {per_gpu_hour: {A100: 1.234567}}
"""
)
# (team, project, pool, model, {month: GPU-hours held}): ended leases, so the month's hours are those it accrued.
LEASES = [
    ("nlp", "llm", "hpc", "H100", {"2026-10": "50.000", "2026-11": "100.333"}),
    ("nlp", "llm", "hpc", "H100", {"2026-11": "33.337"}),
    ("nlp", "llm", "slices", "A100", {"2026-11": "7.777"}),
    ("nlp", "llm", "cloud", "H100", {"2026-11": "10.005"}),
    ("nlp", "llm", "cloud", "A100", {"2026-11": "4.000"}),  # cloud's A100 has no rate: the row is partly priced
    ("vision", "vit", "cloud", "A100", {"2026-11": "12.500"}),  # none priced
    ("vision", "vit", "hpc", "H100", {"2026-11": "1.005"}),
    ("vision", "old", "hpc", "H100", {"2026-10": "99.000"}),  # nothing in November: no row
]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIncidents]:
    for name in ("DD_API_KEY", "DD_APP_KEY", "GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    clock = FakeClock(NOW)
    incidents = FakeIncidents(clock)
    for team, project, env, model, months in LEASES:
        held = sum(float(h) for h in months.values())
        incidents.create(
            f"GPU request: {team}/{project}",
            {
                f.STATE: "resolved",
                f.PHASE: "reclaimed",
                f.TEAM: team,
                f.PROJECT: project,
                f.ENVIRONMENT: env,
                f.GPU_MODEL: model,
                f.GPU_COUNT: "1",
                f.ALLOCATED_AT: isoformat(datetime(2026, 10, 20, tzinfo=UTC)),
                f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 11, 30, tzinfo=UTC)),
                f.GPU_HOURS_HELD: f"{held:.3f}",
                f.GPU_HOURS_BUSY: f"{held / 2:.3f}",
                f.GPU_HOURS_IDLE: f"{held / 4:.3f}",
                f.GPU_HOURS_IDLE_HELD: f"{held / 8:.3f}",
                f.GPU_HOURS_UNMEASURED: f"{held / 4:.3f}",
                f.GPU_HOURS_BY_MONTH: [f"{m}={h}" for m, h in months.items()],
                f.GPU_HOURS_MONTHS: sorted(months),
            },
        )
    rt.override(farm=parse_farm(FARM), clock=clock, incidents=incidents)
    yield incidents
    rt.reset()


def _ledger() -> dict[tuple[str, str, str], Decimal]:
    """The month's ledger from the incidents' own figures: November's held GPU-hours x the written rate, summed per
    team, project and pool (unrounded); unpriced leases have no money."""
    out: dict[tuple[str, str, str], Decimal] = {}
    for team, project, env, model, months in LEASES:
        rate, hours = RATES.get((env, model)), months.get("2026-11")
        if rate is not None and hours is not None:
            key = (team, project, env)
            out[key] = out.get(key, Decimal(0)) + Decimal(hours) * rate
    return out


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_one_row_per_team_project_and_pool_with_cost_center_hours_and_money(store: FakeIncidents) -> None:
    rows = _rows(render_chargeback(make_chargeback(store, FarmView.of(parse_farm(FARM)), NOW, "2026-11")))
    assert list(rows[0]) == list(COLUMNS)
    keys = [(r["team"], r["project"], r["environment"]) for r in rows]
    assert keys == [
        ("nlp", "llm", "cloud"),
        ("nlp", "llm", "hpc"),
        ("nlp", "llm", "slices"),
        ("vision", "vit", "cloud"),
        ("vision", "vit", "hpc"),
        (TOTAL, "", ""),
    ]
    by = {(r["team"], r["environment"]): r for r in rows}
    hpc = by[("nlp", "hpc")]
    assert hpc["cost_center"] == "CC-4100" and by[("vision", "hpc")]["cost_center"] == DEFAULT_COST_CENTER
    assert hpc["leases"] == "2" and hpc["gpu_hours_held"] == "133.670" and hpc["currency"] == "EUR"
    assert hpc["cost_total"] == f"{round_cents(Decimal('133.670') * Decimal('2.10')):.2f}" == "280.71"
    # The kinds split the held hours: busy, idle (no process), idle-held, unmeasured.
    kinds = sum(float(hpc[f"gpu_hours_{k}"]) for k in ("busy", "idle", "idle_held", "unmeasured"))
    assert kinds == pytest.approx(133.67, abs=0.01) and float(hpc["gpu_hours_idle_held"]) > 0
    assert Decimal(hpc["cost_busy"]) == round_cents(Decimal(hpc["gpu_hours_busy"]) * Decimal("2.10"))


def test_unpriced_rows_are_flagged_and_left_out_of_the_money(store: FakeIncidents) -> None:
    rows = _rows(render_chargeback(make_chargeback(store, FarmView.of(parse_farm(FARM)), NOW, "2026-11")))
    by = {(r["team"], r["environment"]): r for r in rows}
    none, partial = by[("vision", "cloud")], by[("nlp", "cloud")]
    assert none["priced"] == "no" and none["cost_total"] == "" and none["cost_busy"] == ""
    assert none["unpriced_gpu_hours"] == "12.500" and none["gpu_hours_held"] == "12.500"
    assert partial["priced"] == "partial" and partial["unpriced_gpu_hours"] == "4.000"
    assert partial["cost_total"] == f"{round_cents(Decimal('10.005') * Decimal('3.000001')):.2f}"
    total = by[(TOTAL, "")]
    assert total["priced"] == "incomplete: 2 of 5 rows unpriced or partly priced"
    assert total["unpriced_gpu_hours"] == "16.500"


def test_totals_equal_the_months_ledger_to_the_cent(store: FakeIncidents) -> None:
    rows = _rows(render_chargeback(make_chargeback(store, FarmView.of(parse_farm(FARM)), NOW, "2026-11")))
    *lines, total = rows
    # The file adds up: the totals line is the sum of the rounded rows.
    assert Decimal(total["cost_total"]) == sum(Decimal(r["cost_total"]) for r in lines if r["cost_total"])
    for kind in ("busy", "idle", "idle_held", "unmeasured"):
        assert Decimal(total[f"cost_{kind}"]) == sum(Decimal(r[f"cost_{kind}"]) for r in lines if r[f"cost_{kind}"])
    # And it is the ledger's: each row's ledger figure rounded the same way, then summed.
    ledger = _ledger()
    assert {
        (r["team"], r["project"], r["environment"]): Decimal(r["cost_total"]) for r in lines if r["cost_total"]
    } == {k: round_cents(v) for k, v in ledger.items()}
    assert Decimal(total["cost_total"]) == sum(round_cents(v) for v in ledger.values())
    assert float(total["gpu_hours_held"]) == pytest.approx(sum(float(m.get("2026-11", 0)) for *_, m in LEASES))


def test_the_command_writes_the_csv(store: FakeIncidents, tmp_path: Path) -> None:
    out = tmp_path / "nov.csv"
    done = CliRunner().invoke(report, ["--month", "2026-11", "--format", "chargeback", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert _rows(out.read_text())[-1]["team"] == TOTAL


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--month", "2026-13"], "no month 13"),
        (["--month", "nov"], "use YYYY-MM"),
        (["--month", "2027-01"], "has not started yet"),
        ([], "needs --month"),
        (["--since", "30d"], "needs --month"),
        (["--month", "2026-11", "--team", "nlp"], "no --team or --project"),
        (["--month", "2026-11", "--outlook"], "not a chargeback"),
    ],
)
def test_a_bad_month_is_exit_2_and_writes_nothing(
    store: FakeIncidents, tmp_path: Path, args: list[str], words: str
) -> None:
    out = tmp_path / "cb.csv"
    done = CliRunner().invoke(report, [*args, "--format", "chargeback", "--out", str(out)])
    assert done.exit_code == 2, done.output
    assert words in done.output and "nothing was written" in done.output
    assert list(tmp_path.iterdir()) == []


def test_a_cost_center_is_checked_at_load() -> None:
    bad = FARM.replace("cost_center: CC-4100", "cost_center: '=HYPERLINK(1)'")
    with pytest.raises(FarmConfigError, match="cost_center"):
        parse_farm(bad)


def test_hand_edited_fields_are_inert_in_the_file(store: FakeIncidents) -> None:
    record = store.by_ir(1)
    store.records[record.id] = record.model_copy(update={"fields": {**record.fields, f.PROJECT: "=HYPERLINK(1)"}})
    text = render_chargeback(make_chargeback(store, FarmView.of(parse_farm(FARM)), NOW, "2026-11"))
    assert "'=HYPERLINK(1)" in text and ",=HYPERLINK" not in text
