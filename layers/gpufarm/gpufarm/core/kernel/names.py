"""Tag-safe names (teams, projects, pools), checked without a model: shared by the request's models
(gpufarm.core.kernel.model) and the paths that load none, such as the report's query."""

from __future__ import annotations

import re

from gpufarm.core.kernel.errors import ValidationFailed

# Names end up in Datadog tags (`project:llm-ko`): lowercase, start with a letter, no tag-breaking characters.
NAME_PATTERN = r"^[a-z][a-z0-9_.\-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)


def lower_name(text: str) -> str:
    """The name in lower case; ValueError saying what a name may be otherwise."""
    value = text.strip().lower()
    if not _NAME_RE.match(value):
        raise ValueError(
            "use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter (it becomes a Datadog tag)"
        )
    return value


def validate_name(field: str, value: str) -> str:
    """Validate one tag-safe name, raising ValidationFailed naming the field."""
    try:
        return lower_name(value)
    except ValueError as exc:
        raise ValidationFailed(field, f"{field}: {exc}") from None
