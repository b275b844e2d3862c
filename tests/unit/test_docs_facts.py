"""The docs say what the repository holds: facts a page states are read from the page and checked against the tree.

- the functions docs/architecture.md lists are template.yaml's AWS::Serverless::Function resources, each in its
  folder, and every "N functions" in the docs counts them;
- every path of the layout table exists, and every package of the runtime (and of its core) is in the docs;
- every key of the farm YAML is in docs/configure.md, and no key that does not exist, with its default;
- every module (and name in it) the docs mention exists, so a page follows the code when a module moves;
- the README stays a front door, and every relative link of the docs points at a file that exists.
"""

from __future__ import annotations

import ast
import re
import tomllib
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpufarm.core.config.farm import FarmConfig
from gpufarm_sandbox.localhost.template import load_yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = ROOT / "docs/architecture.md"
CONFIGURE = ROOT / "docs/configure.md"
RUNTIME = ROOT / "layers" / "gpufarm" / "gpufarm"
CORE = RUNTIME / "core"
README_MAX_LINES = 250
# Pages whose relative links must resolve: the README and everything a reader reaches from it.
PAGES = (README, ROOT / "CHANGELOG.md", ROOT / "benchmarks/RESULTS.md", *sorted(DOCS.glob("*.md")))
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
NUMBERS = {word: n for n, word in enumerate(_WORDS)}
_COUNTED_FUNCTIONS = re.compile(rf"\b({'|'.join(NUMBERS)})\s+(?:AWS\s+)?(?:Lambda\s+)?functions\b", re.IGNORECASE)
_CODE_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_TICKED = re.compile(r"`([^`]+)`")
_MAP_KEY = re.compile(r"<[^<>]+>")
# A dotted name of gpufarm's code as the docs write it (`gpufarm.core.idle.keeps`, `gpufarm_sandbox.clouds`); metric
# names (`gpufarm.gpu.utilization`) start otherwise.
_CODE_NAME = re.compile(
    r"(?<![\w/.-])((?:gpufarm\.(?:core|adapters|handlers|setup|profiling|reporting)|gpufarm_sandbox|gpufarm_node)"
    r"(?:\.\w+)*)"
)


def _section(path: Path, heading: str) -> str:
    """The text under a `## heading` of a page, up to the next heading of that level."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"{path.relative_to(ROOT)} has no section '## {heading}'"
    return match.group(1)


def _rows(text: str) -> list[list[str]]:
    """The body rows of the markdown tables in `text`, as lists of cells (header and rule rows left out)."""
    rows: list[list[str]] = []
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        if i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: ") and lines[i + 1].startswith("|"):
            continue  # the header row
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


# -- the functions ---------------------------------------------------------------------------------------------------


def _template_functions() -> dict[str, dict[str, Any]]:
    raw = load_yaml((ROOT / "template.yaml").read_text())
    return {k: v for k, v in raw["Resources"].items() if v["Type"] == "AWS::Serverless::Function"}


def test_the_documented_functions_are_the_templates() -> None:
    functions = _template_functions()
    rows = _rows(_section(ARCHITECTURE, "The functions"))
    documented = {_TICKED.findall(row[0])[0]: _TICKED.findall(row[1])[0] for row in rows}
    assert sorted(documented) == sorted(functions)
    assert documented == {name: f"{fn['Properties']['CodeUri']}/" for name, fn in functions.items()}
    assert all((ROOT / code).is_dir() for code in documented.values())


def test_every_count_of_functions_in_the_docs_is_the_templates() -> None:
    counted = {
        f"{page.relative_to(ROOT)}: {match.group(0)!r}"
        for page in PAGES
        for match in _COUNTED_FUNCTIONS.finditer(page.read_text(encoding="utf-8"))
        if NUMBERS[match.group(1).lower()] != len(_template_functions())
    }
    assert counted == set()


# -- the layout and the packages -------------------------------------------------------------------------------------


def _layout_paths() -> list[str]:
    return [path for row in _rows(_section(ARCHITECTURE, "Layout")) for path in _TICKED.findall(row[0])]


def test_every_path_of_the_layout_exists() -> None:
    paths = _layout_paths()
    assert paths
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_every_package_of_the_runtime_is_in_the_layout() -> None:
    packages = sorted(p.name for p in RUNTIME.iterdir() if (p / "__init__.py").is_file())
    assert "core" in packages
    listed = {path.rstrip("/") for path in _layout_paths()}
    assert [p for p in packages if str((RUNTIME / p).relative_to(ROOT)) not in listed] == []


def _documented_core_packages() -> list[str]:
    """The core's packages, top to bottom, as the packages section lists them (siblings on one line)."""
    section = _section(ARCHITECTURE, "Packages and their allowed direction")
    lines = re.findall(r"^\d+\. (.*?):", section, re.MULTILINE)
    return [name for line in lines for name in _TICKED.findall(line)]


def test_the_core_packages_are_the_documented_ones() -> None:
    documented = _documented_core_packages()
    assert documented and len(documented) == len(set(documented))
    subpackages = {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in CORE.glob("*.py") if p.name != "__init__.py"}
    assert sorted(subpackages | modules) == sorted(documented)


def test_the_documented_direction_is_the_one_lint_imports_enforces() -> None:
    """The packages section's order (siblings on one line) is the core's `layers` contract in pyproject.toml."""
    section = _section(ARCHITECTURE, "Packages and their allowed direction")
    lines = re.findall(r"^\d+\. (.*?):", section, re.MULTILINE)
    documented = [" | ".join(_TICKED.findall(line)) for line in lines]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [core] = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["gpufarm.core"]]
    assert core["layers"] == documented


# -- the farm YAML ---------------------------------------------------------------------------------------------------


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _leaves(annotation: Any, path: str, field: FieldInfo | None) -> Iterator[tuple[str, FieldInfo | None]]:
    """Each key a value of this type holds, with its field (None under a mapping's key: no default of its own).

    Mapping keys are written `<*>`, list items `[]`; optional and annotated types are their inner type."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        yield from _leaves(args[0], path, field)
    elif origin in (typing.Union, types.UnionType) and len([a for a in args if a is not type(None)]) == 1:
        yield from _leaves(next(a for a in args if a is not type(None)), path, field)
    elif (model := _model(annotation)) is not None:
        yield from _farm_keys(model, f"{path}.")
    elif origin is dict:
        yield from _leaves(args[1], f"{path}.<*>", None)
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis and _model(args[0]) is not None:
        yield from _leaves(args[0], f"{path}[]", None)
    else:
        yield path, field


def _farm_keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo | None]]:
    for name, field in model.model_fields.items():
        yield from _leaves(field.annotation, f"{prefix}{name}", field)


def _documented_keys() -> dict[str, str]:
    """Key -> its default cell, from the rows of docs/configure.md's tables whose first cell is one key."""
    keys: dict[str, str] = {}
    for row in _rows(CONFIGURE.read_text(encoding="utf-8")):
        if len(row) == 4 and re.fullmatch(r"`[^`\s]+`", row[0]):
            key = _MAP_KEY.sub("<*>", row[0].strip("`"))
            assert key not in keys, f"{key} is documented twice"
            keys[key] = row[2]
    return keys


def _default_cell(field: FieldInfo) -> str | None:
    """How docs/configure.md writes a field's default, or None where the cell is prose (no default, a list)."""
    if field.is_required():
        return "required"
    value = field.default
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and not value:
        return '`""`'
    if isinstance(value, int | float | str):
        return f"`{value}`"
    return None


def test_every_farm_key_is_in_configure_md_with_its_default() -> None:
    keys = dict(_farm_keys(FarmConfig))
    documented = _documented_keys()
    assert sorted(set(keys) - set(documented)) == [], "keys of the farm YAML missing from docs/configure.md"
    assert sorted(set(documented) - set(keys)) == [], "docs/configure.md documents keys the farm YAML lacks"
    wrong = {
        key: (documented[key], expected)
        for key, field in keys.items()
        if field is not None and (expected := _default_cell(field)) is not None and documented[key] != expected
    }
    assert wrong == {}, "default in docs/configure.md (documented, actual)"


def test_the_key_walk_sees_mappings_lists_and_optional_sections() -> None:
    keys = dict(_farm_keys(FarmConfig))
    for key in (
        "teams.<*>.quotas.<*>.<*>.hard_limit",
        "teams.<*>.members.usergroup",
        "idle.teams.<*>.kinds.<*>.threshold_percent",
        "inventory.static[].gpu_count",
        "inventory.datadog_agent.scopes.<*>",
        "budgets[].gpu_hours",
        "digest.timezone",
    ):
        assert key in keys, key
    waste, regions = keys["charging.waste_threshold_percent"], keys["inventory.aws.regions"]
    assert waste is not None and _default_cell(waste) == "`50`"
    assert regions is not None and _default_cell(regions) == "required"


# -- the code the docs name -----------------------------------------------------------------------------------------


_SOURCES = (ROOT / "layers" / "gpufarm", ROOT / "node", ROOT / "sandbox")


def _module_source(module: str) -> Path | None:
    for base in _SOURCES:
        path = base.joinpath(*module.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _defined(body: list[ast.stmt], name: str) -> list[ast.stmt] | None:
    """What `body` defines as `name` at its top level: a class's body, [] for anything else; None when nothing."""
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return []
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return []
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return []
    return None


def _resolves(dotted: str) -> bool:
    """True when `dotted` is a module of this repository, or one and the names defined in it one inside the other.

    Read from the sources (nothing is imported, so no module's import runs here)."""
    parts = dotted.split(".")
    for depth in range(len(parts), 0, -1):
        source = _module_source(".".join(parts[:depth]))
        if source is None:
            continue
        body: list[ast.stmt] | None = ast.parse(source.read_text(encoding="utf-8")).body
        for name in parts[depth:]:
            body = _defined(body or [], name)
            if body is None:
                return False
        return True
    return False


def test_every_module_the_docs_name_exists() -> None:
    named = {(page, name) for page in PAGES for name in _CODE_NAME.findall(page.read_text(encoding="utf-8"))}
    assert len(named) > 20
    assert sorted(f"{page.relative_to(ROOT)}: {name}" for page, name in named if not _resolves(name)) == []


def test_a_moved_or_misspelt_module_does_not_resolve() -> None:
    assert _resolves("gpufarm.core") and _resolves("gpufarm_sandbox.emulator.counter.kind")
    assert not _resolves("gpufarm.core.no_such_module") and not _resolves("gpufarm.core.kernel.bounded.no_such_name")


# -- the README and the links ----------------------------------------------------------------------------------------


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a page under docs/"


def _relative_links(page: Path) -> Iterator[str]:
    text = _CODE_SPAN.sub("", _CODE_BLOCK.sub("", page.read_text(encoding="utf-8")))
    for target in _LINK.findall(text):
        if not re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", target):
            yield target


def test_every_relative_link_of_the_docs_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target in _relative_links(page)
        if not (page.parent / target.split("#", 1)[0]).resolve().exists()
    ]
    assert broken == []


def _headings(page: Path) -> list[str]:
    text = _CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return [_plain(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)]


def _plain(text: str) -> str:
    return " ".join(re.sub(r"[*`_]", "", text).split()).lower()


def test_every_section_a_link_names_is_a_heading_of_its_page() -> None:
    """A link followed by a quoted section (the link, then `, "The idle policy"`) names a heading of its page."""
    missing = []
    for page in PAGES:
        text = _CODE_SPAN.sub("", _CODE_BLOCK.sub("", page.read_text(encoding="utf-8")))
        for target, section in re.findall(r"\]\(([^)\s#]+\.md)\),\s*\"([^\"\n]+)\"", text):
            headings = _headings((page.parent / target).resolve())
            if not any(h.startswith(_plain(section)) for h in headings):
                missing.append(f"{page.relative_to(ROOT)}: {target}, {section!r}")
    assert missing == []


def test_the_link_scan_finds_relative_links_outside_code(tmp_path: Path) -> None:
    md = ".md"  # written apart, so the repository's citation scan does not read these made-up pages
    page = tmp_path / f"page{md}"
    page.write_text(
        f"[a](a{md}) [b](https://example.com/b{md}) [c](#c) [d](../d{md}#part) `[e](e{md})`\n```\n[f](f{md})\n```\n"
    )
    assert list(_relative_links(page)) == [f"a{md}", f"../d{md}#part"]
