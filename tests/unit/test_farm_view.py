"""The farm as reports read it: the view of the validated farm, and its dump kept beside the YAML's hash
(gpufarm.core.config.farm_view, gpufarm.adapters.farm_dump)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from fakes import FARM_YAML

from gpufarm.adapters import farm_dump
from gpufarm.core.accounting.override_terms import Override, apply
from gpufarm.core.config.budget_terms import BudgetPeriod
from gpufarm.core.config.farm import FarmConfig, FarmConfigError, parse_farm
from gpufarm.core.config.farm_view import FarmDumpMismatch, FarmView, QuotaView
from gpufarm.core.config.pool_kind import PoolKind
from gpufarm.core.config.rate_terms import Cloud
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard
from gpufarm.reporting.quota_changes import changed

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = (
    "budgets:\n  - {team: nlp, period: month, gpu_hours: 1000}\n"
    "  - {team: nlp, project: llm, period: quarter, gpu_hours: 50.5}\n"
    "  - {team: vision, period: month, amount: 1234.50, alerts: [90, 25]}\n"
)
RATES = (
    "rates:\n  currency: USD\n  discounts: {savings-plan: 0.72}\n  mig_fractions: {1g.10gb: 0.125}\n"
    "  environments:\n    hpc: {per_gpu_hour: {H100: 2.10}}\n"
    "    cloud: {cloud: aws, region: us-east-1, instance_types: {H100: p5.48xlarge}, purchase: savings-plan,"
    " per_gpu_hour: {A100: 3.20}}\n"
)
YAML = FARM_YAML.replace("defaults:", BUDGETS + RATES + "defaults:").replace(
    "  vision:\n", "  vision:\n    cost_center: CC-1234\n    channel: C0000000042\n"
)
UNTIL = datetime(2027, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 7, tzinfo=UTC)


def _quotas(farm: FarmConfig | FarmView) -> dict[str, dict[str, dict[str, tuple[int, int | None]]]]:
    return {
        team: {env: {m: (q.gpus, q.hard_limit) for m, q in models.items()} for env, models in spec.quotas.items()}
        for team, spec in farm.teams.items()
    }


def test_the_view_holds_what_the_validated_farm_holds() -> None:
    farm = parse_farm(YAML)
    view = FarmView.of(farm)
    assert _quotas(view) == _quotas(farm) and view.teams
    assert [(b.team, b.project, b.period, b.gpu_hours, b.label()) for b in view.budgets] == [
        (b.team, b.project, b.period, b.gpu_hours, b.label()) for b in farm.budgets
    ]
    assert view.budgets[1].period is BudgetPeriod.QUARTER and view.budgets[1].label() == "nlp/llm"
    money = [(b.gpu_hours, b.amount, b.in_money, b.limit, b.alerts) for b in view.budgets]
    assert money == [(b.gpu_hours, b.amount, b.in_money, b.limit, b.alerts) for b in farm.budgets]
    assert money[2] == (None, Decimal("1234.50"), True, 1234.5, (25, 90))
    assert {t: (v.cost_center, v.channel) for t, v in view.teams.items()} == {
        t: (v.cost_center, v.channel) for t, v in farm.teams.items()
    }
    assert view.teams["vision"].cost_center == "CC-1234"
    assert {n: (p.kind, p.gpu_models) for n, p in view.environments.items()} == {
        n: (p.kind, p.gpu_models) for n, p in farm.environments.items()
    }
    assert view.environments["slices"].kind is PoolKind.SHARED
    # Every section is carried, as validation left it: a section a report starts reading needs no new loading.
    assert view.sections == json.loads(farm.model_dump_json())
    with pytest.raises(ValidationFailed) as by_view:
        view.team("ghost\x07")
    with pytest.raises(ValidationFailed) as by_farm:
        farm.team("ghost\x07")
    assert by_view.value.message == by_farm.value.message and "ghost?" in by_view.value.message


def test_the_views_rate_card_prices_as_the_farms() -> None:
    farm = parse_farm(YAML)
    listed = {PriceKey(Cloud.AWS, "us-east-1", "p5.48xlarge"): CloudPrice(Decimal("98.32"), 8, "USD", NOW, stale=True)}
    by_view, by_farm = RateCard(FarmView.of(farm).rates, listed), RateCard(farm.rates, listed)
    assert by_view.currency == by_farm.currency == "USD"
    for env, model, profile in [
        ("hpc", "H100", None),
        ("cloud", "H100", None),
        ("cloud", "A100", "1g.10gb"),
        ("cloud", "H100", "3g.40gb"),
        ("slices", "L4", None),
    ]:
        assert by_view.slice_rate(env, model, profile) == by_farm.slice_rate(env, model, profile)
    cloud = by_view.rate("cloud", "H100")
    assert cloud is not None and cloud.per_gpu_hour == Decimal("98.32") / 8 * Decimal("0.72") and cloud.stale
    assert by_view.rate("slices", "L4") is None
    assert list(by_view.price_keys()) == list(by_farm.price_keys()) == list(listed)


def test_quota_changes_apply_to_the_view_as_to_the_farm() -> None:
    farm = parse_farm(YAML)
    team, env = next((t, e) for t, spec in farm.teams.items() for e in spec.quotas)
    model = next(iter(farm.teams[team].quotas[env]))
    changes = [
        Override(1, team, env, model, 4, UNTIL, "U1"),
        Override(2, team, env, "NEW-MODEL", 2, UNTIL, None),
        Override(3, team, env, model, -1000, UNTIL, None),
        Override(4, "not-a-team", env, model, 8, UNTIL, None),
    ]
    for upto in range(len(changes) + 1):
        assert _quotas(changed(FarmView.of(farm), changes[:upto])) == _quotas(apply(farm, changes[:upto]))
    assert changed(FarmView.of(farm), changes[:2]).teams[team].quotas[env]["NEW-MODEL"] == QuotaView(2, 2)


@pytest.mark.parametrize(
    "broken",
    [
        [],
        {"budgets": []},
        {"teams": {}, "budgets": {}},
        {"teams": {"a": {"quotas": {"p": {"H100": {"gpus": -1, "hard_limit": None}}}}}, "budgets": []},
        {"teams": {"a": {"quotas": {"p": {"H100": {"gpus": True, "hard_limit": None}}}}}, "budgets": []},
        {"teams": {}, "budgets": [{"team": "a", "project": None, "period": "week", "gpu_hours": 1}]},
        {"teams": {}, "budgets": [{"team": "a", "project": None, "period": "month", "gpu_hours": float("nan")}]},
        {"teams": {}, "budgets": [{"team": 1, "project": None, "period": "month", "gpu_hours": 1}]},
    ],
)
def test_a_dump_of_another_shape_is_refused(broken: object) -> None:
    with pytest.raises(FarmDumpMismatch):
        FarmView.from_dump(broken)


def test_the_farm_is_validated_once_per_text_and_code_then_read_from_its_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = farm_dump.farm_view(YAML, cache)
    kept = list(cache.glob("farm-*.json"))
    assert [p.name for p in kept] == [f"farm-{farm_dump.dump_key(YAML)}.json"]
    assert kept[0].stat().st_mode & 0o077 == 0 and cache.stat().st_mode & 0o777 == 0o700  # the user's alone

    def no_validation(text: str) -> FarmConfig:
        raise AssertionError("validated again")

    monkeypatch.setattr("gpufarm.core.config.farm.parse_farm", no_validation)
    again = farm_dump.farm_view(YAML, cache)
    assert _quotas(again) == _quotas(first) and again.sections == first.sections
    # Another text, or the same text under other validating code, is another key: validated again.
    assert farm_dump.dump_key(YAML + "\n") != farm_dump.dump_key(YAML)
    with pytest.raises(AssertionError, match="validated again"):
        farm_dump.farm_view(YAML + "\n", cache)
    monkeypatch.setattr(farm_dump, "validating_code", lambda: b"other code")
    assert farm_dump.dump_key(YAML) != kept[0].stem.removeprefix("farm-")


@pytest.mark.parametrize("kept", ["not json", json.dumps({"teams": []}), "x" * (farm_dump.MAX_DUMP_BYTES + 1)])
def test_a_dump_that_cannot_be_read_is_validated_again(tmp_path: Path, kept: str) -> None:
    path = tmp_path / f"farm-{farm_dump.dump_key(YAML)}.json"
    path.write_text(kept)
    view = farm_dump.farm_view(YAML, tmp_path)
    assert _quotas(view) == _quotas(parse_farm(YAML))
    assert json.loads(path.read_text()) == view.sections


def test_an_invalid_farm_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    with pytest.raises(FarmConfigError, match="is not an environment"):
        farm_dump.farm_view(YAML.replace("budgets:", "idle:\n  environments: {nowhere: {}}\nbudgets:"), tmp_path)
    with pytest.raises(FarmConfigError):
        farm_dump.farm_view("teams: [", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_cache_that_cannot_be_written_costs_only_the_speed(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert _quotas(farm_dump.farm_view(YAML, blocked / "gpufarm")) == _quotas(parse_farm(YAML))


def test_the_cache_is_the_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert farm_dump.cache_directory() == tmp_path / "gpufarm"
    monkeypatch.setenv("XDG_CACHE_HOME", " ")
    assert farm_dump.cache_directory() == Path.home() / ".cache" / "gpufarm"


SCRIPT = r"""
import sys
from gpufarm.adapters.farm_dump import farm_view
import gpufarm.cli, gpufarm.cli.report, gpufarm.handlers.runtime, gpufarm.reporting.make
import gpufarm.adapters.datadog_reads, gpufarm.reporting.render_table, gpufarm.reporting.render_csv
import gpufarm.reporting.render_json, gpufarm.reporting.render_html, gpufarm.adapters.price_cache
import gpufarm.reporting.chargeback, gpufarm.reporting.render_chargeback
import gpufarm.reporting.outlook, gpufarm.reporting.render_outlook
from gpufarm.core.money.card import RateCard
view = farm_view(open(sys.argv[1]).read())
rate = RateCard(view.rates).rate("hpc", "H100")
models = ("pydantic", "yaml", "gpufarm.core.config.farm", "gpufarm.core.config.rates")
print(sorted(view.teams), rate and rate.per_gpu_hour, [b.in_money for b in view.budgets],
      sorted(m for m in models if m in sys.modules))
"""


def test_a_report_of_an_unchanged_farm_loads_neither_pydantic_nor_the_models(tmp_path: Path) -> None:
    farm_file = tmp_path / "farm.yaml"
    farm_file.write_text(YAML)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(farm_file)],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    teams = f"{sorted(parse_farm(YAML).teams)} 2.1 [False, False, True]"
    first = "['gpufarm.core.config.farm', 'gpufarm.core.config.rates', 'pydantic', 'yaml']"
    assert run() == f"{teams} {first}"  # the first read validates
    assert run() == f"{teams} []"
