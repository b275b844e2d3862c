"""Every test carries exactly one cost marker, given by its folder; anything else fails collection."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway suite laid out like tests/, under the project's own root conftest."""
    tests = pytester.mkdir("tests")
    (tests / "conftest.py").write_text(ROOT_CONFTEST.read_text())
    for folder in ("unit", "contract", "integration"):
        (tests / folder).mkdir()
        (tests / folder / f"test_{folder}_one.py").write_text("def test_one():\n    pass\n")
    return pytester


def test_each_folder_marks_its_tests(suite: pytest.Pytester) -> None:
    for marker in ("unit", "contract", "integration"):
        result = suite.runpytest_inprocess("tests", "-q", "-m", marker, "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1, deselected=2)


@pytest.mark.parametrize(
    ("path", "source", "reported"),
    [
        (
            "tests/test_stray.py",
            "def test_stray():\n    pass\n",
            "test_stray.py::test_stray: not under tests/unit, tests/contract, tests/integration, tests/hardening, "
            "tests/security",
        ),
        (
            "tests/unit/test_claims_contract.py",
            "import pytest\npytestmark = pytest.mark.contract\ndef test_x():\n    pass\n",
            "cost markers ['contract', 'unit'], expected only 'unit'",
        ),
    ],
)
def test_a_test_with_no_cost_or_two_fails_collection(
    suite: pytest.Pytester, path: str, source: str, reported: str
) -> None:
    (suite.path / path).write_text(source)
    result = suite.runpytest_inprocess("tests", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert reported in result.stderr.str()
