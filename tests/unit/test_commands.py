"""Parsing `/gpu ...` text: every verb, the inline request form, and the bad input the issue lists."""

from __future__ import annotations

import pytest

from gpufarm.core.chat.command_text import Command, ListScope, Verb, parse_command
from gpufarm.core.kernel.errors import ValidationFailed


def test_empty_and_help_give_help() -> None:
    assert parse_command("") == Command(Verb.HELP)
    assert parse_command("   ") == Command(Verb.HELP)
    assert parse_command("help") == Command(Verb.HELP)


def test_unknown_subcommand_is_help_naming_the_word() -> None:
    cmd = parse_command("rent 2")
    assert cmd.verb is Verb.HELP
    assert cmd.unknown == "rent"


def test_bare_request_opens_the_modal() -> None:
    cmd = parse_command("request")
    assert cmd.verb is Verb.REQUEST and cmd.opens_modal and cmd.args is None


def test_inline_request_form() -> None:
    cmd = parse_command(
        'request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="fine-tune the ko model"'
    )
    assert not cmd.opens_modal
    assert cmd.args == {
        "gpu_count": "8",
        "gpu_model": "H100",
        "project": "llm-ko",
        "team": "nlp",
        "environment": "onprem-hpc",
        "duration_days": "14",
        "purpose": "fine-tune the ko model",
    }


def test_inline_request_accepts_typographic_quotes_and_key_synonyms() -> None:
    cmd = parse_command("request count=2 model=a100 project=p team=t pool=shared-slices for=\u201cquick test\u201d")
    assert cmd.args is not None
    assert cmd.args["purpose"] == "quick test"
    assert cmd.args["environment"] == "shared-slices"
    assert cmd.args["gpu_count"] == "2"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("request 8 H100 colour=red", "text"),
        ("request 8 9 H100", "text"),
        ("request 8 H100 A100", "text"),
        ("request 8 H100 count=4", "gpu_count"),
        ('request 8 H100 purpose="unterminated', "text"),
        ("request count=2 gpus=3", "gpu_count"),
    ],
)
def test_inline_request_syntax_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_command(text)
    assert err.value.field == field


def test_counts_are_kept_raw_for_the_policy_to_judge() -> None:
    # Zero, negative and huge counts parse; build_request turns them into clear errors (tested in test_policy).
    assert parse_command("request -3 H100").args == {"gpu_count": "-3", "gpu_model": "H100"}
    assert parse_command("request count=abc").args == {"gpu_count": "abc"}
    assert parse_command("request many H100").args == {"gpu_count": "many", "gpu_model": "H100"}
    assert parse_command("request H100").args == {"gpu_model": "H100"}
    assert parse_command("request 4").args == {"gpu_count": "4"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("list", Command(Verb.LIST, scope=ListScope.MINE)),
        ("list mine", Command(Verb.LIST, scope=ListScope.MINE)),
        ("list all", Command(Verb.LIST, scope=ListScope.ALL)),
        ("list team", Command(Verb.LIST, scope=ListScope.TEAM)),
        ("list team NLP", Command(Verb.LIST, scope=ListScope.TEAM, team="nlp")),
        ("status IR-12", Command(Verb.STATUS, ir=12)),
        ("status ir-12", Command(Verb.STATUS, ir=12)),
        ("release #7", Command(Verb.RELEASE, ir=7)),
        ("extend IR-3 7", Command(Verb.EXTEND, ir=3, days=7)),
        ("extend IR-3", Command(Verb.EXTEND, ir=3)),
        ("quota", Command(Verb.QUOTA)),
        ("quota Vision", Command(Verb.QUOTA, team="vision")),
        ("approve IR-9", Command(Verb.APPROVE, ir=9)),
        ("reject IR-9 over budget this month", Command(Verb.REJECT, ir=9, reason="over budget this month")),
        ("reclaim IR-9 idle for a week", Command(Verb.RECLAIM, ir=9, reason="idle for a week")),
        ("STATUS IR-1", Command(Verb.STATUS, ir=1)),
        ("profile-token IR-4", Command(Verb.PROFILE_TOKEN, ir=4)),
        ("Profile-Token ir-4", Command(Verb.PROFILE_TOKEN, ir=4)),
    ],
)
def test_verbs(text: str, expected: Command) -> None:
    assert parse_command(text) == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("status", "ir"),
        ("status IR-abc", "ir"),
        ("release IR-0", "ir"),
        ("release IR-1 IR-2", "text"),
        ("extend IR-1 zero", "days"),
        ("extend IR-1 0", "days"),
        ("extend IR-1 -5", "days"),
        ("extend IR-1 100000", "days"),
        ("list everything", "scope"),
        ("list all now", "text"),
        ("quota a b", "text"),
        ("reject IR-9", "reason"),
        ("reclaim IR-9", "reason"),
        ("profile-token", "ir"),
        ("profile-token IR-4 IR-5", "text"),
        ("x" * 2001, "text"),
    ],
)
def test_bad_arguments(text: str, field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_command(text)
    assert err.value.field == field


def test_control_characters_never_echo_back() -> None:
    cmd = parse_command("bogus\x07")
    assert cmd.unknown == "bogus?"


def test_payload_round_trip() -> None:
    for text in ("request 8 H100 project=p team=t", "list team nlp", "extend IR-3 7", "reject IR-2 no", "help"):
        cmd = parse_command(text)
        assert Command.from_payload(cmd.to_payload()) == cmd


@pytest.mark.parametrize(
    "payload",
    [{}, {"verb": "explode"}, {"verb": "status", "ir": "7"}, {"verb": "request", "args": {"a": 1}}, {"verb": None}],
)
def test_malformed_payload_is_rejected(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationFailed):
        Command.from_payload(payload)
