"""Sandbox: Datadog's incident search: the query language, parsed and evaluated, and the answer's facets.

`state:(active OR stable) AND team:nlp -severity:SEV-1 "free text"`: facets joined by AND (or side by side),
values by OR inside a facet group, `-facet:value` and `NOT` negate, quoted values and `*` wildcards. The
incidents module supplies each incident's values per facet; the language knows nothing of incidents. The
answer's `facets` (counts per severity, state, field value, incident type...) follow the recorded search answers.
Three Datadog quirk modes reshape a parsed query before it is evaluated (`without_facets`, `without_list_wildcards`).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.emulator.incidents_config import (
    BUILTIN_FIELDS,
    SANDBOX_USER_ID,
    SEVERITIES,
    SLUG,
    STATES,
    IncidentConfig,
    user_attributes,
)

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.incidents_record import StoredIncident


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


# A query that asks for nothing: every incident matches it (what is left of a query whose every term was dropped).
EVERYTHING: Node = All(())


def without_facets(node: Node, dropped: Callable[[str], bool]) -> Node:
    """The query as if its terms on the facets `dropped` accepts were absent (the `facets-ignored` quirk).

    A dropped term leaves its group, negation included; a group left empty is dropped from its parent in turn, and
    a query with nothing left matches everything.
    """
    return _without(node, dropped) or EVERYTHING


def _without(node: Node, dropped: Callable[[str], bool]) -> Node | None:
    if isinstance(node, Term):
        return None if node.facet is not None and dropped(node.facet) else node
    if isinstance(node, Not):
        child = _without(node.child, dropped)
        return None if child is None else Not(child)
    kept = tuple(c for c in (_without(child, dropped) for child in node.children) if c is not None)
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else type(node)(kept)


def without_list_wildcards(node: Node, is_list: Callable[[str], bool]) -> Node:
    """The query with every `*` value of a multi-value field's term removed (the `no-list-wildcard` quirk): such a
    value matches nothing, so a term left with no value matches no incident."""
    if isinstance(node, Term):
        if node.facet is None or not is_list(node.facet):
            return node
        return Term(node.facet, tuple(v for v in node.values if "*" not in v))
    if isinstance(node, Not):
        return Not(without_list_wildcards(node.child, is_list))
    return type(node)(tuple(without_list_wildcards(child, is_list) for child in node.children))


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


# -- the answer's facets ----------------------------------------------------------------------------


def answer_facets(found: Sequence[StoredIncident], config: IncidentConfig) -> dict[str, Any]:
    """The `facets` of a search answer over the incidents found (counts per value, as Datadog answers)."""
    n = len(found)
    users = [_user_facet(SANDBOX_USER_ID, n)] if n else []
    return {
        "severity": _counts((i.severity for i in found), SEVERITIES),
        "time_to_repair": [_aggregate("time_to_repair", [])],
        "visibility": _counts(["organization"] * n),
        "responder": _user_facets(r for i in found for r in i.responders),
        "impact": _counts("customer" if i.customer_impacted else "none" for i in found),
        "time_to_detect": [_aggregate("time_to_detect", [])],
        "postmortem": [{"name": "No", "count": n}, {"name": "Yes", "count": 0}],
        "time_to_resolve": [_aggregate("time_to_resolve", _resolve_times(found))],
        "is_test": _bool_counts(i.is_test for i in found),
        "state": _counts((i.state for i in found), STATES),
        "customer_impacted": _bool_counts(i.customer_impacted for i in found),
        "fields": _field_facets(found, config),
        "created_by": users,
        "declared_by": users,
        "last_modified_by": users,
        "commander": _user_facets(i.commander_id for i in found if i.commander_id),
        "incident_type": _type_facets(found, config),
    }


def _resolve_times(found: Sequence[StoredIncident]) -> list[int]:
    return [seconds_to_resolve(i) for i in found if i.resolved]


def _type_facets(found: Sequence[StoredIncident], config: IncidentConfig) -> list[dict[str, Any]]:
    return [
        {"name": config.type_name(t), "count": c, "id": t}
        for t, c in Counter(i.incident_type_id for i in found).most_common()
    ]


# A field whose values in the answer are more varied than this gets no facet (free text, ids, host names).
MAX_FIELD_FACET_VALUES = 100


def _field_facets(found: Sequence[StoredIncident], config: IncidentConfig) -> list[dict[str, Any]]:
    specs: list[tuple[str, tuple[str, ...] | None]] = [
        (name, allowed) for name, (_, allowed) in BUILTIN_FIELDS.items() if name not in ("severity", "state")
    ]
    # One facet per field name, whichever types define it (the first definition's choices order it).
    named: dict[str, tuple[str, ...] | None] = {}
    for definition in config.fields.values():
        named.setdefault(definition.name, definition.allowed)
    specs += list(named.items())
    specs.append((SLUG, None))
    # One pass over each incident's values, counted per field until a field shows more distinct values than any
    # facet lists (it gets none then: history lines, host names, ids), rather than one pass over every incident per
    # field: the facets of a pool's thousands of incidents are the search's largest cost after a change.
    counted: dict[str, Counter[str] | None] = {name: Counter() for name, _ in specs}
    for incident in found:
        for name, value in (*incident.fields.items(), (SLUG, incident.slug)):
            _count_value(counted, name, value)
    out = []
    for name, allowed in sorted(specs):
        counter = counted[name]
        facets = _counts(counter, allowed or ()) if counter is not None else None
        if facets is None or len(facets) > MAX_FIELD_FACET_VALUES:
            # Recorded: a 5-incident answer lists every slug; a 1,505-incident one has no slug facet at all.
            continue
        out.append({"name": name, "facets": facets})
    return out


def _count_value(counted: dict[str, Counter[str] | None], name: str, value: Any) -> None:
    """Count one field value; a field past MAX_FIELD_FACET_VALUES distinct values is dropped (None)."""
    counter = counted.get(name)
    if counter is None or value is None:
        return
    if isinstance(value, list):
        counter.update(value)
    else:
        counter[value] += 1
    if len(counter) > MAX_FIELD_FACET_VALUES:
        counted[name] = None


def _user_facet(user_id: str, count: int) -> dict[str, Any]:
    attrs = user_attributes(user_id)
    return {
        "name": attrs["name"] or attrs["handle"],
        "count": count,
        "handle": attrs["handle"],
        "uuid": user_id,
        "email": attrs["email"],
    }


def _user_facets(user_ids: Iterable[str]) -> list[dict[str, Any]]:
    return [_user_facet(uid, count) for uid, count in Counter(user_ids).most_common()]


def _counts(values: Iterable[str], order: Sequence[str] = ()) -> list[dict[str, Any]]:
    counted = values if isinstance(values, Counter) else Counter(values)
    out: list[dict[str, Any]] = [{"name": name, "count": count} for name, count in counted.most_common()]
    out += [{"name": name, "count": 0} for name in order if name not in counted]
    return out


def _bool_counts(values: Iterable[bool]) -> list[dict[str, Any]]:
    counted = Counter(values)
    return [{"name": flag, "count": counted.get(flag, 0)} for flag in (False, True)]


def _aggregate(name: str, values: list[int]) -> dict[str, Any]:
    return {
        "name": name,
        "aggregates": {"min": float(min(values)) if values else None, "max": float(max(values)) if values else None},
    }


def seconds_to_resolve(incident: StoredIncident) -> int:
    """Seconds from creation to resolution (0 while unresolved): `time_to_resolve` of answers and facets."""
    if incident.resolved is None:
        return 0
    return max(0, int((incident.resolved - incident.created).total_seconds()))
