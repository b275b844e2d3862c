"""What gpufarm calls outside itself, found in its source by `ast`, and the permission each call needs.

docs/deploy.md, "What to grant", lists the Datadog permissions, Slack scopes, IAM actions and Azure actions a
deployment grants; tests/unit/test_permissions.py holds those tables to what this module finds, both ways. Nothing
here is a list of calls written by hand: each finder reads the shipped code (the `gpufarm` layer and the node
agent) for the clients it builds and the operations it calls on them, and the permission of each operation comes
from the outside system's own description:
- Datadog: the operation's `x-permission` and `security` in Datadog's OpenAPI spec (the subset gpufarm calls, in
  tests/fixtures/permissions/datadog-operations.json); a datadog-api-client method is the snake_case of its
  operationId, and the client's own endpoint table is checked to say the same method and path.
- Slack: each Web API method's bot scopes as Slack's method reference lists them
  (tests/fixtures/permissions/slack-scopes.json; Slack publishes no machine-readable list); which methods a
  WebClient call makes is read from slack_sdk's own source.
- AWS: the IAM action of a botocore operation is the service's signing name and the operation's name (botocore's
  service models), but for the few AWS names otherwise (tests/fixtures/permissions/aws-actions.json).
- Azure: the Resource Manager action of an azure-mgmt-compute call is its REST path's resource types with the
  method's verb (GET: read), read from the SDK's request builders.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Imported with the module, not in a test: urllib3 probes for IPv6 with a socket on its first import.
from datadog_api_client import ApiClient, Configuration

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "permissions"
# What ships: the runtime and operator CLI (the Lambda layer's package), the node agent and the Slurm enforcer. The
# sandbox, the local function host and the demo are development tools (docs/design.md, rule 8) and need no grant.
SHIPPED = ("layers/gpufarm/gpufarm", "node/gpufarm_node")
FUNCTIONS = "functions"
APPLY = "`gpufarm datadog apply`"
NODE = "node agent"
ENFORCER = "Slurm enforcer"
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_DATADOG_API = re.compile(r"^datadog_api_client\.(v\d)\.api\.\w+$")


@dataclass(frozen=True)
class Call:
    """One call of an outside API in the source: what it calls (`name`, in the API's own terms) and where."""

    name: str
    where: str
    part: str = FUNCTIONS
    # Datadog: the request the call sends, as the client's endpoint table (or the raw request) writes it.
    route: str = ""


def shipped_sources(root: Path = ROOT) -> dict[str, str]:
    """Every shipped module's text by its path from the repository root."""
    return {
        str(path.relative_to(root)): path.read_text() for top in SHIPPED for path in sorted((root / top).rglob("*.py"))
    }


def part_of(path: str) -> str:
    """Which part of gpufarm a module belongs to, as the Datadog table names it."""
    if path.startswith("node/gpufarm_node/enforce/"):
        # `gpufarm-node enforce slurm`: its own keys beside slurmctld, not the agent's on every GPU node.
        return ENFORCER
    if path.startswith("node/"):
        return NODE
    if path.startswith("layers/gpufarm/gpufarm/setup/") or path.endswith("adapters/datadog_admin.py"):
        return APPLY
    return FUNCTIONS


# -- resolving what an expression holds ------------------------------------------------------------------------


class Resolver:
    """Which client an expression holds, in one module: built there (`make`), bound to a name or a `self.`
    attribute (an assignment, a property returning one), returned by a factory, or `.get()` of a lazy holder."""

    def __init__(self, tree: ast.Module, make: Callable[[ast.Call], str | None], factories: Mapping[str, str]):
        self.make = make
        self.factories = dict(factories)
        self.tree = tree
        self.attrs: dict[str, str] = {}
        self.scopes: dict[ast.AST, dict[str, str]] = {}
        for _ in range(2):  # a binding may rest on another one found later in the module: settle them
            self._bind()

    def _bind(self) -> None:
        self.scopes[self.tree] = self._assign(_walk_own(self.tree.body), None)
        for fn in _functions(self.tree):
            nodes = list(ast.walk(fn))
            self.scopes[fn] = self._assign(nodes, fn)
            returned = (self.resolve(r.value, fn) for r in nodes if isinstance(r, ast.Return) and r.value)
            found = next((kind for kind in returned if kind), None)
            if found and _is_property(fn):
                self.attrs[fn.name] = found
            elif found:
                self.factories[fn.name] = found

    def _assign(self, nodes: Iterable[ast.AST], fn: ast.AST | None) -> dict[str, str]:
        """The names bound to a client among `nodes` (and, as a side effect, the `self.` attributes)."""
        names: dict[str, str] = self.scopes.setdefault(fn or self.tree, {})
        for node in nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                kind = self.resolve(node.value, fn)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets if kind else ():
                    if isinstance(target, ast.Name):
                        names[target.id] = str(kind)
                    elif attr := _self_attr(target):
                        self.attrs[attr] = str(kind)
        return names

    def resolve(self, node: ast.AST, fn: ast.AST | None) -> str | None:
        """The client `node` holds, or None."""
        if isinstance(node, ast.Call):
            made = self.make(node)
            if made:
                return made
            callee = node.func
            name = (
                callee.id if isinstance(callee, ast.Name) else callee.attr if isinstance(callee, ast.Attribute) else ""
            )
            if name in self.factories:
                return self.factories[name]
            if isinstance(callee, ast.Attribute) and callee.attr == "get" and not node.args:
                return self.resolve(callee.value, fn)  # a lazy holder's client (adapters.aws._LazyClient)
            return None
        if isinstance(node, ast.Name):
            for scope in (fn, self.tree):
                found = self.scopes.get(scope or self.tree, {}).get(node.id)
                if found:
                    return found
            return None
        attr = _self_attr(node)
        return self.attrs.get(attr) if attr else None

    def attribute_uses(self) -> Iterator[tuple[ast.Attribute, str | None, ast.AST | None]]:
        """Every `x.name` read in the module, with the client `x` holds (None when it holds none known)."""
        for fn in [self.tree, *_functions(self.tree)]:
            body = fn.body if isinstance(fn, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) else []
            for node in _walk_own(body):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    yield node, self.resolve(node.value, None if fn is self.tree else fn), fn


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _walk_own(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of a body, leaving out nested functions (each is visited as its own scope)."""
    stack: list[ast.AST] = [n for n in body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef))


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    names = {
        d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else "" for d in fn.decorator_list
    }
    return bool(names & {"property", "cached_property"})


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@functools.cache
def parsed(text: str) -> ast.Module:
    """A module's tree, parsed once for every finder (nothing changes a tree)."""
    return ast.parse(text)


# By the tree's id: `parsed` keeps every tree alive, so an id never comes back for another module.
_IMPORTS: dict[int, dict[str, str]] = {}


def _imports(tree: ast.AST) -> dict[str, str]:
    """Names imported anywhere in a module (function-level imports too): local name -> `module.name`."""
    if id(tree) in _IMPORTS:
        return _IMPORTS[id(tree)]
    out: dict[str, str] = _IMPORTS.setdefault(id(tree), {})
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            out.update({a.asname or a.name: a.name for a in node.names})
    return out


def _aliases(tree: ast.AST, imported: Mapping[str, str]) -> dict[str, str]:
    """`imported` plus plain aliases of those names (`api: Any = TagsApi`, which keeps mypy strict)."""
    out = dict(imported)
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Name) and value.id in imported:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[union-attr]
            out.update({t.id: imported[value.id] for t in targets if isinstance(t, ast.Name)})
    return out


def _uses_module(tree: ast.AST, prefix: str) -> bool:
    return any(v == prefix or v.startswith(prefix + ".") for v in _imports(tree).values())


def _strings(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _where(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


# -- Datadog -----------------------------------------------------------------------------------------------------


@functools.cache
def datadog_endpoints(class_key: str) -> dict[str, dict[str, str]]:
    """The operations of a datadog-api-client API class (`v1.api.tags_api:TagsApi`): method -> version, path, method,
    as the client's own endpoint table says."""
    import importlib

    module, name = class_key.split(":")
    api = getattr(importlib.import_module(f"datadog_api_client.{module}"), name)(ApiClient(Configuration()))
    out = {}
    for method in (m for m in dir(api) if not m.startswith("_")):
        endpoint = getattr(api, f"_{method}_endpoint", None)
        if endpoint is not None:
            s = endpoint.settings
            out[method] = {"version": s["version"], "path": s["endpoint_path"], "method": s["http_method"]}
    return out


def _datadog_make(imported: Mapping[str, str]) -> Callable[[ast.Call], str | None]:
    def make(call: ast.Call) -> str | None:
        args = _strings(call)
        if len(args) >= 2 and _DATADOG_API.match(args[0]):  # datadog_client.build("datadog_api_client....", "XApi")
            return f"{args[0].removeprefix('datadog_api_client.')}:{args[1]}"
        target = imported.get(call.func.id, "") if isinstance(call.func, ast.Name) else ""
        module, _, name = target.rpartition(".")
        if _DATADOG_API.match(module):
            return f"{module.removeprefix('datadog_api_client.')}:{name}"
        return None

    return make


def datadog_calls(sources: Mapping[str, str]) -> tuple[list[Call], list[str]]:
    """Every Datadog request the sources make, and what could not be told: a client method on an API object they
    build (`v2:get_incident`) or are handed, or a raw request (`v2 POST /api/v2/series`); `route` says what the
    client (or the raw request) sends."""
    trees = {p: parsed(t) for p, t in sources.items() if "datadog" in t or "/api/v" in t}
    users = {p: t for p, t in trees.items() if _uses_module(t, "datadog_api_client") or "datadog_client" in sources[p]}
    factories: dict[str, str] = {}
    for _ in range(2):  # factories in one module (node's `tags_api`) build the clients another module calls
        for tree in users.values():
            factories.update(Resolver(tree, _datadog_make(_aliases(tree, _imports(tree))), factories).factories)
    known = set(factories.values())
    calls: list[Call] = []
    problems: list[str] = []
    for path, tree in users.items():
        resolver = Resolver(tree, _datadog_make(_aliases(tree, _imports(tree))), factories)
        known |= set(resolver.attrs.values()) | {k for s in resolver.scopes.values() for k in s.values()}
        for node, held, _ in resolver.attribute_uses():
            if held and ":" in held:
                ops = datadog_endpoints(held)
                if node.attr in ops:
                    e = ops[node.attr]
                    route = f"{e['method']} {e['path']}"
                    calls.append(Call(f"{e['version']}:{node.attr}", _where(path, node), part_of(path), route))
                elif not node.attr.startswith("_"):
                    problems.append(f"{_where(path, node)}: {held} has no operation {node.attr}")
    calls += [call for path, tree in trees.items() if "/api/v" in sources[path] for call in _raw_datadog(path, tree)]
    return _injected(users, known, calls, problems)


def _injected(
    users: Mapping[str, ast.Module], known: set[str], calls: list[Call], problems: list[str]
) -> tuple[list[Call], list[str]]:
    """Calls on an API object passed in (the node's registrar gets its TagsApi from the CLI): an operation name that
    only one API class gpufarm builds has, on `self.<attr>` in a module that imports datadog_api_client."""
    seen = {(c.where, c.name.split(":")[-1]) for c in calls}
    by_op: dict[str, set[str]] = {}
    routes: dict[str, str] = {}
    for cls in known:
        for op, e in datadog_endpoints(cls).items():
            by_op.setdefault(op, set()).add(f"{e['version']}:{op}")
            routes[f"{e['version']}:{op}"] = f"{e['method']} {e['path']}"
    for path, tree in users.items():
        if not _uses_module(tree, "datadog_api_client"):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _self_attr(node.value) and node.attr in by_op):
                continue
            if (_where(path, node), node.attr) in seen:
                continue
            names = by_op[node.attr]
            if len(names) == 1:
                name = next(iter(names))
                calls.append(Call(name, _where(path, node), part_of(path), routes[name]))
            else:
                problems.append(f"{_where(path, node)}: {node.attr} could be any of {sorted(names)}")
    return calls, problems


def _raw_datadog(path: str, tree: ast.Module) -> list[Call]:
    """Requests sent without the client's API classes: a `/api/vN/...` path written in the code (docstrings
    aside), with the HTTP methods its class writes (`"POST"`, `f"GET {path} HTTP/1.1"`)."""
    out = []
    skip = {id(n.body[0].value) for n in ast.walk(tree) if _has_docstring(n)}  # type: ignore[attr-defined]
    skip |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    module = [s for s in tree.body if not isinstance(s, ast.ClassDef)]
    for owner in [module, *([c] for c in tree.body if isinstance(c, ast.ClassDef))]:
        nodes = [n for stmt in owner for n in ast.walk(stmt) if id(n) not in skip]
        verbs = "|".join(sorted({v for n in nodes for v in _verbs(n)})) or "?"
        named = _named_verbs(nodes)
        for node in nodes:
            found = re.search(r"/api/(v\d)(/[^?\s\"']*)", _text(node) or "")
            if found:
                route = f"/api/{found.group(1)}{found.group(2)}"
                verbs = named.get(id(node), verbs)
                out.append(
                    Call(f"{found.group(1)} {verbs} {route}", _where(path, node), part_of(path), f"{verbs} {route}")
                )
    return out


def _named_verbs(nodes: Iterable[ast.AST]) -> dict[int, str]:
    """The method of a path handed to a helper named for it (`self._get("/api/v2/...")`, `post(...)`), by node."""
    out: dict[int, str] = {}
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        verb = name.lstrip("_").upper()
        if verb in HTTP_METHODS and node.args:
            out.update((id(inner), verb) for inner in ast.walk(node.args[0]))
    return out


def _has_docstring(node: ast.AST) -> bool:
    documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None


def _verbs(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in HTTP_METHODS:
        return [str(node.value)]
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return [v for v in HTTP_METHODS if first.value.startswith(v + " ")]
    return []


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with `{}` for each value it formats."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    return None


def load_json(name: str) -> Any:
    """A fixture of tests/fixtures/permissions."""
    return json.loads((FIXTURES / name).read_text())


def snake(operation_id: str) -> str:
    """datadog-api-client's method name for an operationId (`ListIncidentTypes` -> `list_incident_types`)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", operation_id)).lower()


def _route_pattern(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]*\\\}", r"[^/]+", re.escape(path)) + "$")


def datadog_operations(calls: Iterable[Call], spec: Mapping[str, Any]) -> tuple[dict[str, list[Call]], list[str]]:
    """The calls by the spec operation each makes (`v2 SearchIncidents`): a client method by the operationId it is
    the snake_case of, whose method and path must then be the client's own; a raw request by its method and path.
    Also the calls the spec subset lacks."""
    out: dict[str, list[Call]] = {}
    problems: list[str] = []
    for call in calls:
        raw = " " in call.name
        version, _, rest = call.name.partition(" ") if raw else call.name.partition(":")
        ops = spec.get(version, {})
        verbs, _, route = call.route.partition(" ")
        if raw:
            ids = [
                i for i, o in ops.items() if o["method"] in verbs.split("|") and _route_pattern(o["path"]).match(route)
            ]
            # A literal path wins over a template it also fits (`/incidents/search` is not `/incidents/{id}`).
            ids = [i for i in ids if ops[i]["path"] == route] or ids
        else:
            ids = [i for i in ops if snake(i) == rest]
        if len(ids) != 1:
            problems.append(
                f"{call.where}: {call.name} ({call.route}) is not one operation of tests/fixtures/permissions/"
                "datadog-operations.json: copy it from Datadog's OpenAPI spec (method, path, x-permission, security)"
            )
            continue
        found = ops[ids[0]]
        if not raw and f"{found['method']} {found['path']}" != call.route:
            problems.append(
                f"{call.where}: {call.name} sends {call.route}, the spec's {ids[0]} is "
                f"{found['method']} {found['path']}"
            )
        out.setdefault(f"{version} {ids[0]}", []).append(call)
    return out, problems


# -- Slack -------------------------------------------------------------------------------------------------------


@functools.cache
def web_client_methods() -> dict[str, frozenset[str]]:
    """slack_sdk's WebClient methods -> the Web API methods each calls (`files_upload_v2` -> the two
    `files.*UploadExternal`), read from slack_sdk's own source: `self.api_call("...")` and the methods it calls."""
    import slack_sdk.web.client as module

    tree = ast.parse(Path(module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WebClient")
    direct: dict[str, set[str]] = {}
    inner: dict[str, set[str]] = {}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        direct[fn.name], inner[fn.name] = set(), set()
        for node in ast.walk(fn):
            attr = _self_attr(node.func) if isinstance(node, ast.Call) else None
            if attr == "api_call" and _strings(node):  # type: ignore[arg-type]
                direct[fn.name].add(_strings(node)[0])  # type: ignore[arg-type]
            elif attr:
                inner[fn.name].add(attr)

    def reach(name: str, seen: frozenset[str]) -> set[str]:
        out = set(direct.get(name, ()))
        for other in inner.get(name, set()) - seen:
            out |= reach(other, seen | {other})
        return out

    return {name: frozenset(reach(name, frozenset({name}))) for name in direct if not name.startswith("_")}


def _slack_make(imported: Mapping[str, str]) -> Callable[[ast.Call], str | None]:
    def make(call: ast.Call) -> str | None:
        target = imported.get(call.func.id, "") if isinstance(call.func, ast.Name) else ""
        return "WebClient" if target.startswith("slack_sdk") and target.endswith(".WebClient") else None

    return make


def slack_calls(sources: Mapping[str, str]) -> tuple[list[Call], list[str]]:
    """Every Slack Web API method the sources call: a WebClient method on a client they build, or a method name
    passed to a dispatcher of theirs (a function doing `getattr(<the client>, <its first argument>...)`)."""
    methods = web_client_methods()
    known = set().union(*methods.values())
    calls: list[Call] = []
    problems: list[str] = []
    for path, text in sources.items():
        tree = parsed(text) if "slack_sdk" in text else None
        if tree is None or not _uses_module(tree, "slack_sdk"):
            continue
        resolver = Resolver(tree, _slack_make(_imports(tree)), {})
        for node, held, _ in resolver.attribute_uses():
            if held == "WebClient" and node.attr in methods:
                calls += [Call(m, _where(path, node), part_of(path)) for m in sorted(methods[node.attr])]
        dispatchers = {fn.name for fn in _functions(tree) if _dispatches(fn, resolver)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _callee(node) not in dispatchers or not _strings(node):
                continue
            name = _strings(node)[0]
            if name in known:
                calls.append(Call(name, _where(path, node), part_of(path)))
            else:
                problems.append(f"{_where(path, node)}: {name} is no Web API method slack_sdk's WebClient knows")
    return calls, problems


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _dispatches(fn: ast.FunctionDef | ast.AsyncFunctionDef, resolver: Resolver) -> bool:
    """`fn` looks up a client method named by its first argument: `getattr(self.client, method.replace(...))`."""
    params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
    if not params:
        return False
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and _callee(node) == "getattr" and len(node.args) >= 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if params[0] in named and resolver.resolve(node.args[0], fn) == "WebClient":
                return True
    return False


# -- AWS ---------------------------------------------------------------------------------------------------------


@functools.cache
def _botocore() -> Any:
    import botocore.session

    return botocore.session.get_session()


@functools.cache
def aws_operations(service: str) -> dict[str, str]:
    """A botocore service's client methods -> IAM action as the service names it (`ssm:GetParameters`)."""
    from botocore import xform_name

    model = _botocore().get_service_model(service)
    return {xform_name(op): f"{model.signing_name}:{op}" for op in model.operation_names}


def _aws_make(call: ast.Call) -> str | None:
    # Every client gpufarm builds names its service as the first argument: aws_client("ssm", ...),
    # _LazyClient("s3", ...), self._client("ec2", region).
    args = call.args
    first = args[0].value if args and isinstance(args[0], ast.Constant) else None
    return first if isinstance(first, str) and first in _botocore().get_available_services() else None


def aws_calls(sources: Mapping[str, str]) -> tuple[list[Call], list[str]]:
    """Every botocore operation the sources call, as `service.method` (`ssm.get_parameters`); a client method read
    without being called (handed to a pager: `ec2.describe_instances`) counts too."""
    calls: list[Call] = []
    problems: list[str] = []
    for path, text in sources.items():
        tree = parsed(text) if "boto" in text or "adapters.aws" in text else None
        if tree is None or not (
            _uses_module(tree, "botocore") or _uses_module(tree, "boto3") or _uses_module(tree, "gpufarm.adapters.aws")
        ):
            continue
        resolver = Resolver(tree, _aws_make, {})
        services = set(resolver.attrs.values()) | {s for scope in resolver.scopes.values() for s in scope.values()}
        for node, held, _ in resolver.attribute_uses():
            if held and node.attr in aws_operations(held):
                calls.append(Call(f"{held}.{node.attr}", _where(path, node)))
            elif not held and any(node.attr in aws_operations(s) for s in services):
                problems.append(f"{_where(path, node)}: .{node.attr} is an AWS operation on a client not told apart")
    return calls, problems


def iam_actions(calls: Iterable[Call], sources: Mapping[str, str], rules: Mapping[str, Any]) -> dict[str, list[Call]]:
    """The calls by the IAM action each needs: the operation's own, renamed where AWS names it otherwise, plus the
    actions AWS checks besides it where the module writes the marker of that case."""
    out: dict[str, list[Call]] = {}
    for call in calls:
        service, method = call.name.split(".")
        action = aws_operations(service)[method]
        out.setdefault(rules["renamed"].get(action, {}).get("action", action), []).append(call)
        module = sources[call.where.rsplit(":", 1)[0]]
        for extra in rules["also"].get(action, []):
            if extra["marker"] in module:
                out.setdefault(extra["action"], []).append(call)
    return out


# -- Azure -------------------------------------------------------------------------------------------------------


@functools.cache
def _azure_builders() -> str:
    import azure.mgmt.compute.operations._operations as module

    return Path(module.__file__).read_text()


def azure_action(group: str, method: str) -> str | None:
    """The Resource Manager action of `ComputeManagementClient().<group>.<method>`: its request builder's path,
    resource types only (`locations/{location}/usages` -> `locations/usages`), and GET read, else write/delete."""
    text = _azure_builders()
    start = text.find(f"\ndef build_{group}_{method}_request(")
    if start < 0:
        return None
    body = text[start : text.find("\ndef ", start + 1)]
    path = re.search(r'\n    _url = "([^"]+)"', body)
    verb = re.search(r'method="([A-Z]+)"', body)
    if not path or not verb:
        return None
    provider, _, rest = path.group(1).partition("/providers/")
    names = [p for p in rest.split("/") if not p.startswith("{")]
    verbs = {"GET": "read", "PUT": "write", "PATCH": "write", "POST": "action", "DELETE": "delete"}
    return f"{names[0]}/{'/'.join(names[1:])}/{verbs[verb.group(1)]}" if provider and len(names) > 1 else None


def azure_calls(sources: Mapping[str, str]) -> tuple[list[Call], list[str]]:
    """Every azure-mgmt-compute operation the sources call, as `group.method` (`usage.list`)."""
    calls: list[Call] = []
    problems: list[str] = []
    for path, text in sources.items():
        if "azure.mgmt.compute" not in text:
            continue
        tree = parsed(text)
        imported = _imports(tree)

        def make(call: ast.Call, imported: Mapping[str, str] = imported) -> str | None:
            name = imported.get(call.func.id, "") if isinstance(call.func, ast.Name) else ""
            return "compute" if name.endswith(".ComputeManagementClient") else None

        resolver = Resolver(tree, make, {})
        for node, _, fn in resolver.attribute_uses():
            group = node.value
            if isinstance(group, ast.Attribute) and resolver.resolve(group.value, fn) == "compute":
                if azure_action(group.attr, node.attr):
                    calls.append(Call(f"{group.attr}.{node.attr}", _where(path, node)))
                else:
                    problems.append(f"{_where(path, node)}: no request builder for {group.attr}.{node.attr}")
    return calls, problems
