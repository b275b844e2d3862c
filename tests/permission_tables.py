"""The tables of docs/deploy.md, "What to grant", read back, and what they must say against what the code needs.

tests/permissions.py finds the calls and what each needs; this module compares that with the tables (each grant
listed is needed, each need is listed, with the calls and parts the table names), with template.yaml's IAM
statements and with slack/manifest.yaml's bot scopes. Every check answers a list of problems, empty when the
documents and the code agree, so a test can also show that a wrong table or an unlisted call is reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SECTION = "## What to grant"
_TOKEN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Need:
    """What one call needs: every one of `all_of`, and one of `any_of`; nothing but a key (`none` says which)."""

    all_of: frozenset[str] = frozenset()
    any_of: frozenset[str] = frozenset()
    none: str = ""


@dataclass(frozen=True)
class Row:
    """One row of a grant table: the grant (None on a row of calls that need none, `none` naming which key they
    need), the calls it lists and, where the table has the column, the parts of gpufarm it names."""

    grant: str | None
    uses: frozenset[str]
    none: str = ""
    parts: frozenset[str] | None = None
    cells: Mapping[str, str] = field(default_factory=dict)


def tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """Each `###` subsection of "What to grant" -> its first table's rows (column header -> cell)."""
    if SECTION not in markdown:
        return {}
    body = markdown.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[dict[str, str]]] = {}
    for block in body.split("\n### ")[1:]:
        title, _, rest = block.partition("\n")
        lines = [line.strip() for line in rest.splitlines()]
        start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
        if start is None:
            continue
        rows = []
        for line in lines[start:]:
            if not line.startswith("|"):
                break
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        header, data = rows[0], rows[2:]
        out[title.strip()] = [dict(zip(header, row, strict=False)) for row in data]
    return out


def tokens(cell: str) -> list[str]:
    """The `code` spans of a cell."""
    return _TOKEN.findall(cell)


def rows(table: Iterable[Mapping[str, str]], grant: str, uses: str, use_re: str, parts: str | None = None) -> list[Row]:
    """A table's rows: the grant column's first code span (none: a `none (<key>)` row), the uses column's code
    spans that match `use_re`, and the parts column split at commas."""
    out = []
    for cells in table:
        granted = tokens(cells.get(grant, ""))
        none = re.search(r"none \(([^)]*)\)", cells.get(grant, ""))
        found = frozenset(t for t in tokens(cells.get(uses, "")) if re.fullmatch(use_re, t))
        named = frozenset(p.strip() for p in cells[parts].split(",")) if parts and cells.get(parts) else None
        out.append(Row(granted[0] if granted else None, found, none.group(1) if none else "", named, cells))
    return out


def check(
    needs: Mapping[str, Need], table: list[Row], what: str, parts: Mapping[str, set[str]] | None = None
) -> tuple[list[str], set[str]]:
    """Problems between what the calls need and a grant table, and the grants the calls take from it.

    A call takes every permission of `all_of`, and the one of `any_of` the table lists (listing two of a call's
    alternatives is a problem: which one to grant must be plain). A listed grant no call takes is a problem; so is
    a row whose calls or parts differ from those of the calls that take it.
    """
    problems: list[str] = []
    listed = {r.grant for r in table if r.grant}
    taken: dict[str, set[str]] = {}
    for use, need in sorted(needs.items()):
        problems += [f"{use} needs {grant}, which {what} does not list" for grant in sorted(need.all_of - listed)]
        chosen = need.any_of & listed
        if need.any_of and len(chosen) != 1:
            which = "none" if not chosen else f"all of {sorted(chosen)}"
            problems.append(f"{use} needs one of {sorted(need.any_of)}; {what} lists {which}")
        for grant in (need.all_of & listed) | chosen:
            taken.setdefault(grant, set()).add(use)
        if not need.all_of and not need.any_of:
            taken.setdefault(f"none ({need.none})", set()).add(use)
    keys = {r.grant or f"none ({r.none})" for r in table}
    problems += [
        f"{what} has no `{k}` row for {sorted(taken[k])}" for k in sorted(set(taken) - keys) if k.startswith("none")
    ]
    for row in table:
        key = row.grant or f"none ({row.none})"
        got = taken.get(key, set())
        if not got:
            problems.append(f"{what} lists {key}, which no call needs")
        elif row.uses != got:
            problems.append(f"{what}, {key}: the table names {sorted(row.uses)}, the code calls {sorted(got)}")
        if parts is not None and got:
            wanted = set().union(*(parts.get(u, set()) for u in got))
            if set(row.parts or ()) != wanted:
                problems.append(
                    f"{what}, {key}: the table names {sorted(row.parts or ())}, the calls are {sorted(wanted)}"
                )
    return problems, {g for g in taken if not g.startswith("none")}


# -- Datadog -----------------------------------------------------------------------------------------------------


def datadog_need(operation: Mapping[str, Any]) -> Need:
    """What the spec says one operation needs: its x-permission (AND: all, OR: one), else (none, or OPEN) only a
    key."""
    permission = operation.get("x-permission")
    # OPEN: no permission at all (GET /api/v1/validate); the security then says which key.
    if permission and permission.get("operator") != "OPEN":
        names = frozenset(permission["permissions"])
        return Need(all_of=names) if permission["operator"] == "AND" else Need(any_of=names)
    security = operation.get("security") or []
    only_api_key = any(set(s) == {"apiKeyAuth"} for s in security)
    return Need(none="API key only" if only_api_key else "API key and application key")


# -- AWS ---------------------------------------------------------------------------------------------------------


def template_grants(template: Mapping[str, Any]) -> tuple[dict[str, dict[str, set[str]]], set[str], list[str]]:
    """action -> {"functions": who gets it, "policies": the managed policies that grant it}, every function, and
    what could not be read (a SAM policy template or a managed policy by name would grant more than it says)."""
    resources = template["Resources"]
    grants: dict[str, dict[str, set[str]]] = {}
    problems: list[str] = []
    functions = {k for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"}

    def grant(action: str, key: str, holder: str) -> None:
        grants.setdefault(action, {"functions": set(), "policies": set()})[key].add(holder)

    for name, resource in resources.items():
        if resource["Type"] == "AWS::IAM::ManagedPolicy":
            for action in _actions(resource["Properties"]["PolicyDocument"]["Statement"]):
                grant(action, "policies", name)
    for name in sorted(functions):
        for policy in resources[name]["Properties"].get("Policies", []):
            if isinstance(policy, dict) and "Ref" in policy and policy["Ref"] in resources:
                statements = resources[policy["Ref"]]["Properties"]["PolicyDocument"]["Statement"]
            elif isinstance(policy, dict) and "Statement" in policy:
                statements = policy["Statement"]
            else:
                problems.append(f"{name}: policy {policy!r} is not a statement list gpufarm can read")
                continue
            for action in _actions(statements):
                grant(action, "functions", name)
    return grants, functions, problems


def _actions(statements: Iterable[Any]) -> set[str]:
    out: set[str] = set()
    for entry in statements:
        # A conditional statement (the Datadog extension's key) counts with its granting branch.
        statement = entry["Fn::If"][1] if "Fn::If" in entry else entry
        if statement.get("Effect") != "Allow":
            continue
        action = statement["Action"]
        out |= set(action) if isinstance(action, list) else {action}
    return out


def check_granted_to(table: list[Row], grants: Mapping[str, Mapping[str, set[str]]], functions: set[str]) -> list[str]:
    """The AWS table's "granted to" against template.yaml: the functions whose role gets each action (`every
    function`, or their logical ids) and the managed policies that grant it; nothing granted left out."""
    problems = []
    for row in table:
        if row.grant is None:
            continue
        cell = row.cells.get("granted to", "")
        named = set(tokens(cell))
        said = {
            "functions": functions if "every function" in cell else {t for t in named if t.endswith("Function")},
            "policies": {t for t in named if t.endswith("Policy")},
        }
        actual = grants.get(row.grant, {"functions": set(), "policies": set()})
        problems += [
            f"AWS, {row.grant}: the table names {key} {sorted(said[key])}, template.yaml grants it to "
            f"{sorted(actual[key])}"
            for key in ("functions", "policies")
            if said[key] != set(actual[key])
        ]
    listed = {r.grant for r in table}
    return problems + [
        f"template.yaml grants {a}, which the AWS table does not list" for a in sorted(set(grants) - listed)
    ]
