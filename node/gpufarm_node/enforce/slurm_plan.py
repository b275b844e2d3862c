"""The Slurm reservations gpufarm's live leases call for, what `scontrol` says exists, and the difference (pure).

One reservation per lease on a pool with `enforce: slurm`, named `gpufarm-ir-<n>`: its nodes are the lease's hosts
that this Slurm cluster has, its people the requester's cluster user (`enforcement.slurm.users`) or, without one,
the team's Slurm account, and it ends when the lease expires. Reservations whose name has gpufarm's prefix belong
to gpufarm: one no live lease explains is deleted, a missing one created, one that differs put back. Nothing else
in the cluster is touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from enum import StrEnum

from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.hostlist import HostlistError, expand
from gpufarm_node.enforce.leases import Lease

PREFIX = "gpufarm-ir-"
_OWNED = re.compile(r"^gpufarm-ir-([1-9][0-9]{0,8})$")
# A flag every reservation gpufarm creates carries: it is made even while jobs run on its nodes (they finish; new
# ones need the reservation).
FLAGS = "IGNORE_JOBS"
# scontrol's times: the controller's local time, to the second, without a zone.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
# At most this many operations per run; the rest wait for the next run (said in the report).
MAX_OPS_PER_RUN = 200
_NULL = "(null)"


def reservation_name(ir: int) -> str:
    """`gpufarm-ir-123`: the reservation of IR-123 (the runtime's DM names the same: gpufarm.core.config.enforce)."""
    return f"{PREFIX}{ir}"


def owned_ir(name: str) -> int | None:
    """The IR a reservation name of gpufarm's stands for; None for anyone else's reservation."""
    match = _OWNED.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Reservation:
    """A reservation as gpufarm compares it: nodes, people and end (None: the end is not gpufarm's concern)."""

    name: str
    nodes: frozenset[str]
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    end: datetime | None = None

    def same_as(self, other: Reservation) -> bool:
        """True when `other` (what Slurm holds) already is this one, as far as gpufarm decides."""
        if (self.nodes, self.users, self.accounts) != (other.nodes, other.users, other.accounts):
            return False
        return self.end is None or (other.end is not None and abs(self.end - other.end) < timedelta(seconds=1))


@dataclass(frozen=True)
class Notice:
    """Something operators should hear about once (a requester without a cluster user, a lease skipped)."""

    key: str
    text: str


@dataclass(frozen=True)
class Desired:
    """The reservations the leases call for, and what operators should be told about them."""

    reservations: dict[str, Reservation]
    notices: tuple[Notice, ...] = ()


def desired(leases: Iterable[Lease], names: SlurmNames, nodes: Iterable[str], now: datetime) -> Desired:
    """The reservations of the leases on Slurm-enforced pools whose hosts this cluster has.

    A host is matched to a Slurm node by its name, or by its short name (before the first dot) on either side.
    """
    by_name = _node_index(nodes)
    out: dict[str, Reservation] = {}
    notices: list[Notice] = []
    for lease in leases:
        if lease.environment not in names.pools:
            continue
        mine = frozenset(n for h in lease.hosts if (n := _node_of(h, by_name)) is not None)
        if mine:
            reservation, notice = _reservation(lease, mine, names, now)
            notices += [notice] if notice else []
            if reservation is not None:
                out[reservation.name] = reservation
    return Desired(out, tuple(notices))


def _reservation(
    lease: Lease, nodes: frozenset[str], names: SlurmNames, now: datetime
) -> tuple[Reservation | None, Notice | None]:
    """The lease's reservation on `nodes` for its requester's user, else its team's account (said once)."""
    user = names.users.get(lease.requester or "")
    account = names.accounts.get(lease.team)
    if user is None and account is None:
        return None, Notice(f"nobody:{lease.ir}", f"IR-{lease.ir}: team {lease.team} has no Slurm account")
    notice = None
    if user is None:
        notice = Notice(
            f"user:{lease.requester}",
            f"{lease.requester or 'its requester'} has no cluster user Slurm accepts (enforcement.slurm.users): "
            f"IR-{lease.ir}'s reservation names team {lease.team}'s account {account}",
        )
    end = lease.expires_at if lease.expires_at is not None and lease.expires_at > now else None
    people = (frozenset({user}), frozenset()) if user else (frozenset(), frozenset({account or ""}))
    return Reservation(reservation_name(lease.ir), nodes, *people, end), notice


# Names Slurm reads as keywords in a node list (`Nodes=ALL` is every node): never a lease's host.
_NODE_KEYWORDS = frozenset({"all"})


def _node_index(nodes: Iterable[str]) -> dict[str, str]:
    index: dict[str, str] = {}
    for node in nodes:
        if node.lower() in _NODE_KEYWORDS:
            continue
        index.setdefault(node.split(".", 1)[0], node)
        index[node] = node
    return index


def _node_of(host: str, index: Mapping[str, str]) -> str | None:
    if host.lower() in _NODE_KEYWORDS:
        return None
    return index.get(host) or index.get(host.split(".", 1)[0])


# -- what scontrol says --------------------------------------------------------------------------------


class ParseError(ValueError):
    """scontrol printed something the enforcer does not understand; nothing is applied on it."""


def parse_reservations(text: str, tz: tzinfo | None = None) -> dict[str, Reservation]:
    """gpufarm's reservations in `scontrol show reservation --oneliner` output (others' are left out)."""
    out: dict[str, Reservation] = {}
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        fields = _pairs(line)
        name = fields.get("ReservationName", "")
        if owned_ir(name) is None:
            continue
        try:
            nodes = frozenset(expand(_value(fields.get("Nodes"))))
        except HostlistError as exc:
            raise ParseError(f"{name}: {exc}") from None
        out[name] = Reservation(
            name,
            nodes,
            frozenset(_list(fields.get("Users"))),
            frozenset(_list(fields.get("Accounts"))),
            _parse_time(fields.get("EndTime"), tz),
        )
    return out


def parse_nodes(text: str) -> list[str]:
    """The node names in `scontrol show node --oneliner` output."""
    return [line.split(" ", 1)[0].partition("=")[2] for line in text.splitlines() if line.startswith("NodeName=")]


def _pairs(line: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for token in line.split(" "):
        key, sep, value = token.partition("=")
        if sep and key not in pairs:
            pairs[key] = value
    return pairs


def _value(text: str | None) -> str:
    return "" if text is None or text == _NULL else text


def _list(text: str | None) -> list[str]:
    return [v for v in _value(text).split(",") if v]


def _parse_time(text: str | None, tz: tzinfo | None) -> datetime | None:
    try:
        naive = datetime.strptime(_value(text), TIME_FORMAT)
    except ValueError:
        return None
    return naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()


def format_time(when: datetime, tz: tzinfo | None = None) -> str:
    """A time as scontrol takes it: the controller's local time (or `tz`), to the second."""
    return when.astimezone(tz).strftime(TIME_FORMAT)


# -- the difference ------------------------------------------------------------------------------------


class OpKind(StrEnum):
    """What one scontrol call does to one reservation."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True)
class Op:
    """One atomic scontrol operation: its arguments (after `scontrol`), and why it is needed."""

    kind: OpKind
    name: str
    args: tuple[str, ...]
    why: str
    target: Reservation | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Plan:
    """The operations of one run, in order, and those left for the next (beyond MAX_OPS_PER_RUN)."""

    ops: tuple[Op, ...]
    deferred: int = 0


def plan(
    want: Mapping[str, Reservation],
    have: Mapping[str, Reservation],
    applied: Mapping[str, Reservation] | None = None,
    tz: tzinfo | None = None,
    max_ops: int = MAX_OPS_PER_RUN,
) -> Plan:
    """Deletes first (they free nodes a create may need), then creates and updates, each atomic.

    `applied` is what this enforcer last set each reservation to: a reservation that differs from it while the
    lease still wants the same is said to have been edited by hand, and is put back.
    """
    applied = applied or {}
    ops: list[Op] = [
        Op(OpKind.DELETE, name, ("delete", f"ReservationName={name}"), "no live lease holds it")
        for name in sorted(have, key=_order)
        if name not in want
    ]
    for name in sorted(want, key=_order):
        target, current = want[name], have.get(name)
        if current is None:
            ops.append(Op(OpKind.CREATE, name, _create_args(target, tz), "missing", target))
        elif not target.same_as(current):
            edited = name in applied and applied[name] == target
            why = "edited by hand; put back" if edited else "the lease changed"
            ops.append(Op(OpKind.UPDATE, name, _update_args(target, current, tz), why, target))
    return Plan(tuple(ops[:max_ops]), max(0, len(ops) - max_ops))


def _order(name: str) -> int:
    return owned_ir(name) or 0


def _create_args(target: Reservation, tz: tzinfo | None) -> tuple[str, ...]:
    args = ["create", "reservation", f"ReservationName={target.name}", f"Nodes={','.join(sorted(target.nodes))}"]
    args += _people(target, None)
    args += ["StartTime=now"]
    args += [f"EndTime={format_time(target.end, tz)}"] if target.end else ["Duration=UNLIMITED"]
    args += [f"Flags={FLAGS}"]
    return tuple(args)


def _update_args(target: Reservation, current: Reservation, tz: tzinfo | None) -> tuple[str, ...]:
    args = ["update", f"ReservationName={target.name}"]
    if target.nodes != current.nodes:
        args.append(f"Nodes={','.join(sorted(target.nodes))}")
    args += _people(target, current)
    if target.end is not None and (current.end is None or abs(target.end - current.end) >= timedelta(seconds=1)):
        args.append(f"EndTime={format_time(target.end, tz)}")
    return tuple(args)


def _people(target: Reservation, current: Reservation | None) -> list[str]:
    """`Users=` / `Accounts=` setting the target's people, then `-=` removing the other kind in the same call
    (a reservation must always name someone, so the new names go first)."""
    args: list[str] = []
    have_users = current.users if current else frozenset()
    have_accounts = current.accounts if current else frozenset()
    if target.users and target.users != have_users:
        args.append(f"Users={','.join(sorted(target.users))}")
    if target.accounts and target.accounts != have_accounts:
        args.append(f"Accounts={','.join(sorted(target.accounts))}")
    if not target.users and have_users:
        args.append(f"Users-={','.join(sorted(have_users))}")
    if not target.accounts and have_accounts:
        args.append(f"Accounts-={','.join(sorted(have_accounts))}")
    return args
