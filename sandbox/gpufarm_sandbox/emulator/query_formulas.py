"""Formulas over named metric queries (`a / b * 100`), as dashboards and the v2 query API use them: parsing, and
combining the queries' groups point by point (timeseries) or value by value (scalars)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufarm_sandbox.emulator.query import GroupSeries, QueryError


@dataclass(frozen=True)
class Formula:
    """A parsed arithmetic formula over query names (`a / b * 100`)."""

    text: str
    names: tuple[str, ...]
    tree: tuple[object, ...]

    def compute(self, env: Mapping[str, float]) -> float | None:
        """The formula's value for one set of operand values; None on a missing operand or division by zero."""
        return _calc(self.tree, env)


_FORMULA_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)|([A-Za-z_][A-Za-z0-9_]*)|([-+*/()]))")


Node = tuple[object, ...]


def parse_formula(text: str) -> Formula:
    """Parse `+ - * /`, parentheses, numbers and query names; raises QueryError."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("Invalid formula: empty")
    parser = _FormulaParser(text)
    tree = parser.expr()
    if parser.peek() is not None:
        raise parser.error(f"unexpected {parser.tokens[parser.i][1]!r}")
    return Formula(text.strip(), tuple(dict.fromkeys(parser.names)), tree)


class _FormulaParser:
    """Precedence climbing over formula tokens: unary sign, then * /, then + -."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        self.names: list[str] = []
        self.i = 0
        pos = 0
        while pos < len(text) and text[pos:].strip():
            m = _FORMULA_TOKEN.match(text, pos)
            if not m:
                raise self.error(f"unexpected {text[pos:].strip()[:10]!r}")
            num, name, op = m.groups()
            self.tokens.append(("num", num) if num else ("name", name) if name else ("op", op))
            pos = m.end()

    def error(self, what: str) -> QueryError:
        """An error naming the formula."""
        return QueryError(f"Invalid formula {self.text!r}: {what}")

    def peek(self) -> tuple[str, str] | None:
        """The next token, not consumed."""
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        """Consume the next token."""
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end")
        self.i += 1
        return tok

    def expr(self) -> Node:
        """Sums and differences."""
        node = self.term()
        while (tok := self.peek()) and tok[0] == "op" and tok[1] in "+-":
            self.take()
            node = ("bin", tok[1], node, self.term())
        return node

    def term(self) -> Node:
        """Products and quotients."""
        node = self.unary()
        while (tok := self.peek()) and tok[0] == "op" and tok[1] in "*/":
            self.take()
            node = ("bin", tok[1], node, self.unary())
        return node

    def unary(self) -> Node:
        """A signed operand."""
        tok = self.peek()
        if tok == ("op", "-"):
            self.take()
            return ("neg", self.unary())
        if tok == ("op", "+"):
            self.take()
            return self.unary()
        return self.atom()

    def atom(self) -> Node:
        """A number, a query name or a parenthesised expression."""
        kind, value = self.take()
        if kind == "num":
            return ("num", float(value))
        if kind == "name":
            if self.peek() == ("op", "("):
                raise self.error(f"function {value}() is not supported")
            self.names.append(value)
            return ("name", value)
        if value == "(":
            node = self.expr()
            if self.take() != ("op", ")"):
                raise self.error("missing ')'")
            return node
        raise self.error(f"unexpected {value!r}")


def _calc(node: tuple[object, ...], env: Mapping[str, float]) -> float | None:
    kind = node[0]
    if kind == "num":
        return float(node[1])  # type: ignore[arg-type]
    if kind == "name":
        return env.get(str(node[1]))
    if kind == "neg":
        inner = _calc(node[1], env)  # type: ignore[arg-type]
        return None if inner is None else -inner
    left = _calc(node[2], env)  # type: ignore[arg-type]
    right = _calc(node[3], env)  # type: ignore[arg-type]
    if left is None or right is None:
        return None
    op = node[1]
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return None if right == 0 else left / right


def match_groups(
    tables: Mapping[str, Mapping[tuple[str, ...], object]],
) -> list[tuple[tuple[str, ...], dict[str, tuple[str, ...]]]]:
    """Pair up the groups of several query results: equal group tags match; an ungrouped result applies to all."""
    broadcast = {n: t for n, t in tables.items() if set(t) == {()}}
    grouped = {n: t for n, t in tables.items() if n not in broadcast}
    if not grouped:
        return [((), dict.fromkeys(tables, ()))] if tables and all(tables.values()) else []
    common: set[tuple[str, ...]] | None = None
    for table in grouped.values():
        common = set(table) if common is None else common & set(table)
    out = []
    for group in sorted(common or ()):
        binding = dict.fromkeys(grouped, group)
        binding.update(dict.fromkeys(broadcast, ()))
        out.append((group, binding))
    return out


def formula_series(formula: Formula, results: Mapping[str, Sequence[GroupSeries]]) -> list[GroupSeries]:
    """Apply a formula point by point to named query results (same bucket times), group by group."""
    missing = [n for n in formula.names if n not in results]
    if missing:
        raise QueryError(f"Invalid formula {formula.text!r}: unknown query name {missing[0]!r}")
    tables = {n: {g.group_tags: dict(g.points) for g in results[n]} for n in formula.names}
    if not tables:  # a constant formula
        return []
    out: list[GroupSeries] = []
    for group, binding in match_groups(tables):
        points = _formula_points(formula, {n: tables[n][g] for n, g in binding.items()})
        if points:
            out.append(GroupSeries(group, points))
    return out


def _formula_points(formula: Formula, operands: Mapping[str, Mapping[float, float]]) -> list[tuple[float, float]]:
    """The formula at every time any operand has a point (finite values only)."""
    times = sorted(set().union(*(set(p) for p in operands.values())))
    points: list[tuple[float, float]] = []
    for t in times:
        value = formula.compute({n: p[t] for n, p in operands.items() if t in p})
        if value is not None and math.isfinite(value):
            points.append((t, value))
    return points


def formula_scalars(
    formula: Formula, results: Mapping[str, Mapping[tuple[str, ...], float | None]]
) -> dict[tuple[str, ...], float | None]:
    """Apply a formula to named scalar results, group by group."""
    missing = [n for n in formula.names if n not in results]
    if missing:
        raise QueryError(f"Invalid formula {formula.text!r}: unknown query name {missing[0]!r}")
    tables = {n: results[n] for n in formula.names}
    out: dict[tuple[str, ...], float | None] = {}
    for group, binding in match_groups(tables):
        env = {n: v for n, g in binding.items() if (v := tables[n][g]) is not None}
        value = formula.compute(env)
        out[group] = value if value is not None and math.isfinite(value) else None
    return out
