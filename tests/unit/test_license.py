"""The LICENSE file is the full text of the license every distribution declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = ("pyproject.toml", "layers/gpufarm/pyproject.toml", "node/pyproject.toml", "sandbox/pyproject.toml")


def test_every_distribution_declares_apache_2() -> None:
    declared = {name: tomllib.loads((ROOT / name).read_text())["project"]["license"] for name in PYPROJECTS}
    assert declared == dict.fromkeys(PYPROJECTS, "Apache-2.0")


def test_license_file_is_the_full_apache_2_text() -> None:
    text = " ".join((ROOT / "LICENSE").read_text().split())
    assert text.startswith("Apache License Version 2.0, January 2004 http://www.apache.org/licenses/")
    for clause in ("1. Definitions.", "4. Redistribution.", "9. Accepting Warranty or Additional Liability."):
        assert clause in text
    assert text.endswith(
        "See the License for the specific language governing permissions and limitations under the License."
    )
