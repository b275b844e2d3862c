"""Live leases as an enforcer sees them, decoded from gpufarm's incidents (pure).

The node distribution ships without the runtime, so it carries its own copy of the few incident-field names and
phases it reads; `tests/unit/test_enforce_contract.py` holds them equal to `gpufarm.core.kernel.fields` and
`gpufarm.core.kernel.lifecycle`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# Incident field names (gpufarm.core.kernel.fields).
PHASE = "phase"
TEAM = "team"
ENVIRONMENT = "environment"
REQUESTER = "requester"
EXPIRES_AT = "expires_at"
HOSTS = "hosts"
# The phases in which a lease holds its hosts (gpufarm.core.kernel.lifecycle.Phase): enforced while in one of these.
HOLDING_PHASES = frozenset({"allocated", "idle-warned"})
# Incident states of a live lease.
LIVE_STATES = frozenset({"active", "stable"})

# Bounds on what one incident may bring in: its text is hand-editable in Datadog.
MAX_HOSTS_PER_LEASE = 512
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_USER = re.compile(r"^[UW][A-Z0-9]{2,20}$")


@dataclass(frozen=True)
class Lease:
    """What an enforcer needs of one live lease: its number, pool, people, hosts and end."""

    ir: int
    environment: str
    team: str
    requester: str | None
    hosts: tuple[str, ...]
    expires_at: datetime | None


@dataclass(frozen=True)
class Skipped:
    """An incident that is not an enforceable lease, and why (said once per run, never applied)."""

    ir: int
    why: str


def lease_of(data: Mapping[str, Any]) -> Lease | Skipped | None:
    """The lease an incident's data object (`{"id", "attributes": {...}}`) describes; None when it holds no hosts
    (not live, not allocated); Skipped when a field it needs is malformed."""
    attributes = data.get("attributes")
    if not isinstance(attributes, Mapping):
        return None
    ir = attributes.get("public_id")
    if not isinstance(ir, int) or ir <= 0:
        return None
    if attributes.get("state") not in LIVE_STATES:
        return None
    fields = _fields(attributes.get("fields"))
    if fields.get(PHASE) not in HOLDING_PHASES:
        return None
    why = _malformed(fields)
    if why:
        return Skipped(ir, why)
    hosts = fields.get(HOSTS)
    requester = fields.get(REQUESTER)
    return Lease(
        ir=ir,
        environment=str(fields.get(ENVIRONMENT)),
        team=str(fields.get(TEAM)),
        requester=requester if isinstance(requester, str) and _USER.match(requester) else None,
        hosts=tuple(sorted(set(_host_list(hosts)))),
        expires_at=_time(fields.get(EXPIRES_AT)),
    )


def _host_list(hosts: str | list[str] | None) -> list[str]:
    return [hosts] if isinstance(hosts, str) else list(hosts or [])


def _malformed(fields: Mapping[str, str | list[str] | None]) -> str | None:
    """Why a lease's fields cannot be enforced (hand-edited into something else), or None."""
    environment, team = fields.get(ENVIRONMENT), fields.get(TEAM)
    if not isinstance(environment, str) or not _NAME.match(environment):
        return "no valid environment"
    if not isinstance(team, str) or not _NAME.match(team):
        return "no valid team"
    hosts = _host_list(fields.get(HOSTS))
    if len(hosts) > MAX_HOSTS_PER_LEASE or not all(_HOST.match(h) for h in hosts):
        return "hosts field holds a value that is not a host name"
    return None


def _fields(raw: Any) -> dict[str, str | list[str] | None]:
    """Datadog's `{"name": {"type", "value"}}` field objects as plain values (strings and lists of strings)."""
    out: dict[str, str | list[str] | None] = {}
    if not isinstance(raw, Mapping):
        return out
    for name, obj in raw.items():
        value = obj.get("value") if isinstance(obj, Mapping) else obj
        if isinstance(value, list):
            out[str(name)] = [str(v) for v in value]
        elif value is not None:
            out[str(name)] = str(value)
    return out


def _time(text: str | list[str] | None) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)
