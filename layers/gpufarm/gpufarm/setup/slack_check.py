"""`gpufarm slack check`: every Slack user group the farm configuration names exists, and who is in each.

The runtime finds an unknown team group only when it first resolves it (gpufarm.core.governance.membership: the ingress
loads the farm without calling Slack, and each request reads only the groups it needs). Operators run this after
changing the farm YAML, or in CI before deploying it, to meet the same configuration error at once, for every team.
Exit status: 0 every group resolves; 1 a group Slack does not know (the key is named); 2 Slack could not answer.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.governance.membership import Membership, MembershipMisconfigured
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import Chat


def report(farm: FarmConfig, chat: Chat, out: Callable[[str], None]) -> int:
    """Print each group's resolution; the exit status `check` documents."""
    members = Membership(farm, chat, farm.operators_usergroup)
    status = 0
    if farm.operators_usergroup:
        try:
            out(f"operators_usergroup {farm.operators_usergroup}: {len(members.operators())} member(s)")
        except UpstreamError as exc:
            out(f"operators_usergroup {farm.operators_usergroup}: {exc}")
            status = max(status, 1 if "no_such_subteam" in str(exc) else 2)
    if not farm.membership_checked:
        out("no team names members: membership is not checked (every team is open to every user)")
        return status
    for name in sorted(farm.teams):
        try:
            found = members.members(name) or frozenset()
        except MembershipMisconfigured as exc:
            out(f"team {name}: {exc}")
            status = max(status, 1)
        except UpstreamError as exc:
            out(f"team {name}: {exc}")
            status = 2
        else:
            out(f"team {name}: {len(found)} member(s)" + ("" if found else " (nobody can request for it)"))
    return status
