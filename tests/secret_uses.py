"""Which of the deployment's secret keys each function's code can reach, found in the shipped source by `ast`.

A function's entry point is its handler module's `handle` (functions/<dir>/<dir>.py imports it from
`gpufarm.handlers.<dir>`). From there every definition it may call is followed: a name resolves through the
module's own definitions and its imports; an attribute `x.name` (a method call, a bound method handed on, a module
function through its module) resolves to every function or method of the runtime called `name`, whatever `x` is,
so a call this cannot type is over-counted, never missed. A definition's body includes its nested functions and
lambdas (the runtime's lazily built collaborators), and naming a class reaches its constructor.

A definition reads a key where it asks `require("<setting>")` or reads the setting's attribute (`.slack_bot_token`)
of the Settings; the key is SECRET_KEYS' name for that setting. The result is what the function may need, so the
template must grant it (tests/security/test_least_privilege.py): exactly that, and nothing else.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpufarm.config import SECRET_KEYS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "layers" / "gpufarm" / "gpufarm"
# The pseudo-definition of a module's import-time code.
IMPORTED = "<import>"
# The setting each key fills -> the key.
_KEY_OF = {attr: key for key, attr in SECRET_KEYS.items()}


@dataclass
class Definition:
    """One top-level function, method or class body (a function's nested functions and lambdas included)."""

    module: str
    qualname: str
    keys: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    # (the plain name it is read from, or "" for any other expression; the attribute)
    attributes: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class Module:
    """One module: its functions, its classes (body and methods), and what its imports bind."""

    name: str
    functions: dict[str, Definition] = field(default_factory=dict)
    classes: dict[str, Definition] = field(default_factory=dict)
    methods: dict[str, dict[str, Definition]] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _code_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `node` that run, leaving out annotations (a type named in a signature is not a use of it)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for name, value in ast.iter_fields(current):
            if name in ("annotation", "returns"):
                continue
            children = value if isinstance(value, list) else [value]
            stack.extend(c for c in children if isinstance(c, ast.AST))


def _definition(module: str, qualname: str, nodes: list[ast.AST]) -> Definition:
    found = Definition(module, qualname)
    for child in (n for node in nodes for n in _code_nodes(node)):
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "require":
            for arg in child.args:
                if isinstance(arg, ast.Constant) and arg.value in _KEY_OF:
                    found.keys.add(_KEY_OF[arg.value])
        if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
            receiver = child.value.id if isinstance(child.value, ast.Name) else ""
            found.attributes.add((receiver, child.attr))
            if child.attr in _KEY_OF:
                found.keys.add(_KEY_OF[child.attr])
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
            found.names.add(child.id)
    return found


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    base = module.split(".")[: -node.level] if node.level else []
    return ".".join([*base, *(node.module.split(".") if node.module else [])])


@functools.cache
def modules() -> dict[str, Module]:
    """Every runtime module, parsed."""
    out: dict[str, Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        module = Module(name)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve_from(name, node)
                module.imports.update({a.asname or a.name: f"{source}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                module.imports.update({a.asname or a.name: a.name for a in node.names})
        # What the module runs when it is imported (a handler module registers its SnapStart hooks there).
        top_level = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        module.functions[IMPORTED] = _definition(name, IMPORTED, top_level)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = _definition(name, node.name, [node])
            elif isinstance(node, ast.ClassDef):
                # The class body: what it reads when it is built (a dataclass's field defaults) and its bases.
                own = [n for n in node.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                module.classes[node.name] = _definition(name, node.name, [*own, *node.bases])
                module.methods[node.name] = {
                    item.name: _definition(name, f"{node.name}.{item.name}", [item])
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                }
        out[name] = module
    return out


class _Reach:
    """Rapid type analysis: a method is reachable through `x.name` once its class has been named (built, or a base
    of one built) somewhere reachable; until then the attribute waits for a class that has it."""

    def __init__(self) -> None:
        self.every = modules()
        self.seen: set[tuple[str, str]] = set()
        self.classes: set[tuple[str, str]] = set()
        self.attributes: set[str] = set()
        self.stack: list[Definition] = []
        self.keys: set[str] = set()

    def push(self, definition: Definition | None) -> None:
        if definition is not None and (definition.module, definition.qualname) not in self.seen:
            self.seen.add((definition.module, definition.qualname))
            self.stack.append(definition)

    def name(self, module: Module, name: str) -> None:
        """A plain name: this module's function or class, or an imported one."""
        target_module, target = module, name
        if name not in module.functions and name not in module.classes:
            source, _, attr = module.imports.get(name, "").rpartition(".")
            if source not in self.every:
                return
            target_module, target = self.every[source], attr
        self.push(target_module.functions.get(target))
        if target in target_module.classes:
            self.reach_class(target_module, target)

    def reach_class(self, module: Module, name: str) -> None:
        if (module.name, name) in self.classes:
            return
        self.classes.add((module.name, name))
        self.push(module.classes[name])
        methods = module.methods[name]
        self.push(methods.get("__init__"))
        self.push(methods.get("__post_init__"))
        for attr in self.attributes & methods.keys():
            self.push(methods[attr])

    def attribute(self, module: Module, receiver: str, attr: str) -> None:
        """`receiver.attr`: a module's function or class when `receiver` is an imported module, else the methods of
        that name of every class reached (and of every class reached later)."""
        imported = module.imports.get(receiver, "")
        if receiver and imported in self.every:
            self.name(self.every[imported], attr)
            return
        if attr.startswith("__") and attr.endswith("__"):
            return  # `super().__init__`: the bases' constructors are reached with the class
        if attr in self.attributes:
            return
        self.attributes.add(attr)
        for module_name, class_name in self.classes:
            self.push(self.every[module_name].methods[class_name].get(attr))

    def run(self) -> None:
        while self.stack:
            definition = self.stack.pop()
            self.keys |= definition.keys
            module = self.every[definition.module]
            for name in definition.names:
                self.name(module, name)
            for receiver, attr in definition.attributes:
                self.attribute(module, receiver, attr)


def _reached(module: str, entry: str) -> _Reach:
    reach = _Reach()
    reach.push(modules()[module].functions[entry])
    reach.push(modules()[module].functions[IMPORTED])
    reach.run()
    return reach


@functools.cache
def function_reach(function_dir: str) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """What a function's code (its handler, its entry file's wrapper) may reach: the secret keys it may read, and
    every definition (module, qualname) it may run."""
    handler, wrapper = (
        _reached(handler_module(function_dir), "handle"),
        _reached("gpufarm.handlers.telemetry", "instrument"),
    )
    return frozenset(handler.keys | wrapper.keys), frozenset(handler.seen | wrapper.seen)


def function_keys(function_dir: str) -> set[str]:
    """The secret keys a function's code may read."""
    return set(function_reach(function_dir)[0])


def handler_module(function_dir: str) -> str:
    """The runtime module a function's entry file takes its handler from."""
    tree = ast.parse((ROOT / "functions" / function_dir / f"{function_dir}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "handle" for a in node.names):
            return node.module
    raise LookupError(f"functions/{function_dir} imports no handle")
