"""The plain readers of what Slack sends: each field's type, length and shape checked, extra fields ignored, and
anything else Malformed (the ingress's 400), never another exception."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpufarm.handlers.slack_events import Job
from gpufarm.handlers.slack_inputs import (
    AppHomeOpened,
    BlockActions,
    EventCallback,
    Malformed,
    SlashCommand,
    ViewClosed,
    ViewSubmission,
    job,
    url_verification_challenge,
)

COMMAND = {
    "command": "/gpu",
    "text": "release IR-4",
    "user_id": "U0000000001",
    "channel_id": "C0000000002",
    "response_url": "https://hooks.slack.com/commands/T1/2/abc",
    "trigger_id": "123.456.abc",
    "team_id": "T0000000001",
    "token": "ignored",
}
CLICK = {
    "type": "block_actions",
    "user": {"id": "U0000000001", "name": "ignored"},
    "actions": [{"action_id": "gpu_release", "value": "IR-4", "block_id": "b"}],
    "response_url": "https://hooks.slack.com/actions/T1/2/abc",
    "channel": {"id": "C0000000002"},
    "container": {"type": "message", "message_ts": "1700000000.0001", "channel_id": "C0000000002"},
    "trigger_id": "123.456.abc",
}
SUBMISSION = {
    "type": "view_submission",
    "user": {"id": "W0000000001"},
    "view": {
        "id": "V0000000001",
        "callback_id": "gpu_request",
        "private_metadata": '{"channel": "C0000000002"}',
        "state": {"values": {"gpu_model": {"gpu_model": {"type": "static_select", "selected_option": None}}}},
    },
}


def test_well_formed_inputs_are_read() -> None:
    command = SlashCommand.read(COMMAND)
    assert (command.command, command.text, command.user_id, command.team_id) == (
        "/gpu",
        "release IR-4",
        "U0000000001",
        "T0000000001",
    )
    assert SlashCommand.read({**COMMAND, "text": ""}).text == ""
    assert SlashCommand.read({k: v for k, v in COMMAND.items() if k not in ("text", "team_id")}).text == ""
    click = BlockActions.read(CLICK)
    assert click.user_id == "U0000000001" and click.channel_id == "C0000000002"
    assert click.actions[0].action_id == "gpu_release" and click.container is not None
    assert click.container.message_ts == "1700000000.0001"
    bare = BlockActions.read({"type": "block_actions", "user": {"id": "U01"}, "actions": [{"action_id": "x"}]})
    assert bare.channel_id is None and bare.container is None and bare.response_url is None
    submitted = ViewSubmission.read(SUBMISSION)
    assert submitted.view.values["gpu_model"]["gpu_model"]["type"] == "static_select"
    assert ViewClosed.read({**SUBMISSION, "type": "view_closed"}).view.id == "V0000000001"
    assert ViewSubmission.read({**SUBMISSION, "view": {"id": "V1"}}).view.values == {}
    callback = EventCallback.read({"type": "event_callback", "event": {"type": "app_home_opened", "user": "U01"}})
    opened = AppHomeOpened.read(callback.event)
    assert (opened.user, opened.tab, opened.channel) == ("U01", "home", None)
    assert url_verification_challenge({"type": "url_verification", "challenge": "abc"}) == "abc"


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


@pytest.mark.parametrize(
    "form",
    [
        _without(COMMAND, "command"),
        _without(COMMAND, "user_id"),
        _without(COMMAND, "response_url"),
        _without(COMMAND, "trigger_id"),
        {**COMMAND, "command": "/" + "g" * 40},
        {**COMMAND, "user_id": "u0000000001"},
        {**COMMAND, "user_id": "U0000000001\n"},
        {**COMMAND, "user_id": "U" + "0" * 21},
        {**COMMAND, "channel_id": "X0000000002"},
        {**COMMAND, "response_url": "ftp://hooks.slack.com/x"},
        {**COMMAND, "response_url": "https://hooks.slack.com/a b"},
        {**COMMAND, "trigger_id": ""},
        {**COMMAND, "trigger_id": "t" * 201},
        {**COMMAND, "team_id": "T" * 41},
        {**COMMAND, "text": None},
        {**COMMAND, "text": 5},
    ],
)
def test_a_malformed_slash_command_is_refused(form: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        SlashCommand.read(form)


@pytest.mark.parametrize(
    "payload",
    [
        {**CLICK, "type": "view_submission"},
        _without(CLICK, "user"),
        {**CLICK, "user": "U0000000001"},
        {**CLICK, "user": {"id": 7}},
        {**CLICK, "actions": []},
        {**CLICK, "actions": [{"action_id": "a"}] * 11},
        {**CLICK, "actions": {"action_id": "a"}},
        {**CLICK, "actions": [{"value": "IR-4"}]},
        {**CLICK, "actions": [{"action_id": "a" * 256}]},
        {**CLICK, "actions": [{"action_id": "a", "value": "v" * 2001}]},
        {**CLICK, "actions": ["gpu_release"]},
        {**CLICK, "channel": {"id": "U0000000001"}},
        {**CLICK, "channel": "C0000000002"},
        {**CLICK, "container": []},
        {**CLICK, "container": {"channel_id": "bad"}},
        {**CLICK, "container": {"type": None}},
        {**CLICK, "response_url": "javascript:alert(1)"},
        {**CLICK, "trigger_id": ["t"]},
    ],
)
def test_a_malformed_click_is_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        BlockActions.read(payload)


@pytest.mark.parametrize(
    "view",
    [
        None,
        "V1",
        {},
        {"id": ""},
        {"id": "V" * 41},
        {"id": "V1", "callback_id": None},
        {"id": "V1", "private_metadata": "m" * 3001},
        {"id": "V1", "state": []},
        {"id": "V1", "state": {"values": []}},
        {"id": "V1", "state": {"values": {"b": []}}},
        {"id": "V1", "state": {"values": {"b": {"a": "value"}}}},
    ],
)
def test_a_malformed_view_is_refused(view: object) -> None:
    with pytest.raises(Malformed):
        ViewSubmission.read({**SUBMISSION, "view": view})


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "event_callback"},
        {"type": "event_callback", "event": "app_home_opened"},
        {"type": "event_callback", "event": {}, "event_id": "e" * 101},
        {"type": "url_verification", "event": {}},
    ],
)
def test_a_malformed_event_delivery_is_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        EventCallback.read(payload)


@pytest.mark.parametrize(
    "event",
    [
        {"type": "app_home_opened"},
        {"type": "app_home_opened", "user": "B01"},
        {"type": "app_home_opened", "user": "U01", "tab": "t" * 21},
        {"type": "app_home_opened", "user": "U01", "channel": "U01"},
        {"type": "message", "user": "U01"},
    ],
)
def test_a_malformed_home_event_is_refused(event: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        AppHomeOpened.read(event)


def test_the_challenge_is_bounded() -> None:
    for payload in ({"type": "url_verification"}, {"type": "url_verification", "challenge": "c" * 201}):
        with pytest.raises(Malformed):
            url_verification_challenge(payload)


def _junk(rng: random.Random, depth: int = 0) -> object:
    choice = rng.randrange(7 if depth < 3 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([0, -1, 2**70, 1.5, True])
    if choice == 2:
        return rng.choice(["", "U0000000001", "C0000000002", "https://x", "\x00", "é" * 300, "block_actions"])
    if choice == 3:
        return rng.choice(["view_submission", "app_home_opened", "event_callback", "url_verification"])
    if choice == 4:
        return "x" * rng.randrange(0, 3000)
    if choice == 5:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(0, 12))]
    keys = ["type", "user", "id", "actions", "action_id", "view", "state", "values", "event", "channel", "container"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def test_junk_is_read_or_malformed_never_another_error() -> None:
    rng = random.Random(27)
    readers = (
        SlashCommand.read,
        BlockActions.read,
        ViewSubmission.read,
        ViewClosed.read,
        EventCallback.read,
        AppHomeOpened.read,
        url_verification_challenge,
    )
    outcomes = {"read": 0, "malformed": 0}
    for _ in range(3000):
        value = _junk(rng)
        data = value if isinstance(value, dict) else {"type": "block_actions", "actions": value}
        for read in readers:
            try:
                read(data)
            except Malformed:
                outcomes["malformed"] += 1
            else:
                outcomes["read"] += 1
    assert outcomes["read"] + outcomes["malformed"] == 3000 * len(readers)
    assert outcomes["malformed"] > 0


def test_every_hand_off_validates_as_the_workers_job() -> None:
    payloads = [
        job("command", "U0000000001", channel="C0000000002", response_url=None, command={"verb": "release", "ir": 4}),
        job("action", "U0000000001", action="gpu_reject", ir=4, reason="no", days=None, message_ts="1.2"),
        job("home", "W0000000001"),
    ]
    for payload in payloads:
        assert None not in payload.values()
        assert Job.model_validate(payload).model_dump(mode="json", exclude_none=True) == payload
