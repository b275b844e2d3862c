"""The calls `gpufarm doctor` adds, on the sandbox through the real clients: the keys' own endpoints (read through
datadog-api-client's models), the Slack token's scopes and a channel's membership (through slack_sdk, the answer
shaped as tests/fixtures/slack/web_api/conversations.info.ok.json), and a Function URL's answer to a request
without credentials."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from datadog_api_client import ApiClient
from recorded import key_paths
from slack_sdk import WebClient
from werkzeug.wrappers import Request, Response

from gpufarm.adapters.aws import function_url_answer
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.adapters.slack import SlackChat, SlackError
from gpufarm.config import SecretStr, Settings
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError, ValidationFailed
from gpufarm.setup.doctor.keys import REQUIRED_PERMISSIONS, check_keys, user_permissions
from gpufarm.setup.doctor.report import Status
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN, Sandbox
from gpufarm_sandbox.emulator.server import ServerThread
from gpufarm_sandbox.emulator.slack_workspace import BOT_SCOPES

pytestmark = pytest.mark.contract

WEB_API = Path(__file__).resolve().parent.parent / "fixtures" / "slack" / "web_api"


def test_the_current_user_reads_through_the_clients_models(client: ApiClient, sandbox: Sandbox) -> None:
    from datadog_api_client.v1.api.authentication_api import AuthenticationApi
    from datadog_api_client.v2.api.users_api import UsersApi

    assert AuthenticationApi(client).validate().valid is True
    answer = UsersApi(client).get_current_user()
    kinds = sorted({str(item.type) for item in answer.included})
    assert kinds == ["permissions", "roles"]
    assert answer.data.relationships.roles.data[0].id == next(i.id for i in answer.included if str(i.type) == "roles")
    who, roles, granted = user_permissions(answer.to_dict())
    assert (who, roles) == ("sandbox@gpufarm.local", ["Datadog Admin Role"]) and set(REQUIRED_PERMISSIONS) <= granted


def test_the_admin_tells_a_refused_api_key_from_a_refused_application_key(settings: Settings) -> None:
    cases = {
        "api": settings.replace(datadog_api_key=SecretStr("wrong")),
        "app": settings.replace(datadog_app_key=SecretStr("wrong")),
    }
    refused_api, refused_app = DatadogAdmin(cases["api"]), DatadogAdmin(cases["app"])
    try:
        assert refused_api.api_key_valid() is False
        assert refused_app.api_key_valid() is True and refused_app.current_user() is None
        assert check_keys(refused_app, "the sandbox").detail.startswith("bad application key")
    finally:
        refused_api.close()
        refused_app.close()


def test_a_site_that_does_not_answer_is_an_error_not_a_refusal(settings: Settings) -> None:
    admin = DatadogAdmin(settings.replace(datadog_host="http://127.0.0.1:9", max_retries=0))
    try:
        with pytest.raises(GpufarmError):
            admin.api_key_valid()
    finally:
        admin.close()


def test_a_role_without_a_permission_is_named(settings: Settings, sandbox: Sandbox) -> None:
    sandbox.account.permissions.remove("monitors_write")
    admin = DatadogAdmin(settings)
    try:
        line = check_keys(admin, "the sandbox")
    finally:
        admin.close()
    assert line.status is Status.BROKEN and "monitors_write (apply: the idle monitors)" in line.detail


@pytest.mark.parametrize(("quirks", "key"), [("", "user"), ("tag-source-User", "User")])
def test_the_gateway_shows_the_host_lists_source_keys_as_datadog_spells_them(quirks: str, key: str) -> None:
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY

    app = Sandbox(quirks=quirks)
    with ServerThread(app) as server:
        app.base_url = server.url
        keys = {"datadog_api_key": SecretStr(DEFAULT_DD_API_KEY), "datadog_app_key": SecretStr(DEFAULT_DD_APP_KEY)}
        gateway = DatadogGateway(Settings(datadog_host=server.url, max_retries=0, **keys))
        try:
            gateway.add_tags("gpu-node-01", ["team:nlp"])
            assert gateway.listed_sources("gpu-node-01") == {key: ("team:nlp",)}
            assert gateway.listed_sources("gpu-node-0") is None  # a name the filter matches is not the host
            # gpufarm's own reads see the one spelling whatever Datadog's.
            assert [h.tags_by_source for h in gateway.list_hosts("gpu-node-01")] == [{"user": ("team:nlp",)}]
        finally:
            gateway.close()


@pytest.fixture
def chat(sandbox_url: str) -> SlackChat:
    return SlackChat(DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5, max_retries=0)


def test_every_web_api_answer_names_the_tokens_scopes(chat: SlackChat, sandbox: Sandbox, sandbox_url: str) -> None:
    assert chat.token_scopes() == frozenset(BOT_SCOPES)
    sandbox.slack.state.scopes.remove("files:write")
    assert chat.token_scopes() == frozenset(BOT_SCOPES) - {"files:write"}
    client = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)
    with pytest.raises(Exception) as refused:
        client.users_info(user="U404")
    assert refused.value.response.headers["x-oauth-scopes"] == ",".join(sandbox.slack.state.scopes)  # type: ignore[attr-defined]


def test_conversations_info_answers_like_slack(chat: SlackChat, sandbox: Sandbox, sandbox_url: str) -> None:
    client = WebClient(token=DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)
    answer = client.conversations_info(channel="C0000000001").data
    assert isinstance(answer, dict)
    assert key_paths(answer) == key_paths(json.loads((WEB_API / "conversations.info.ok.json").read_text()))
    assert chat.is_member("C0000000001") is True


def test_membership_a_private_channel_and_a_missing_scope(chat: SlackChat, sandbox: Sandbox) -> None:
    from gpufarm_sandbox.emulator.slack_workspace import ChannelSpec

    for spec in (
        ChannelSpec(id="C0000000077", name="elsewhere", is_member=False),
        ChannelSpec(id="G0000000078", name="secret-ops", is_private=True, is_member=False),
    ):
        sandbox.slack.state.channels[spec.id] = sandbox.slack.state.channel_object(spec)
    assert chat.is_member("C0000000077") is False
    # A private channel needs groups:read, which the app does not hold; with it, one the bot is not in is hidden.
    with pytest.raises(SlackError) as private:
        chat.is_member("G0000000078")
    assert private.value.code == "missing_scope"
    sandbox.slack.state.scopes.append("groups:read")
    with pytest.raises(SlackError) as hidden:
        chat.is_member("G0000000078")
    assert hidden.value.code == "channel_not_found"
    sandbox.slack.state.scopes.remove("channels:read")
    with pytest.raises(SlackError) as scope:
        chat.is_member("C0000000001")
    assert scope.value.code == "missing_scope"


@pytest.fixture
def refusing() -> Iterator[str]:
    """A stand-in Function URL that refuses what carries no token, saying what it was sent."""

    @Request.application  # type: ignore[misc]
    def app(request: Request) -> Response:
        said = {"method": request.method, "type": request.content_type, "body": request.get_data(as_text=True)}
        return Response(json.dumps(said), status=401, content_type="application/json")

    with ServerThread(app) as server:
        yield server.url


def test_a_function_urls_answer_without_credentials(refusing: str) -> None:
    status, body = function_url_answer(
        f"{refusing}/fn/x/", body=b"a=1", content_type="application/x-www-form-urlencoded"
    )
    assert status == 401
    assert json.loads(body) == {"method": "POST", "type": "application/x-www-form-urlencoded", "body": "a=1"}
    assert json.loads(function_url_answer(refusing)[1])["method"] == "GET"
    with pytest.raises(UpstreamError):
        function_url_answer("http://127.0.0.1:9/", timeout=2)
    with pytest.raises(ValidationFailed):
        function_url_answer("file:///etc/passwd")
