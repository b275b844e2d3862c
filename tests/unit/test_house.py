"""The house rules no linter checks: one idea per file (no module over 600 lines) and no function above cyclomatic
complexity 15 as radon counts it, in the three distributions (ruff's own count stops short of radon's: it leaves
out boolean operators and comprehensions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for top in ("layers/gpufarm/gpufarm", "node/gpufarm_node", "sandbox/gpufarm_sandbox")
    for p in (ROOT / top).rglob("*.py")
)
MAX_LINES = 600
MAX_COMPLEXITY = 15

pytestmark = pytest.mark.unit


def test_the_distributions_are_where_the_rules_look() -> None:
    assert len(SOURCES) > 200


def test_no_module_holds_more_than_one_idea() -> None:
    long = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_function_is_above_complexity_15() -> None:
    tangled = {
        f"{p.relative_to(ROOT)}:{block.lineno} {block.fullname}": block.complexity
        for p in SOURCES
        for block in cc_visit(p.read_text())
        if block.complexity > MAX_COMPLEXITY and block.letter in "FM"
    }
    assert tangled == {}
