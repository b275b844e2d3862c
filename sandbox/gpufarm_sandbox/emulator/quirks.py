"""Datadog quirk modes: the other plausible ways Datadog may behave where gpufarm relies on a behaviour Datadog's
documentation does not confirm (docs/design.md, rule 13). A sandbox started with a quirk plays that other way, so
gpufarm can be shown to work under it too (docs/operate.md, "Datadog quirk modes").

The names, a one-line description of each, and the one parser every command line and the Sandbox use.
"""

from __future__ import annotations

from collections.abc import Iterable

NO_FIELD_TRIGGER = "no-field-trigger"
FIELDS_AS_STRING = "fields-as-string"
NO_HEADER_VARS = "no-header-vars"
FACETS_400 = "facets-400"
FACETS_IGNORED = "facets-ignored"
TAG_SOURCE_USER = "tag-source-User"
NO_LIST_WILDCARD = "no-list-wildcard"

# Every quirk and what the sandbox does under it, in the order the docs list them.
QUIRKS: dict[str, str] = {
    NO_FIELD_TRIGGER: "incident_modified_trigger rules fire only when state or severity changed, whatever renotify_on "
    "says",
    FIELDS_AS_STRING: "a webhook payload's $INCIDENT_FIELDS is a JSON string holding the fields' JSON, not an object",
    NO_HEADER_VARS: "$VARIABLES are not substituted in a webhook's custom headers: they are sent literally",
    FACETS_400: "incident search answers 400 to a custom-field or incident_type facet (state and severity work)",
    FACETS_IGNORED: "incident search ignores custom-field and incident_type facets: they match every incident",
    TAG_SOURCE_USER: "the host list names the tag source `user` as `User` in tags_by_source",
    NO_LIST_WILDCARD: "in incident search, a `*` wildcard in a value of a multi-value field matches nothing",
}

ALL = "all"


def parse_quirks(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The quirks a comma-separated list (or `all`), or an iterable of names, asks for; ValueError for an unknown name.

    Names match case-insensitively and blanks are skipped, so `""` and None ask for none.
    """
    if spec is None:
        return frozenset()
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    by_lower = {name.lower(): name for name in QUIRKS}
    chosen: set[str] = set()
    for part in parts:
        name = str(part).strip()
        if not name:
            continue
        if name.lower() == ALL:
            chosen.update(QUIRKS)
            continue
        canonical = by_lower.get(name.lower())
        if canonical is None:
            raise ValueError(f"unknown Datadog quirk {name!r}; valid: {', '.join(QUIRKS)} or {ALL}")
        chosen.add(canonical)
    return frozenset(chosen)


def describe_quirks(quirks: Iterable[str]) -> str:
    """`none`, or the quirks in their documented order, comma-separated (for startup lines and the demo)."""
    active = set(quirks)
    names = [name for name in QUIRKS if name in active]
    return ", ".join(names) if names else "none"
