"""Sandbox: Datadog's incident search language, parsed and evaluated.

`state:(active OR stable) AND team:nlp -severity:SEV-1 "free text"`: facets joined by AND (or side by side),
values by OR inside a facet group, `-facet:value` and `NOT` negate, quoted values and `*` wildcards. The
incidents module supplies each incident's values per facet; this module knows nothing of incidents.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable
from dataclasses import dataclass


class QueryError(ValueError):
    """A search query the sandbox cannot parse."""


@dataclass(frozen=True)
class Term:
    """`facet:value`, `facet:(a OR b)`, or free text on the title when facet is None."""

    facet: str | None
    values: tuple[str, ...]


@dataclass(frozen=True)
class Not:
    """Negation: `-facet:value` or `NOT term`."""

    child: Node


@dataclass(frozen=True)
class All:
    """Conjunction (`AND`, or terms side by side)."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    """Disjunction (`OR`)."""

    children: tuple[Node, ...]


Node = Term | Not | All | AnyOf

_TOKEN = re.compile(r'\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<q>"(?:[^"\\]|\\.)*")|(?P<w>[^\s()"]+))')


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise QueryError(f"unexpected character at position {pos}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent over: expr := and (OR and)*; and := unary ((AND)? unary)*; unary := NOT unary | primary."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise QueryError("the query is empty")
        node = self._expr()
        if self.pos != len(self.tokens):
            raise QueryError(f"unexpected {self.tokens[self.pos][1]!r}")
        return node

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise QueryError("the query ends too early")
        self.pos += 1
        return token

    def _expr(self) -> Node:
        nodes = [self._and()]
        while self._peek() == ("w", "OR"):
            self.pos += 1
            nodes.append(self._and())
        return nodes[0] if len(nodes) == 1 else AnyOf(tuple(nodes))

    def _and(self) -> Node:
        nodes = [self._unary()]
        while (token := self._peek()) is not None and token[0] != "rp" and token != ("w", "OR"):
            if token == ("w", "AND"):
                self.pos += 1
            nodes.append(self._unary())
        return nodes[0] if len(nodes) == 1 else All(tuple(nodes))

    def _unary(self) -> Node:
        if self._peek() == ("w", "NOT"):
            self.pos += 1
            return Not(self._unary())
        return self._primary()

    def _primary(self) -> Node:
        kind, text = self._next()
        if kind == "lp":
            inner = self._expr()
            if self._next()[0] != "rp":
                raise QueryError("missing ')'")
            return inner
        if kind == "q":
            return Term(None, (_unquote(text),))
        if kind == "rp" or text in ("AND", "OR"):
            raise QueryError(f"unexpected {text!r}")
        negated = text.startswith("-") and len(text) > 1
        word = text[1:] if negated else text
        facet, colon, value = word.partition(":")
        node: Node = Term(facet.lower(), self._values(value)) if colon and facet else Term(None, (word,))
        return Not(node) if negated else node

    def _values(self, inline: str) -> tuple[str, ...]:
        if inline:
            return (inline,)
        kind, text = self._next()
        if kind == "q":
            return (_unquote(text),)
        if kind == "w":
            return (text,)
        if kind != "lp":
            raise QueryError("a facet needs a value")
        values: list[str] = []
        while True:
            kind, text = self._next()
            if kind not in ("w", "q") or text in ("AND", "OR", "NOT"):
                raise QueryError("a facet group holds values joined by OR")
            values.append(_unquote(text) if kind == "q" else text)
            kind, text = self._next()
            if kind == "rp":
                return tuple(values)
            if (kind, text) != ("w", "OR"):
                raise QueryError("values inside a facet group are joined by OR")


def _unquote(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        raise QueryError(f"bad quoted value {text}") from None
    return str(value)


def parse_query(text: str) -> Node:
    """Parse Datadog's incident search syntax: `state:(active OR stable) AND team:nlp -severity:SEV-1`."""
    return _Parser(_tokenize(text)).parse()


def query_facets(node: Node) -> set[str]:
    """Every facet name a query uses."""
    if isinstance(node, Term):
        return {node.facet} if node.facet is not None else set()
    if isinstance(node, Not):
        return query_facets(node.child)
    out: set[str] = set()
    for child in node.children:
        out |= query_facets(child)
    return out


def matches(node: Node, values_of: Callable[[str | None], list[str]]) -> bool:
    """Evaluate a parsed query; `values_of(facet)` gives an incident's values for a facet (None: the title)."""
    if isinstance(node, Term):
        actual = values_of(node.facet)
        if node.facet is None:
            return any(_text_matches(a, p) for a in actual for p in node.values)
        return any(_value_matches(a, p) for a in actual for p in node.values)
    if isinstance(node, Not):
        return not matches(node.child, values_of)
    if isinstance(node, All):
        return all(matches(child, values_of) for child in node.children)
    return any(matches(child, values_of) for child in node.children)


def _glob(pattern: str) -> str:
    return pattern.lower().replace("[", "[[]")


def _value_matches(actual: str, pattern: str) -> bool:
    if "*" in pattern:
        return fnmatch.fnmatchcase(actual.lower(), _glob(pattern))
    return actual.lower() == pattern.lower()


def _text_matches(title: str, pattern: str) -> bool:
    # Free text finds words anywhere in the title, with or without wildcards.
    if "*" in pattern:
        return fnmatch.fnmatchcase(title.lower(), f"*{_glob(pattern)}*")
    return pattern.lower() in title.lower()
