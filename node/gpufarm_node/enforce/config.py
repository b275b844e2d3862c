"""What an enforcer reads of the farm file: which pools it enforces and whose names go into a reservation.

The runtime validates the whole file (gpufarm.core.config.enforce); the enforcer, which ships without it, reads
and checks only this slice with the same rules, and `tests/unit/test_enforce_contract.py` holds the two equal on
good and bad files:

    environments:
      onprem-hpc: {enforce: slurm, ...}
    enforcement:
      slurm:
        users: {U0DANA: dana}        # Slack user id -> cluster user the reservation names
        accounts: {nlp: nlp}         # team -> Slurm account, named when the requester has no user here
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENFORCERS = ("none", "slurm", "kubernetes")
SLACK_USER = re.compile(r"^[UW][A-Z0-9]{2,20}$")
TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# A POSIX user name as Slurm resolves it (getpwnam), and a Slurm account (stored lower-case).
CLUSTER_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
SLURM_ACCOUNT = re.compile(r"^[a-z0-9_][a-z0-9_.-]{0,63}$")
MAX_USERS = 20_000
MAX_FARM_BYTES = 1 << 20


class EnforceConfigError(ValueError):
    """The farm file's enforcement slice is invalid; the message names the key."""


@dataclass(frozen=True)
class SlurmNames:
    """The pools Slurm enforces, and the cluster names of the people who hold their leases."""

    pools: frozenset[str]
    users: Mapping[str, str] = field(default_factory=dict)
    accounts: Mapping[str, str] = field(default_factory=dict)


def load_slurm_names(path: str | Path) -> SlurmNames:
    """Read and check the farm file's Slurm slice; EnforceConfigError on anything wrong."""
    import yaml

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise EnforceConfigError(f"cannot read the farm file {path}: {exc.strerror}") from None
    if len(raw) > MAX_FARM_BYTES:
        raise EnforceConfigError(f"the farm file {path} is over {MAX_FARM_BYTES} bytes")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise EnforceConfigError(f"the farm file is not valid YAML: {str(exc)[:200]}") from None
    return slurm_names(data)


def slurm_names(data: Any) -> SlurmNames:
    """The Slurm slice of a parsed farm file, checked."""
    if not isinstance(data, Mapping):
        raise EnforceConfigError("the farm file must be a YAML mapping")
    pools = _pools(data.get("environments"))
    enforcement = data.get("enforcement")
    section = (enforcement.get("slurm") if isinstance(enforcement, Mapping) else None) or {}
    if not isinstance(section, Mapping):
        raise EnforceConfigError("enforcement.slurm must be a mapping")
    users = _names(section.get("users"), "enforcement.slurm.users", SLACK_USER, CLUSTER_USER)
    accounts = _names(section.get("accounts"), "enforcement.slurm.accounts", TEAM, SLURM_ACCOUNT)
    teams = data.get("teams") or {}
    if not isinstance(teams, Mapping):
        raise EnforceConfigError("teams must be a mapping")
    _check_accounts(pools, accounts, teams)
    return SlurmNames(pools, users, accounts)


def _pools(environments: Any) -> frozenset[str]:
    """The pools with `enforce: slurm`."""
    if not isinstance(environments, Mapping) or not environments:
        raise EnforceConfigError("environments: the farm file names no pool")
    pools = set()
    for name, spec in environments.items():
        enforce = spec.get("enforce", "none") if isinstance(spec, Mapping) else "none"
        if enforce not in ENFORCERS:
            raise EnforceConfigError(f"environments.{name}.enforce: {str(enforce)[:40]!r} is not one of {ENFORCERS}")
        if enforce == "slurm":
            pools.add(str(name))
    return frozenset(pools)


def _check_accounts(pools: frozenset[str], accounts: Mapping[str, str], teams: Mapping[Any, Any]) -> None:
    """Every account is a team's; every team has one once a pool is enforced by Slurm."""
    for team in accounts:
        if team not in teams:
            raise EnforceConfigError(f"enforcement.slurm.accounts: {team!r} is not a team")
    missing = sorted(str(t) for t in teams if t not in accounts)
    if pools and missing:
        raise EnforceConfigError(
            f"enforcement.slurm.accounts: team {missing[0]!r} has no Slurm account, and pools "
            f"{', '.join(sorted(pools))} are enforced by Slurm (a requester without a user there needs one)"
        )


def _names(raw: Any, where: str, key_re: re.Pattern[str], value_re: re.Pattern[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise EnforceConfigError(f"{where} must be a mapping")
    if len(raw) > MAX_USERS:
        raise EnforceConfigError(f"{where}: more than {MAX_USERS} entries")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key_re.match(key):
            what = "a Slack user id (U...)" if key_re is SLACK_USER else "a team name"
            raise EnforceConfigError(f"{where}: {str(key)[:40]!r} is not {what}")
        if not isinstance(value, str) or not value_re.match(value):
            raise EnforceConfigError(f"{where}.{key}: {str(value)[:40]!r} is not a valid cluster name")
        out[key] = value
    return out
