"""Parsing the text of `/gpu ...` into a command, before anything is touched.

Pure and cheap (no pydantic, no network): the Slack ingress parses inside Slack's 3 seconds and answers syntax
errors at once; the worker rebuilds the same command from the hand-off payload with `Command.from_payload`.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from gpufarm.core.chat.quota_text import parse_quota_request
from gpufarm.core.chat.reserve_text import split_window
from gpufarm.core.kernel import bounded
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.ir import parse_ir

MAX_TEXT = 2000
MAX_EXTEND_DAYS = 365
# `/gpu release IR-n now` skips the confirmation button (scripts, and people who mean it).
CONFIRM_WORDS = frozenset({"now", "confirm", "yes"})
MAX_EXEMPT_DAYS = 365


class Verb(StrEnum):
    """The subcommands of `/gpu`."""

    HELP = "help"
    REQUEST = "request"
    LIST = "list"
    STATUS = "status"
    RELEASE = "release"
    EXTEND = "extend"
    QUOTA = "quota"
    BUDGET = "budget"  # the budgets' burn, forecast and live leases' cost (gpufarm.core.accounting.budget_view)
    APPROVE = "approve"
    REJECT = "reject"
    RECLAIM = "reclaim"
    EXEMPT = "exempt"
    REPORT = "report"
    RESERVE = "reserve"  # a booking on the pool's calendar (gpufarm.core.calendar)
    CALENDAR = "calendar"  # the pool's next weeks (gpufarm.core.calendar.view)
    PROFILE_TOKEN = "profile-token"  # noqa: S105 - the verb's name, not a secret
    # `/gpu why IR-n`: the lease's current state explained with the numbers (gpufarm.core.leases.why).
    WHY = "why"


class ListScope(StrEnum):
    """Which allocations `/gpu list` shows."""

    MINE = "mine"
    TEAM = "team"
    ALL = "all"


# Keys accepted in the inline request form, and the request field each one fills.
REQUEST_KEYS: dict[str, str] = {
    "count": "gpu_count",
    "gpus": "gpu_count",
    "gpu_count": "gpu_count",
    "n": "gpu_count",
    "model": "gpu_model",
    "gpu": "gpu_model",
    "gpu_model": "gpu_model",
    "type": "gpu_model",
    "project": "project",
    "team": "team",
    "env": "environment",
    "environment": "environment",
    "pool": "environment",
    "days": "duration_days",
    "duration": "duration_days",
    "duration_days": "duration_days",
    "purpose": "purpose",
    "for": "purpose",
    # The lease's own idle window and grace (gpufarm.core.idle.lease_window).
    "idle": "idle_window",
    "grace": "idle_grace",
}

# Slack may turn straight quotes into typographic ones; shlex only understands the straight kind.
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


@dataclass(frozen=True)
class Command:
    """One parsed `/gpu` command; `args` holds the raw inline request fields (None: open the form)."""

    verb: Verb
    ir: int | None = None
    days: int | None = None
    scope: ListScope | None = None
    team: str | None = None
    reason: str | None = None
    args: dict[str, str] | None = field(default=None)
    # The word that was not understood, for a help answer that says so.
    unknown: str | None = None
    # `/gpu release IR-n now`: released at once; without it the answer is a Release button Slack confirms.
    confirmed: bool | None = None
    # An inline request the worker completes (the team from the user's membership): its Slack request id.
    request_id: str | None = None
    # `/gpu calendar [env] [model]`: the pool and model named.
    environment: str | None = None
    gpu_model: str | None = None

    @property
    def opens_modal(self) -> bool:
        """True for a bare `/gpu request`: the ingress opens the request form with the 3-second trigger_id."""
        return self.verb is Verb.REQUEST and not self.args

    def to_payload(self) -> dict[str, Any]:
        """JSON-safe form for the hand-off to the worker."""
        return {k: (v.value if isinstance(v, StrEnum) else v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> Command:
        """Inverse of to_payload; ValidationFailed on anything malformed."""
        try:
            verb = Verb(data["verb"])
            scope = ListScope(data["scope"]) if data.get("scope") else None
        except (KeyError, ValueError, TypeError):
            raise ValidationFailed("command", "the hand-off payload carries no valid command") from None
        args = data.get("args")
        if args is not None and not (isinstance(args, dict) and all(isinstance(v, str) for v in args.values())):
            raise ValidationFailed("command", "the hand-off payload carries malformed request fields")
        return cls(
            verb=verb,
            ir=_opt_int(data.get("ir")),
            days=_opt_int(data.get("days")),
            scope=scope,
            team=_opt_str(data.get("team")),
            reason=_opt_str(data.get("reason")),
            args=args,
            unknown=_opt_str(data.get("unknown")),
            confirmed=_opt_bool(data.get("confirmed")),
            request_id=_opt_str(data.get("request_id")),
            environment=_opt_str(data.get("environment")),
            gpu_model=_opt_str(data.get("gpu_model")),
        )


# The verbs that name no allocation; every other verb takes an incident number first.
_WITHOUT_IR = frozenset(
    {Verb.HELP, Verb.REQUEST, Verb.LIST, Verb.QUOTA, Verb.BUDGET, Verb.REPORT, Verb.RESERVE, Verb.CALENDAR}
)


def parse_command(text: str) -> Command:
    """Parse the text after `/gpu`; ValidationFailed (field named) when a known verb has bad arguments."""
    if len(text) > MAX_TEXT:
        raise ValidationFailed("text", f"the command is longer than {MAX_TEXT} characters")
    words = _split(text)
    if not words:
        return Command(Verb.HELP)
    head, rest = words[0].lower(), words[1:]
    try:
        verb = Verb(head)
    except ValueError:
        return Command(Verb.HELP, unknown=_printable(words[0]))
    if verb in _WITHOUT_IR:
        return _parse_without_ir(verb, rest)
    return _parse_with_ir(verb, rest)


def _parse_without_ir(verb: Verb, rest: list[str]) -> Command:
    """Help, request, list, quota, budget and report: the words after the verb, none of them an incident number."""
    if verb is Verb.HELP:
        return Command(Verb.HELP)
    if verb is Verb.REQUEST:
        return Command(Verb.REQUEST, args=parse_request_args(rest) if rest else None)
    if verb is Verb.LIST:
        return _parse_list(rest)
    if verb is Verb.QUOTA and rest and rest[0].lower() == "request":
        # A quota change asked in chat (gpufarm.core.accounting.quota_requests judges it against the farm).
        return Command(Verb.QUOTA, args=parse_quota_request(rest[1:]))
    if verb is Verb.RESERVE:
        words, window = split_window(rest)
        return Command(Verb.RESERVE, args={**parse_request_args(words), **window})
    if verb is Verb.CALENDAR:
        _at_most(rest, 2, "/gpu calendar [env] [model]")
        return Command(
            Verb.CALENDAR,
            environment=rest[0].lower()[:63] if rest else None,
            gpu_model=_printable(rest[1], 32) if len(rest) > 1 else None,
        )
    # Quota, budget and report. Report's one word is a team or a project (gpufarm.reporting.slack tells them apart by
    # the farm's teams).
    usage = {Verb.QUOTA: "/gpu quota [team]", Verb.BUDGET: "/gpu budget [team]"}
    _at_most(rest, 1, usage.get(verb, "/gpu report [team | project]"))
    return Command(verb, team=rest[0].lower() if rest else None)


def _parse_with_ir(verb: Verb, rest: list[str]) -> Command:
    """The verbs about one allocation: its incident number first, then what the verb takes after it."""
    if not rest:
        raise ValidationFailed("ir", f"say which allocation: /gpu {verb.value} IR-123")
    ir = parse_ir(rest[0])
    if verb is Verb.EXTEND:
        _at_most(rest, 2, "/gpu extend IR-123 7")
        days = _positive_int("days", rest[1], MAX_EXTEND_DAYS) if len(rest) > 1 else None
        return Command(Verb.EXTEND, ir=ir, days=days)
    if verb is Verb.RELEASE and len(rest) == 2 and rest[1].lower() in CONFIRM_WORDS:
        return Command(verb, ir=ir, confirmed=True)
    if verb in (Verb.REJECT, Verb.RECLAIM, Verb.EXEMPT):
        return _parse_reasoned(verb, ir, rest[1:])
    _at_most(rest, 1, f"/gpu {verb.value} IR-123")
    return Command(verb, ir=ir)


def parse_request_args(words: list[str]) -> dict[str, str]:
    """The inline request form: `8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="..."`.

    Bare words are `<count> <model>` in that order; a single bare word is the count when it looks like a number,
    else the model. Values stay raw text: the policy judges them against the farm configuration.
    """
    args: dict[str, str] = {}
    bare: list[str] = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            bare.append(word.strip())
            continue
        name = REQUEST_KEYS.get(key.strip().lower())
        if name is None:
            raise ValidationFailed(
                "text",
                f"unknown option '{_printable(key)}'; use count, model, project, team, env, days, purpose, idle, grace",
            )
        _put(args, name, value.strip())
    if len(bare) > 2:
        raise ValidationFailed("text", "use /gpu request <count> <model> project=... team=... env=...")
    if len(bare) == 2:
        _put(args, "gpu_count", bare[0])
        _put(args, "gpu_model", bare[1])
    elif bare:
        _put(args, "gpu_count" if bounded.is_whole_number(bare[0]) else "gpu_model", bare[0])
    return args


def _parse_reasoned(verb: Verb, ir: int, rest: list[str]) -> Command:
    """Reject and reclaim take a reason (required); exempt takes its length too."""
    if verb is Verb.EXEMPT:
        return _parse_exempt(ir, rest)
    reason = " ".join(rest).strip()
    if not reason:
        # The requester reads it ("rejected by @dana: <reason>"), and the lease's history keeps it.
        raise ValidationFailed("reason", f"say why: /gpu {verb.value} IR-{ir} <reason>")
    return Command(verb, ir=ir, reason=_printable(reason, 300))


def _parse_exempt(ir: int, rest: list[str]) -> Command:
    """`/gpu exempt IR-12 3d <reason>`: an operator's exemption from idle reclaim, its length in days and why."""
    usage = "use /gpu exempt IR-123 3d <reason>"
    if not rest:
        raise ValidationFailed("days", f"say for how many days; {usage}")
    length = rest[0].lower()
    days = _positive_int("days", length[:-1] if length.endswith("d") else length, MAX_EXEMPT_DAYS)
    reason = " ".join(rest[1:]).strip()
    if not reason:
        raise ValidationFailed("reason", f"say why the lease is exempt; {usage}")
    return Command(Verb.EXEMPT, ir=ir, days=days, reason=_printable(reason, 300))


def _parse_list(rest: list[str]) -> Command:
    if not rest:
        return Command(Verb.LIST, scope=ListScope.MINE)
    try:
        scope = ListScope(rest[0].lower())
    except ValueError:
        raise ValidationFailed("scope", "use /gpu list [mine | team [name] | all]") from None
    if scope is ListScope.TEAM:
        _at_most(rest, 2, "/gpu list team [name]")
        return Command(Verb.LIST, scope=scope, team=rest[1].lower() if len(rest) > 1 else None)
    _at_most(rest, 1, f"/gpu list {scope.value}")
    return Command(Verb.LIST, scope=scope)


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text.translate(_QUOTES))
    except ValueError:
        raise ValidationFailed("text", "unbalanced quotes in the command") from None


def _put(args: dict[str, str], name: str, value: str) -> None:
    if name in args:
        raise ValidationFailed(name, f"{name} is given twice")
    args[name] = value


def _at_most(rest: list[str], count: int, usage: str) -> None:
    if len(rest) > count:
        raise ValidationFailed("text", f"too many arguments; use {usage}")


def _positive_int(name: str, text: str, maximum: int) -> int:
    return bounded.whole_number(text, name, name, maximum=maximum)


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationFailed("command", "the hand-off payload carries a malformed number")
    return value


def _opt_bool(value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ValidationFailed("command", "the hand-off payload carries a malformed flag")
    return value


def _opt_str(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationFailed("command", "the hand-off payload carries a malformed text")
    return value


def _printable(text: str, limit: int = 40) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
