"""Who may act for a team: the members the farm YAML names (a Slack user group, users, or both) and the operators.

A user may request for, extend or release only within their teams; the GPU operators act for any team. Members
of a user group are read from Slack (usergroups.users.list) at most once per group per invocation: a `Membership`
lives for one invocation (LeaseContext.reading opens it) and the Slack adapter keeps each group's members for a minute
across warm invocations. Membership that cannot be read is never guessed: a Slack failure refuses the action with
a retry hint (MembershipUnavailable), and a user group Slack does not know is a configuration error naming the
team (MembershipMisconfigured), raised where the group is first resolved, because only Slack can say a group
exists and the runtime loads without calling Slack (the ingress has 3 seconds and needs no membership).
A farm whose teams name no members checks nothing (FarmConfig.membership_checked).
"""

from __future__ import annotations

from gpufarm.core.config.farm import FarmConfig, FarmConfigError
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError, ValidationFailed
from gpufarm.core.kernel.ports import Chat

# Slack's error code for a user group id it does not know.
NO_SUCH_GROUP = "no_such_subteam"


class MembershipUnavailable(UpstreamError):
    """Slack could not say who is in a team right now; the action is refused, nothing changed, try again."""


class MembershipMisconfigured(FarmConfigError):
    """A team's user group does not exist in Slack: the farm configuration names a group it must fix."""


class Membership:
    """Team membership and operator checks for one invocation; each user group is asked of Slack at most once."""

    def __init__(self, farm: FarmConfig, chat: Chat, operators_usergroup: str | None) -> None:
        self.farm = farm
        self.chat = chat
        self.operators_usergroup = operators_usergroup
        self._groups: dict[str, frozenset[str]] = {}

    # -- lookups ---------------------------------------------------------------------------------------------------

    def operators(self) -> frozenset[str]:
        """The GPU operators (empty when no operators group is configured)."""
        if not self.operators_usergroup:
            return frozenset()
        return self._group(self.operators_usergroup, "operators_usergroup", raw=True)

    def is_operator(self, user: str) -> bool:
        """True for a member of the operators' user group."""
        return user in self.operators()

    def members(self, team: str) -> frozenset[str] | None:
        """Everyone who may act for `team`; None when the farm checks no membership (every team is open)."""
        if not self.farm.membership_checked:
            return None
        spec = self.farm.teams.get(team)
        if spec is None or spec.members is None:
            return frozenset()
        found = set(spec.members.users)
        if spec.members.usergroup:
            found |= self._group(spec.members.usergroup, f"teams.{team}.members.usergroup")
        return frozenset(found)

    def is_member(self, user: str, team: str) -> bool:
        """True when `user` belongs to `team` (or the farm checks no membership)."""
        members = self.members(team)
        return members is None or user in members

    def teams_of(self, user: str) -> list[str]:
        """The teams `user` belongs to, sorted (every team when the farm checks no membership)."""
        return [name for name in sorted(self.farm.teams) if self.is_member(user, name)]

    # -- checks ----------------------------------------------------------------------------------------------------

    def check(self, user: str, team: str | None, doing: str) -> None:
        """NotAllowed unless `user` may act for `team` (a member, or an operator); `doing` is the verb phrase."""
        if not self.farm.membership_checked:
            return
        name = team or ""
        # Operators first: they act for any team, so a team group Slack cannot resolve never stops them.
        try:
            operator = self.is_operator(user)
        except UpstreamError as exc:
            raise MembershipUnavailable(
                f"Slack could not say who the GPU operators are ({exc}); nothing was changed"
            ) from None
        if operator or self.is_member(user, name):
            return
        mine = self.teams_of(user)
        yours = f"your teams: {', '.join(mine)}" if mine else "you are in no team; ask the GPU operators to add you"
        raise NotAllowed(f"only members of team {name or '(none)'} or GPU operators can {doing} ({yours})")

    def team_for_request(self, user: str, named: str | None) -> str:
        """The team a request is for: the one named, else the user's only team; ValidationFailed listing them."""
        if named:
            return named
        teams = self.teams_of(user)
        if len(teams) == 1:
            return teams[0]
        if not teams:
            raise ValidationFailed("team", "you are in no team, so there is nobody to charge; ask the GPU operators")
        raise ValidationFailed("team", f"you are in several teams; say which one with team=: {', '.join(teams)}")

    # -- Slack -----------------------------------------------------------------------------------------------------

    def _group(self, usergroup: str, where: str, *, raw: bool = False) -> frozenset[str]:
        cached = self._groups.get(usergroup)
        if cached is not None:
            return cached
        try:
            members = self.chat.usergroup_members(usergroup)
        except UpstreamError as exc:
            if raw:
                # The operators' group keeps the errors it always had: whoever asks decides what a failure means.
                raise
            if NO_SUCH_GROUP in str(exc) or getattr(exc, "code", None) == NO_SUCH_GROUP:
                raise MembershipMisconfigured(
                    f"farm configuration: {where} names Slack user group {usergroup}, which does not exist"
                ) from None
            raise MembershipUnavailable(
                f"Slack could not say who is in user group {usergroup} ({exc}); nothing was changed"
            ) from None
        self._groups[usergroup] = members
        return members
