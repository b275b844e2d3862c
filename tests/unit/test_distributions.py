"""The three distributions and the developer's install that joins them.

- `gpufarm` (layers/gpufarm) is the only package of the Lambda layer: requirements.txt is its dependencies less
  what the Lambda runtime provides (boto3, botocore) and click (the layer runs no CLI), and what every Lambda
  entry point imports is in the layer;
- `gpufarm-node` (node) is what a GPU node installs: its dependency closure holds no pydantic, boto3, Slack,
  Powertools or werkzeug, it imports neither of the other packages, and it runs from its declared distributions
  alone;
- `gpufarm-sandbox` (sandbox) is development tooling: never imported by the other two;
- the root pyproject.toml is their union (dependencies, extras, scripts, entry points, packages) plus dev tools.

Each distribution imports only what it declares (no reliance on a dependency's dependency) or the standard
library. All of it is read statically (tomllib, ast, importlib.metadata of this environment), so nothing here
needs the network.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "layers" / "gpufarm"
FUNCTIONS = ROOT / "functions"
# distribution name -> (its directory, its one top-level package)
DISTRIBUTIONS = {
    "gpufarm": (LAYER, "gpufarm"),
    "gpufarm-node": (ROOT / "node", "gpufarm_node"),
    "gpufarm-sandbox": (ROOT / "sandbox", "gpufarm_sandbox"),
}
PACKAGES = {package: name for name, (_, package) in DISTRIBUTIONS.items()}
# The Lambda python3.12 runtime ships boto3 and botocore; the layer runs no command line.
RUNTIME_PROVIDED = {"boto3", "botocore"}
LAYER_OMITS = RUNTIME_PROVIDED | {"click"}
# Modules the Lambda python runtime holds outside any distribution (the SnapStart hooks); gpufarm imports them
# guarded, for Lambda only.
RUNTIME_MODULES = {"snapshot_restore_py"}
NODE_NEVER = {"pydantic", "pydantic-core", "boto3", "botocore", "slack-sdk", "aws-lambda-powertools", "werkzeug"}
# Words that mark development tooling; none may name a file of the runtime.
TOOLING = re.compile(r"sandbox|localhost|demo|fake|simfarm|emulator", re.IGNORECASE)
# Modules of optional extras that this development environment need not hold (import name -> distribution).
OPTIONAL_MODULES = {"grpc": "grpcio"}
# Build and cache output that pip and Python leave beside the sources (ignored by git, not part of a distribution).
UNTRACKED = {"__pycache__", "build", "dist"}


def _pyproject(directory: Path) -> dict[str, Any]:
    return tomllib.loads((directory / "pyproject.toml").read_text())


def _project(name: str) -> dict[str, Any]:
    project: dict[str, Any] = _pyproject(DISTRIBUTIONS[name][0])["project"]
    return project


def _key(requirement: Requirement) -> tuple[str, tuple[str, ...], str, str]:
    """A requirement in a comparable form: canonical name, extras, specifiers (sorted), marker."""
    return (
        canonicalize_name(requirement.name),
        tuple(sorted(requirement.extras)),
        str(requirement.specifier),
        str(requirement.marker or ""),
    )


def _keys(lines: Iterable[str]) -> set[tuple[str, tuple[str, ...], str, str]]:
    return {_key(Requirement(line)) for line in lines}


def _internal(requirement: str) -> bool:
    return canonicalize_name(Requirement(requirement).name) in DISTRIBUTIONS


def _external_dependencies(name: str) -> list[str]:
    return [line for line in _project(name)["dependencies"] if not _internal(line)]


def _requirements_file() -> list[str]:
    lines = (LAYER / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_layer_requirements_are_the_runtime_dependencies_less_what_lambda_provides() -> None:
    declared = _project("gpufarm")["dependencies"]
    wanted = [line for line in declared if canonicalize_name(Requirement(line).name) not in LAYER_OMITS]
    assert len(wanted) < len(declared), "boto3 and click are gpufarm dependencies the layer leaves out"
    assert _keys(_requirements_file()) == _keys(wanted), (
        "layers/gpufarm/requirements.txt must list layers/gpufarm/pyproject.toml's dependencies except "
        f"{sorted(LAYER_OMITS)}: {wanted}"
    )


def _version(directory: Path) -> str:
    """The version a distribution's build reports: its pyproject.toml's dynamic `attr`, read from the package's
    source inside `directory` (never a file outside it: each distribution builds from its own folder alone)."""
    pyproject = _pyproject(directory)
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"], directory
    module, _, name = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"].rpartition(".")
    wheres = pyproject["tool"]["setuptools"]["packages"]["find"].get("where", ["."])
    candidates = [directory / where / module.replace(".", "/") / "__init__.py" for where in wheres]
    source = next(path for path in candidates if path.is_file())
    assert source.resolve().is_relative_to(directory.resolve()), f"{source} is outside {directory}"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), source
            return node.value.value
    raise AssertionError(f"{source} does not set {name}")


def test_distributions_share_version_license_and_python() -> None:
    projects = {name: _project(name) for name in DISTRIBUTIONS}
    root = _pyproject(ROOT)["project"]
    versions = {name: _version(directory) for name, (directory, _) in DISTRIBUTIONS.items()}
    assert set(versions.values()) == {_version(ROOT)}, versions
    for field in ("requires-python", "license"):
        assert {p[field] for p in [*projects.values(), root]} == {root[field]}, field
    # The sandbox builds on the other two at exactly this version.
    pins = {
        canonicalize_name(Requirement(d).name): str(Requirement(d).specifier)
        for d in projects["gpufarm-sandbox"]["dependencies"]
    }
    assert pins["gpufarm"] == pins["gpufarm-node"] == f"=={_version(ROOT)}"


def test_one_specifier_per_dependency_across_the_distributions() -> None:
    seen: dict[str, set[tuple[str, tuple[str, ...], str, str]]] = {}
    for name in DISTRIBUTIONS:
        project = _project(name)
        lines = [
            *_external_dependencies(name),
            *(x for extra in project.get("optional-dependencies", {}).values() for x in extra),
        ]
        for key in _keys(lines):
            seen.setdefault(key[0], set()).add(key)
    assert {dist: keys for dist, keys in seen.items() if len(keys) > 1} == {}


def test_the_root_install_is_the_union_of_the_three() -> None:
    pyproject = _pyproject(ROOT)
    root = pyproject["project"]
    projects = {name: _project(name) for name in DISTRIBUTIONS}
    assert _keys(root["dependencies"]) == _keys(d for name in DISTRIBUTIONS for d in _external_dependencies(name))
    extras = {
        extra: _keys(lines) for p in projects.values() for extra, lines in p.get("optional-dependencies", {}).items()
    }
    # Every distribution's extra is the root's too; the root's others (dev, bench) are development tools.
    assert {k: _keys(v) for k, v in root["optional-dependencies"].items() if k in extras} == extras
    assert "dev" in root["optional-dependencies"]
    assert root["scripts"] == {k: v for p in projects.values() for k, v in p.get("scripts", {}).items()}
    groups: dict[str, dict[str, str]] = {}
    for p in projects.values():
        for group, points in p.get("entry-points", {}).items():
            groups.setdefault(group, {}).update(points)
    assert root["entry-points"] == groups
    assert groups["gpufarm.commands"].keys() == {"sandbox", "local", "demo"}
    setuptools = pyproject["tool"]["setuptools"]
    assert sorted(setuptools["packages"]["find"]["where"]) == sorted(
        str(directory.relative_to(ROOT)) for directory, _ in DISTRIBUTIONS.values()
    )
    package_data = {
        package: data
        for directory, _ in DISTRIBUTIONS.values()
        for package, data in _pyproject(directory)["tool"]["setuptools"]["package-data"].items()
    }
    assert setuptools["package-data"] == package_data


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_package_discovery_finds_only_its_own_package(name: str) -> None:
    directory, package = DISTRIBUTIONS[name]
    setuptools = _pyproject(directory)["tool"]["setuptools"]
    find = setuptools["packages"]["find"]
    found = find_packages(str(directory / find.get("where", ["."])[0]), include=find["include"])
    assert package in found and {p.split(".")[0] for p in found} == {package}
    assert set(setuptools["package-data"]) == {package}


def test_root_discovery_finds_the_three_packages() -> None:
    find = _pyproject(ROOT)["tool"]["setuptools"]["packages"]["find"]
    found = {
        p.split(".")[0] for where in find["where"] for p in find_packages(str(ROOT / where), include=find["include"])
    }
    assert found == set(PACKAGES)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Absolute module names a module imports at run time (imports under `if TYPE_CHECKING:` excluded), with
    `importlib.import_module("x")` and `importlib.util.find_spec("x")` calls on constant names counted too."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node
            for alias in node.names:
                yield f"{node.module}.{alias.name}", node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"import_module", "find_spec"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node
        stack.extend(ast.iter_child_nodes(node))


def _sources(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*.py")):
        if not UNTRACKED & set(path.relative_to(directory).parts):
            yield path


def _top_levels(directory: Path) -> dict[str, set[str]]:
    """Top-level module -> the files (relative to the repository) that import it."""
    found: dict[str, set[str]] = {}
    for path in _sources(directory):
        for module, _ in _imports(ast.parse(path.read_text(), str(path))):
            found.setdefault(module.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def _module_distributions() -> dict[str, set[str]]:
    """Top-level import name -> canonical names of the installed distributions that provide it."""
    mapping = {
        module: {canonicalize_name(d) for d in dists} for module, dists in metadata.packages_distributions().items()
    }
    for module, dist in OPTIONAL_MODULES.items():
        mapping.setdefault(module, {dist})
    mapping.update({package: {name} for package, name in PACKAGES.items()})
    return mapping


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_each_distribution_imports_only_what_it_declares(name: str) -> None:
    directory, package = DISTRIBUTIONS[name]
    project = _project(name)
    declared = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    declared |= {
        canonicalize_name(Requirement(x).name) for xs in project.get("optional-dependencies", {}).values() for x in xs
    }
    providers = _module_distributions()
    undeclared = {}
    for module, files in _top_levels(directory / package).items():
        if module in sys.stdlib_module_names or module == package or (name == "gpufarm" and module in RUNTIME_MODULES):
            continue
        dists = providers.get(module, set())
        if not dists & declared:
            undeclared[module] = (sorted(dists), sorted(files))
    assert undeclared == {}, f"{name} imports modules of distributions it does not declare"


def test_the_runtime_and_the_agent_import_none_of_the_other_packages() -> None:
    layer = _top_levels(LAYER / "gpufarm")
    node = _top_levels(ROOT / "node" / "gpufarm_node")
    assert {m: layer[m] for m in ("gpufarm_sandbox", "gpufarm_node") if m in layer} == {}
    assert {m: node[m] for m in ("gpufarm", "gpufarm_sandbox") if m in node} == {}


def _closure(requirements: Iterable[str], extras: frozenset[str] = frozenset()) -> set[str]:
    """Canonical names of every distribution the requirements pull in, read from this environment's metadata
    (a distribution this environment does not hold, an optional extra's, counts without its own dependencies)."""
    seen: set[str] = set()
    queue = [(Requirement(line), extras) for line in requirements]
    while queue:
        requirement, wanted = queue.pop()
        environments = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
        if requirement.marker and not any(requirement.marker.evaluate(env) for env in environments):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            assert name in OPTIONAL_MODULES.values(), f"{name} is not installed: run `make venv`"
            continue
        queue.extend((Requirement(line), frozenset(requirement.extras)) for line in requires)
    return seen


def test_the_node_dependency_closure_is_light() -> None:
    project = _project("gpufarm-node")
    base = _closure(project["dependencies"])
    with_k8s = _closure([*project["dependencies"], *project["optional-dependencies"]["k8s"]])
    assert {"nvidia-ml-py", "datadog-api-client"} <= base
    assert with_k8s - base >= {"grpcio", "kubernetes"}
    assert base & NODE_NEVER == set() and with_k8s & NODE_NEVER == set()


def test_the_layer_source_holds_only_the_runtime() -> None:
    entries = {p.name for p in LAYER.iterdir() if p.name not in UNTRACKED and not p.name.endswith(".egg-info")}
    assert entries == {"gpufarm", "pyproject.toml", "requirements.txt"}
    tooling = [
        str(path.relative_to(LAYER))
        for path in (LAYER / "gpufarm").rglob("*")
        if not UNTRACKED & set(path.relative_to(LAYER).parts) and TOOLING.search(path.name)
    ]
    assert tooling == []
    imported = _top_levels(LAYER / "gpufarm")
    assert {m: imported[m] for m in ("werkzeug", "moto", "gpufarm_sandbox", "gpufarm_node") if m in imported} == {}


def _module_file(module: str) -> Path | None:
    """The source of a `gpufarm.*` module in the layer, or None when the name is not a module there."""
    base = LAYER.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _reachable(entry: Path) -> tuple[set[str], set[str]]:
    """(gpufarm modules, third-party top-level modules) an entry point can import, lazy imports included."""
    modules: set[str] = set()
    third_party: set[str] = set()
    pending = [entry]
    visited: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in visited:
            continue
        visited.add(path)
        for module, _ in _imports(ast.parse(path.read_text(), str(path))):
            top = module.split(".")[0]
            if top == "gpufarm":
                parts = module.split(".")
                # Importing gpufarm.a.b runs gpufarm/__init__.py and gpufarm/a/__init__.py first.
                for depth in range(1, len(parts) + 1):
                    found = _module_file(".".join(parts[:depth]))
                    if found is not None:
                        modules.add(".".join(parts[:depth]))
                        pending.append(found)
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return modules, third_party


@pytest.mark.parametrize("function", sorted(p.name for p in FUNCTIONS.iterdir() if (p / f"{p.name}.py").is_file()))
def test_every_lambda_entry_point_imports_only_what_the_layer_holds(function: str) -> None:
    modules, third_party = _reachable(FUNCTIONS / function / f"{function}.py")
    assert any(m.startswith("gpufarm.handlers.") for m in modules)
    assert {m for m in modules if m.endswith((".cli", "__main__"))} == set(), "the layer runs no command line"
    providers = _module_distributions()
    in_layer = {canonicalize_name(Requirement(line).name) for line in _requirements_file()} | RUNTIME_PROVIDED
    missing = {
        m: sorted(providers.get(m, set()))
        for m in third_party - RUNTIME_MODULES
        if not providers.get(m, set()) & in_layer
    }
    assert missing == {}, f"{function} reaches modules the layer does not install"


def _isolated_path(tmp_path: Path, distributions: Iterable[str]) -> Path:
    """A directory holding (as symlinks) only the top-level files of the given installed distributions."""
    target = tmp_path / "site"
    target.mkdir()
    for name in distributions:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            assert name in OPTIONAL_MODULES.values(), name
            continue
        for file in dist.files or []:
            top = file.parts[0]
            if top in {"..", "__pycache__"} or top.endswith(".pth") or (target / top).exists():
                continue
            os.symlink(Path(str(dist.locate_file(top))).resolve(), target / top)
    return target


def test_the_agent_runs_from_its_declared_distributions_alone(tmp_path: Path) -> None:
    """`gpufarm-node --fake h100x8-mig --once --dry-run` with only the node package and its dependency closure on
    the path (no site-packages, no other gpufarm package): an import it does not declare fails here."""
    site = _isolated_path(tmp_path, _closure(_project("gpufarm-node")["dependencies"]))
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT / 'node')!r}, {str(site)!r}]\n"
        "from gpufarm_node.cli import main\n"
        "try:\n"
        "    main(['--fake', 'h100x8-mig', '--once', '--dry-run', '--hostname', 'node-1'])\n"
        "finally:\n"
        "    banned = ('gpufarm', 'gpufarm_sandbox', 'pydantic', 'boto3', 'slack_sdk', 'aws_lambda_powertools',\n"
        "              'werkzeug')\n"
        "    print(sorted(m for m in sys.modules if m.split('.')[0] in banned), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DD_", "GPUFARM_", "PYTHON"))}
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]"
    payload = json.loads(done.stdout.strip().splitlines()[-1])
    hosts = {r["name"] for s in payload["series"] for r in s["resources"]}
    assert hosts == {"node-1"} and any(s["metric"] == "gpufarm.gpu.utilization" for s in payload["series"])
