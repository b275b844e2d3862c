"""`gpufarm secrets put` and `gpufarm secrets rotate-link-key` against Secrets Manager in moto, a rotated link key
reaching a warm function (the runtime reads its keys again) while old links keep opening, and `gpufarm doctor`'s
line on which secret keys exist."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from click.testing import CliRunner
from moto import mock_aws

from gpufarm.adapters import aws
from gpufarm.cli import EXIT_BAD_INPUT, cli
from gpufarm.core.kernel.errors import NotAllowed
from gpufarm.handlers import runtime as rt
from gpufarm.profiling.links import NOT_VALID, link_checker
from gpufarm.setup.doctor.secrets import SECRET_KEYS_CHECK, secret_keys_line

REGION = "us-east-1"
PREFIX = "gpufarm/test"
DOCUMENT = {
    "datadog_api_key": "dd-api-key-value-0001",
    "datadog_app_key": "dd-app-key-value-0001",
    "slack_bot_token": "xoxb-bot-token-value",
    "slack_signing_secret": "signing-secret-value",
    "webhook_secret": "webhook-secret-value-0001",
    "profile_link_secret": "link-key-value-00000001",
    "upload_token_secret": "upload-key-value-0000001",
}


@pytest.fixture
def sm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", PREFIX)
    for name in ("GPUFARM_PROFILE_LINK_SECRET", "GPUFARM_PROFILE_LINK_SECRET_PREVIOUS", "GPUFARM_SECRET_KEYS"):
        monkeypatch.delenv(name, raising=False)
    aws.clear_config_cache()
    aws.forget_clients()  # clients built for another test's endpoints
    rt.reset()
    with mock_aws():
        yield boto3.client("secretsmanager", region_name=REGION)
    rt.reset()
    aws.clear_config_cache()
    aws.forget_clients()


def _run(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(cli, ["secrets", *args], input=stdin, catch_exceptions=False)


def _value(sm: Any, key: str) -> str:
    return str(sm.get_secret_value(SecretId=f"{PREFIX}/{key}")["SecretString"])


def _names(sm: Any) -> set[str]:
    return {s["Name"] for s in sm.list_secrets()["SecretList"]}


def test_put_writes_one_secret_per_key_and_prints_no_value(sm: Any) -> None:
    result = _run("put", "--from-file", "-", stdin=json.dumps(DOCUMENT))
    assert result.exit_code == 0, result.output
    assert _names(sm) == {f"{PREFIX}/{k}" for k in [*DOCUMENT, "profile_link_secret_previous"]}
    assert {k: _value(sm, k) for k in DOCUMENT} == DOCUMENT
    # The link key set alone: no rotation under way, the pages accept it only.
    assert _value(sm, "profile_link_secret_previous") == DOCUMENT["profile_link_secret"]
    assert f"slack_bot_token: created ({PREFIX}/slack_bot_token)" in result.output
    for value in DOCUMENT.values():
        assert value not in result.output
    # Again: each secret gets a new current version.
    again = _run("put", "--from-file", "-", stdin=json.dumps({"slack_bot_token": "xoxb-new-token"}))
    assert again.exit_code == 0 and "slack_bot_token: updated" in again.output
    assert _value(sm, "slack_bot_token") == "xoxb-new-token"
    assert _value(sm, "datadog_api_key") == DOCUMENT["datadog_api_key"]


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "must be a JSON object"),
        (json.dumps({**DOCUMENT, "aws_root_key": "x" * 20}), "'aws_root_key' is not a gpufarm secret key"),
        (json.dumps({"slack_bot_token": ""}), "slack_bot_token must be a non-empty string"),
        (json.dumps({"slack_bot_token": 42}), "slack_bot_token must be a non-empty string"),
        (json.dumps({"slack_bot_token": "xoxb-1 \n"}), "surrounding spaces or control characters"),
        (json.dumps({"webhook_secret": "short"}), "webhook_secret must be at least 16 characters"),
        (json.dumps({"datadog_api_key": "k" * 5000}), "longer than 4096"),
        ('"' + "x" * 70_000 + '"', "over 65536 bytes"),
    ],
)
def test_put_refuses_a_bad_document_whole_with_exit_2(sm: Any, document: str, words: str) -> None:
    result = CliRunner().invoke(cli, ["secrets", "put", "--from-file", "-"], input=document)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert words in result.output
    assert _names(sm) == set()  # nothing written, not even the good keys
    for value in ("xoxb-1", "k" * 50, "short"):
        assert value not in result.output


def test_put_names_a_file_that_is_not_there(sm: Any) -> None:
    result = CliRunner().invoke(cli, ["secrets", "put", "--from-file", "/nonexistent/secrets.json"])
    assert result.exit_code == EXIT_BAD_INPUT


def _warm_pages_settings() -> Any:
    """The settings a warm profile pages container holds (the template's keys for it)."""
    return rt.current().settings


def test_rotation_keeps_old_links_open_until_finished_and_warm_functions_see_the_new_key(
    sm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run("put", "--from-file", "-", stdin=json.dumps(DOCUMENT)).exit_code == 0
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "profile_link_secret,profile_link_secret_previous")
    signer = link_checker(_warm_pages_settings())
    key, expires = "ir-7/run-1-20261202t090000z", 2_000_000_000
    sig = signer.signature(key, expires)

    started = _run("rotate-link-key")
    assert started.exit_code == 0, started.output
    new_key = _value(sm, "profile_link_secret")
    assert new_key != DOCUMENT["profile_link_secret"] and len(new_key) >= 32
    assert _value(sm, "profile_link_secret_previous") == DOCUMENT["profile_link_secret"]
    assert new_key not in started.output and DOCUMENT["profile_link_secret"] not in started.output
    assert "re-signs the dashboards' page links" in started.output and "--finish" in started.output

    # A warm container reads its keys again after SETTINGS_MAX_AGE_S: it signs with the new key, accepts both.
    later = aws.time.monotonic() + rt.SETTINGS_MAX_AGE_S + aws.CONFIG_MAX_AGE_S + 1
    monkeypatch.setattr(rt.time, "monotonic", lambda: later)
    monkeypatch.setattr(aws.time, "monotonic", lambda: later)
    rotated = link_checker(_warm_pages_settings())
    assert rotated.secret == new_key.encode()
    rotated.check(key, str(expires), sig, 1_999_000_000)  # the old link still opens
    assert not rotated.signed_now(key, expires, sig)  # and the sync re-signs it

    # A second start while one is under way would drop the oldest links' key: refused, nothing written.
    again = _run("rotate-link-key")
    assert again.exit_code == EXIT_BAD_INPUT and "under way" in again.output
    assert _value(sm, "profile_link_secret") == new_key

    finished = _run("rotate-link-key", "--finish")
    assert finished.exit_code == 0 and "only the link key opens links" in finished.output
    assert _value(sm, "profile_link_secret_previous") == new_key
    later += rt.SETTINGS_MAX_AGE_S + aws.CONFIG_MAX_AGE_S + 1
    after = link_checker(_warm_pages_settings())
    with pytest.raises(NotAllowed, match=NOT_VALID):
        after.check(key, str(expires), sig, 1_999_000_000)
    assert _run("rotate-link-key", "--finish").output.startswith("No rotation was under way")


def test_rotation_without_a_link_key_is_bad_input(sm: Any) -> None:
    result = _run("rotate-link-key")
    assert result.exit_code == EXIT_BAD_INPUT and "no link key to rotate" in result.output
    assert _names(sm) == set()


def test_a_runtime_whose_keys_did_not_change_keeps_its_collaborators(sm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run("put", "--from-file", "-", stdin=json.dumps(DOCUMENT)).exit_code == 0
    monkeypatch.setenv("GPUFARM_SECRET_KEYS", "slack_bot_token")
    first = rt.current()
    later = aws.time.monotonic() + rt.SETTINGS_MAX_AGE_S + aws.CONFIG_MAX_AGE_S + 1
    monkeypatch.setattr(rt.time, "monotonic", lambda: later)
    monkeypatch.setattr(aws.time, "monotonic", lambda: later)
    assert rt.current() is first


# -- gpufarm doctor's secret keys line ----------------------------------------------------------------------------


def test_doctor_names_the_secrets_a_deployment_lacks_and_stops_before_datadog(
    sm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "DD_API_KEY",
        "DD_APP_KEY",
        "DD_APPLICATION_KEY",
        "GPUFARM_DATADOG_API_KEY",
        "GPUFARM_DATADOG_APP_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    partial = {k: v for k, v in DOCUMENT.items() if k != "datadog_app_key"}
    assert _run("put", "--from-file", "-", stdin=json.dumps(partial)).exit_code == 0
    result = CliRunner().invoke(cli, ["doctor", "--json"], catch_exceptions=False)
    lines = json.loads(result.output)
    assert lines[0] == {
        "check": SECRET_KEYS_CHECK,
        "status": "broken",
        "detail": f"missing {PREFIX}/datadog_app_key: write them with `gpufarm secrets put --from-file <document>`",
    }
    assert [line["check"] for line in lines] == [SECRET_KEYS_CHECK, "datadog keys"]  # nothing called Datadog
    assert result.exit_code == 1
    for value in DOCUMENT.values():
        assert value not in result.output


@pytest.mark.parametrize(
    ("found", "status", "words"),
    [
        (DOCUMENT | {"profile_link_secret_previous": DOCUMENT["profile_link_secret"]}, "confirmed", "8 of 8 keys"),
        (DOCUMENT, "fell back", f"no {PREFIX}/profile_link_secret_previous"),
        (
            {k: v for k, v in DOCUMENT.items() if "profile" not in k and "upload" not in k},
            "confirmed",
            "no profile_link_secret, upload_token_secret",
        ),
        (
            DOCUMENT | {"profile_link_secret_previous": "older-link-key-000001"},
            "confirmed",
            "rotation of the link key is under way",
        ),
        ({k: v for k, v in DOCUMENT.items() if k != "webhook_secret"}, "broken", f"missing {PREFIX}/webhook_secret"),
    ],
)
def test_the_secret_keys_line(found: dict[str, str], status: str, words: str) -> None:
    line = secret_keys_line(PREFIX, found)
    assert line.status.value == status and words in line.detail
    assert not any(value in line.detail for value in found.values())
