"""Who sees a lease: its requester, its team's members and the GPU operators; anyone else is told it belongs to
another team.

A lease's status carries its purpose, its history and its profiler runs' signed page links (which open for whoever
holds them, gpufarm.profiling.links), so `/gpu status`, `/gpu list` and the release confirmation show a lease only
to those who may see it. The rule is the one `/gpu report` and every change use (gpufarm.core.governance.membership):
a member of the lease's team or an operator; the requester too, who may have left the team since. A farm whose
teams name no members checks nothing (every user is every team's member), and a farm YAML with `visibility: org`
opens every lease to everyone on purpose. Membership that cannot be read is never guessed: the answer is a retry
hint (MembershipUnavailable), never the lease.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufarm.core.config.farm import Visibility
from gpufarm.core.governance.membership import Membership, MembershipUnavailable
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError
from gpufarm.core.kernel.model import Allocation


def is_open(membership: Membership) -> bool:
    """True when every lease is shown to everyone: `visibility: org`, or a farm that checks no membership."""
    farm = membership.farm
    return farm.visibility is Visibility.ORG or not farm.membership_checked


def _is_operator(membership: Membership, user: str) -> bool:
    try:
        return membership.is_operator(user)
    except UpstreamError as exc:
        raise MembershipUnavailable(f"Slack could not say who the GPU operators are ({exc}); try again") from None


def sees_team(membership: Membership, user: str, team: str | None) -> bool:
    """True when `user` sees every lease of `team`: the farm is open, or they are its member or an operator."""
    if is_open(membership) or _is_operator(membership, user):
        return True
    return team is not None and membership.is_member(user, team)


def sees(membership: Membership, user: str, alloc: Allocation) -> bool:
    """True when `user` may see `alloc`: its requester, a member of its team, an operator, or an open farm."""
    return user == alloc.requester or sees_team(membership, user, alloc.team)


def check(membership: Membership, user: str, alloc: Allocation) -> None:
    """NotAllowed ("IR-n belongs to another team") unless `user` may see `alloc`; nothing of it is told."""
    if not sees(membership, user, alloc):
        raise NotAllowed(f"{alloc.ir_label} belongs to another team")


def visible(membership: Membership, user: str, leases: Iterable[Allocation]) -> tuple[list[Allocation], int]:
    """The leases `user` may see, in their order, and how many others were left out."""
    shown: list[Allocation] = []
    hidden = 0
    for alloc in leases:
        if sees(membership, user, alloc):
            shown.append(alloc)
        else:
            hidden += 1
    return shown, hidden
