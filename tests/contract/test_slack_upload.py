"""SlackChat.upload_file (slack_sdk's files_upload_v2) against the Slack sandbox: the three steps, bounds, retries."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpufarm.adapters.slack import MAX_UPLOAD_BYTES, SlackChat, SlackError
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN

pytestmark = pytest.mark.contract

CSV = b"team,gpu_hours\nnlp,12.5\nvision,3.0\n"


class Sleeps:
    """Records the adapter's waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def chat(sandbox_url: str, sleeps: Sleeps) -> SlackChat:
    return SlackChat(DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5, sleep=sleeps)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def post_json(url: str, body: Any) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def files(base: str, query: str = "") -> list[dict[str, Any]]:
    return list(get_json(f"{base}/_sandbox/slack/files?{query}")["files"])


def test_a_file_is_uploaded_shared_with_its_comment_and_read_back(chat: SlackChat, sandbox_url: str) -> None:
    file_id = chat.upload_file(
        "C0000000001", "gpu-report-2026-11.csv", CSV, title="GPU report, November", initial_comment="November's use"
    )

    [stored] = files(sandbox_url, "channel=C0000000001")
    assert stored["id"] == file_id
    assert stored["name"] == "gpu-report-2026-11.csv"
    assert stored["title"] == "GPU report, November"
    assert stored["size"] == len(CSV)
    assert stored["mimetype"] == "text/csv"
    assert stored["uploaded"] and stored["completed"]
    with urllib.request.urlopen(f"{sandbox_url}/_sandbox/slack/files/{file_id}", timeout=5) as response:
        assert response.read() == CSV
    # The share is a message in the channel carrying the comment and the file.
    messages = get_json(f"{sandbox_url}/_sandbox/slack/messages?channel=C0000000001")["messages"]
    [share] = [m for m in messages if file_id in m.get("files", [])]
    assert share["text"] == "November's use"
    assert share["ts"] == stored["message_ts"]


def test_a_channel_name_resolves_and_no_comment_shares_the_file_alone(chat: SlackChat, sandbox_url: str) -> None:
    file_id = chat.upload_file("gpu-ops", "usage.json", b'{"a": 1}', title="usage")
    [stored] = files(sandbox_url)
    assert stored["id"] == file_id
    assert stored["channels"] == ["C0000000001"]
    assert stored["initial_comment"] is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"channel": ""}, "channel"),
        ({"filename": "../etc/passwd.csv"}, "filename"),
        ({"filename": "report"}, "filename"),
        ({"filename": "a b.csv"}, "filename"),
        ({"filename": "r\n.csv"}, "filename"),
        ({"content": b""}, "content"),
        ({"content": b"x" * (MAX_UPLOAD_BYTES + 1)}, "content"),
        ({"title": ""}, "title"),
        ({"title": "t" * 256}, "title"),
        ({"title": "two\nlines"}, "title"),
        ({"initial_comment": "c" * 4001}, "initial_comment"),
    ],
)
def test_bad_uploads_are_refused_before_anything_is_sent(
    chat: SlackChat, sandbox_url: str, kwargs: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {
        "channel": "C0000000001",
        "filename": "r.csv",
        "content": CSV,
        "title": "r",
        "initial_comment": None,
    }
    args.update(kwargs)
    with pytest.raises(ValidationFailed) as caught:
        chat.upload_file(
            args["channel"],
            args["filename"],
            args["content"],
            title=args["title"],
            initial_comment=args["initial_comment"],
        )
    assert caught.value.field == field
    assert files(sandbox_url) == []


def test_an_unknown_channel_is_slacks_error_and_the_file_is_never_shared(chat: SlackChat, sandbox_url: str) -> None:
    with pytest.raises(SlackError) as caught:
        chat.upload_file("C9999999999", "r.csv", CSV, title="r")
    assert caught.value.code == "channel_not_found"
    assert caught.value.method == "files.upload"
    assert [f["completed"] for f in files(sandbox_url)] == [False]


def test_a_5xx_on_the_upload_url_restarts_the_upload_with_a_fresh_url(
    chat: SlackChat, sandbox_url: str, sleeps: Sleeps
) -> None:
    post_json(
        f"{sandbox_url}/_sandbox/faults", {"rate": 1.0, "statuses": [503], "paths": r"^/slack/upload/", "max_faults": 1}
    )
    file_id = chat.upload_file("C0000000001", "r.csv", CSV, title="r")

    shown = files(sandbox_url)
    # The first reservation never got its bytes and is never shown; the second is the file.
    assert [(f["uploaded"], f["completed"]) for f in shown] == [(False, False), (True, True)]
    assert shown[1]["id"] == file_id
    assert len(sleeps.waits) == 1
    assert sleeps.waits[0] <= 1.2


def test_an_upload_url_that_keeps_failing_gives_up_within_bounds(
    chat: SlackChat, sandbox_url: str, sleeps: Sleeps
) -> None:
    post_json(f"{sandbox_url}/_sandbox/faults", {"rate": 1.0, "statuses": [502], "paths": r"^/slack/upload/"})
    with pytest.raises(SlackError) as caught:
        chat.upload_file("C0000000001", "r.csv", CSV, title="r")
    assert (caught.value.code, caught.value.status) == ("upload_failed", 502)
    assert len(sleeps.waits) == 2  # max_retries=2: three attempts in all
    assert all(not f["completed"] for f in files(sandbox_url))


def test_a_5xx_on_the_web_api_is_retried_by_the_client(chat: SlackChat, sandbox_url: str) -> None:
    post_json(
        f"{sandbox_url}/_sandbox/faults",
        {"rate": 1.0, "statuses": [503], "paths": r"files\.completeUploadExternal", "max_faults": 1, "after": 1.0},
    )
    file_id = chat.upload_file("C0000000001", "r.csv", CSV, title="r", initial_comment="once")
    # The completion was served before the 503 and retried: the file is shared once, with one message.
    [stored] = files(sandbox_url)
    assert stored["id"] == file_id
    messages = get_json(f"{sandbox_url}/_sandbox/slack/messages?channel=C0000000001")["messages"]
    assert [m["text"] for m in messages if m.get("files")] == ["once"]


def test_the_sandbox_checks_what_slack_checks(sandbox_url: str) -> None:
    api = f"{sandbox_url}/slack/api"
    auth = {"Authorization": f"Bearer {DEFAULT_SLACK_TOKEN}", "Content-Type": "application/json"}

    def call(method: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{api}/{method}", data=json.dumps(body).encode(), headers=auth)
        with urllib.request.urlopen(request, timeout=5) as response:
            return dict(json.loads(response.read()))

    assert call("files.getUploadURLExternal", {"filename": "a.csv", "length": 0})["error"] == "missing_argument"
    assert call("files.getUploadURLExternal", {"filename": "a.csv"})["error"] == "invalid_arguments"
    too_big = call("files.getUploadURLExternal", {"filename": "a.csv", "length": 10**9})
    assert too_big["error"] == "file_upload_size_restricted"
    reserved = call("files.getUploadURLExternal", {"filename": "a.csv", "length": 3})
    # Completing before the bytes arrived, or sending other bytes than announced, is refused.
    early = call("files.completeUploadExternal", {"files": [{"id": reserved["file_id"]}], "channel_id": "C0000000001"})
    assert early["error"] == "file_uploads_not_completed"
    wrong = urllib.request.Request(reserved["upload_url"], data=b"four", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(wrong, timeout=5)
    assert caught.value.code == 400
    assert call("files.completeUploadExternal", {"files": [{"id": "F404"}]})["error"] == "file_not_found"
