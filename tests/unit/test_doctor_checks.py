"""gpufarm doctor's checks that only read, on fakes: the keys (one line, nothing after a refusal), gpufarm's
incident type and fields, the search forms, the idle monitors, the Slack scopes and channel, the Function URLs,
and the exit status the lines make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fakes import FARM_YAML

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed
from gpufarm.setup.doctor import chat, keys, objects, urls
from gpufarm.setup.doctor.report import Line, Status, exit_status, table
from gpufarm.setup.plan import desired_fields
from gpufarm_sandbox.emulator.account import ADMIN_PERMISSIONS
from gpufarm_sandbox.emulator.slack_workspace import BOT_SCOPES

ROOT = Path(__file__).resolve().parents[2]
WHERE = "https://api.datadoghq.eu"
DEPLOY = ROOT / "docs/deploy.md"


def user(permissions: list[str], roles: tuple[str, ...] = ("Datadog Standard Role",)) -> dict[str, Any]:
    included: list[dict[str, Any]] = [{"type": "roles", "id": r, "attributes": {"name": r}} for r in roles]
    included += [{"type": "permissions", "id": p, "attributes": {"name": p}} for p in permissions]
    return {"data": {"id": "u1", "type": "users", "attributes": {"handle": "ops@example.com"}}, "included": included}


class FakeAdmin:
    """The keys' calls and what apply reads, recorded."""

    def __init__(self, *, api_valid: bool | Exception = True, who: dict[str, Any] | None = None) -> None:
        self.api_valid = api_valid
        self.who = who if who is not None else user(list(keys.REQUIRED_PERMISSIONS))
        self.calls: list[str] = []
        self.types: list[dict[str, Any]] = [{"id": "t1", "attributes": {"name": "GPU allocation", "is_default": False}}]
        self.fields: list[dict[str, Any]] = []
        self.refused: set[str] = set()

    def api_key_valid(self) -> bool:
        self.calls.append("validate")
        if isinstance(self.api_valid, Exception):
            raise self.api_valid
        return self.api_valid

    def current_user(self) -> dict[str, Any] | None:
        self.calls.append("current_user")
        return self.who or None

    def list_incident_types(self) -> list[dict[str, Any]]:
        return self.types

    def list_field_definitions(self, incident_type_id: str | None = None) -> list[dict[str, Any]]:
        return self.fields

    def validate_monitor(self, monitor: dict[str, Any]) -> None:
        if monitor["name"] in self.refused:
            raise ValidationFailed("datadog", "Datadog validate monitor failed: HTTP 400: The value provided is bad")


# -- the report ------------------------------------------------------------------------------------------------------


def test_the_exit_status_is_the_worst_line() -> None:
    ok, fell, broken, skipped = (Line("c", s, "") for s in Status)
    assert [exit_status(x) for x in ([ok, skipped], [ok, fell], [fell, broken], [])] == [0, 3, 1, 0]


def test_the_table_aligns_the_status_column() -> None:
    rows = table([Line("a", Status.CONFIRMED, "x"), Line("a much longer check name than others", Status.BROKEN, "y")])
    assert len({row.index("  confirmed" if "confirmed" in row else "  broken") for row in rows}) == 1


# -- the keys ------------------------------------------------------------------------------------------------------


def test_a_refused_api_key_is_one_line_that_reads_nothing_more() -> None:
    admin = FakeAdmin(api_valid=False)
    line = keys.check_keys(admin, WHERE)
    assert (line.status, admin.calls) == (Status.BROKEN, ["validate"])
    assert line.detail.startswith("bad API key") and WHERE in line.detail


def test_a_site_that_does_not_answer_is_named() -> None:
    line = keys.check_keys(FakeAdmin(api_valid=UpstreamError("could not connect (NewConnectionError)")), WHERE)
    assert line.status is Status.BROKEN and line.detail.startswith(f"cannot reach site {WHERE}")


def test_a_refused_application_key_is_told_from_the_api_key() -> None:
    line = keys.check_keys(FakeAdmin(who={}), WHERE)
    assert line.status is Status.BROKEN and line.detail.startswith("bad application key")


def test_a_missing_permission_is_named_with_what_needs_it() -> None:
    granted = [p for p in keys.REQUIRED_PERMISSIONS if p != "incident_write"]
    line = keys.check_keys(FakeAdmin(who=user(granted)), WHERE)
    assert line.status is Status.BROKEN
    assert (
        "incident_write (functions: creating and updating leases)" in line.detail and "ops@example.com" in line.detail
    )


def test_every_permission_held_is_confirmed_and_an_answer_without_any_falls_back() -> None:
    assert keys.check_keys(FakeAdmin(), WHERE).status is Status.CONFIRMED
    assert keys.check_keys(FakeAdmin(who=user([])), WHERE).status is Status.FELL_BACK


def test_unset_keys_are_named_without_a_call() -> None:
    from gpufarm.config import Settings

    assert keys.unset_keys(Settings(datadog_api_key="a", datadog_app_key="b")) is None
    no_app = keys.unset_keys(Settings(datadog_api_key="a", datadog_app_key=""))
    assert no_app is not None and no_app.detail.startswith("bad application key")


def test_the_permissions_checked_are_those_docs_deploy_md_grants_each_part() -> None:
    import permission_tables as pt

    granted: dict[str, set[str]] = {"functions": set(), "`gpufarm datadog apply`": set()}
    for row in pt.rows(pt.tables(DEPLOY.read_text())["Datadog"], "permission", "operations", r"\w+", "called by"):
        for part in (row.parts or ()) if row.grant else ():
            granted.setdefault(part, set()).add(row.grant)
    assert set(keys.FUNCTIONS_PERMISSIONS) == granted["functions"]
    assert set(keys.APPLY_PERMISSIONS) == granted["`gpufarm datadog apply`"]


def test_the_sandbox_role_grants_every_permission_gpufarm_needs() -> None:
    assert set(keys.REQUIRED_PERMISSIONS) <= {name for name, _, _ in ADMIN_PERMISSIONS}


# -- gpufarm's incident type and fields ----------------------------------------------------------------------------


def _fields_as_applied(farm: Any) -> list[dict[str, Any]]:
    made = []
    for spec, attributes in desired_fields(farm.valid_values()):
        assert attributes is not None
        made.append({"id": f"f-{spec.name}", "attributes": dict(attributes)})
    return made


def test_the_fields_apply_makes_are_confirmed_and_missing_or_different_ones_broken() -> None:
    farm = parse_farm(FARM_YAML)
    admin = FakeAdmin()
    admin.fields = _fields_as_applied(farm)
    line, type_id = objects.check_incident_type(admin, "GPU allocation", farm)
    assert (line.status, type_id) == (Status.CONFIRMED, "t1")
    admin.fields = [f for f in admin.fields if f["attributes"]["name"] != "team"]
    admin.fields[0]["attributes"]["display_name"] = "Renamed"
    line, _ = objects.check_incident_type(admin, "GPU allocation", farm)
    assert line.status is Status.BROKEN
    assert "missing team" in line.detail and f"different {admin.fields[0]['attributes']['name']}" in line.detail


def test_no_incident_type_or_the_default_one_is_broken() -> None:
    admin = FakeAdmin()
    admin.types = []
    assert objects.check_incident_type(admin, "GPU allocation", None)[1] is None
    admin.types = [{"id": "t0", "attributes": {"name": "GPU allocation", "is_default": True}}]
    line, type_id = objects.check_incident_type(admin, "GPU allocation", None)
    assert type_id is None and "default type" in line.detail


# -- search forms and monitors --------------------------------------------------------------------------------------


class Outcome:
    def __init__(self, form: str, status: str, detail: str = "") -> None:
        self.form, self.status, self.detail = form, status, detail


class FakeSearches:
    def __init__(self, *answers: list[Outcome]) -> None:
        self.answers = list(answers)
        self.samples: list[Any] = []

    def check_search_forms(self, sample: Any = None) -> list[Outcome]:
        self.samples.append(sample)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class NoWait:
    wait_s = 5.0

    def __init__(self) -> None:
        self.slept: list[float] = []

    def clock(self) -> float:
        return sum(self.slept)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_form_that_misses_a_fresh_sample_is_tried_again_before_it_counts() -> None:
    searches = FakeSearches([Outcome("team", "broken")], [Outcome("team", "confirmed"), Outcome("phase", "odd")])
    timing = NoWait()
    lines = objects.check_searches(searches, "sample", timing)  # type: ignore[arg-type]
    assert [(x.check, x.status) for x in lines] == [("search team", Status.CONFIRMED), ("search phase", Status.BROKEN)]
    assert searches.samples == ["sample", "sample"] and timing.slept == [objects.SEARCH_RETRY_S]


def test_each_monitor_datadog_refuses_gets_its_line() -> None:
    farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
    admin = FakeAdmin()
    from gpufarm.setup.squatter_monitor import farm_monitors

    wanted = farm_monitors(farm)
    admin.refused = {wanted[0].body["name"]}
    lines = objects.check_monitors(admin, farm)
    counts = f"{len(wanted) - 1} of {len(wanted)} monitors valid (idle and squatter)"
    assert lines[0] == Line("monitors", Status.BROKEN, counts)
    assert [x.check for x in lines[1:]] == [f"monitor {wanted[0].key}"] and "bad" in lines[1].detail
    assert objects.check_monitors(admin, None)[0].status is Status.SKIPPED


# -- Slack ----------------------------------------------------------------------------------------------------------


class FakeSlack:
    def __init__(self, scopes: frozenset[str] | None, member: bool | Exception = True) -> None:
        self.scopes, self.member = scopes, member

    def token_scopes(self) -> frozenset[str] | None:
        return self.scopes

    def is_member(self, channel: str) -> bool:
        if isinstance(self.member, Exception):
            raise self.member
        return self.member


def test_the_manifest_the_check_and_the_sandbox_ask_for_the_same_scopes() -> None:
    manifest = yaml.safe_load((ROOT / "slack" / "manifest.yaml").read_text())
    assert tuple(manifest["oauth_config"]["scopes"]["bot"]) == chat.BOT_SCOPES == BOT_SCOPES


def test_slack_scopes_and_channel() -> None:
    every = frozenset(chat.BOT_SCOPES)
    scopes, channel = chat.check_slack(FakeSlack(every), "", "C1")
    assert (scopes.status, channel.status) == (Status.CONFIRMED, Status.CONFIRMED)
    scopes, channel = chat.check_slack(FakeSlack(every - {"files:write"}, member=False), "", "C1")
    assert scopes.status is Status.BROKEN and "files:write" in scopes.detail
    assert channel.status is Status.BROKEN and "/invite" in channel.detail
    assert chat.check_slack(FakeSlack(None), "", None)[0].status is Status.FELL_BACK
    assert chat.check_slack(FakeSlack(every), "", None)[1].status is Status.SKIPPED
    assert chat.check_slack(None, "no Slack bot token", "C1")[0] == Line(
        chat.SCOPES, Status.BROKEN, "no Slack bot token"
    )


def test_a_private_channel_is_skipped_and_a_missing_channels_read_broken() -> None:
    every = frozenset(chat.BOT_SCOPES)
    refused = UpstreamError("slack conversations.info failed: missing_scope")
    assert chat.check_slack(FakeSlack(every, refused), "", "G1")[1] == Line(chat.CHANNEL, Status.SKIPPED, chat.PRIVATE)
    lacking = chat.check_slack(FakeSlack(every - {"channels:read"}, refused), "", "C1")[1]
    assert lacking.status is Status.BROKEN and "needs channels:read" in lacking.detail
    gone = chat.check_slack(
        FakeSlack(every, UpstreamError("slack conversations.info failed: channel_not_found")), "", "C9"
    )[1]
    assert gone.status is Status.BROKEN


# -- Function URLs --------------------------------------------------------------------------------------------------


def test_each_function_url_is_judged_by_gpufarms_own_refusal() -> None:
    answers: dict[str, tuple[int, str] | Exception] = {
        "https://in/": (401, '{"error":"invalid signature"}'),
        "https://hook/": (403, '{"Message":"Forbidden"}'),
        "https://idle/": UpstreamError("no answer from idle (ConnectionRefusedError)"),
    }
    sent: list[tuple[str, bytes | None]] = []

    def answer(url: str, body: bytes | None, kind: str) -> tuple[int, str]:
        sent.append((url, body))
        found = answers[url]
        if isinstance(found, Exception):
            raise found
        return found

    given = {urls.INGRESS: "https://in/", urls.INCIDENT: "https://hook/", urls.IDLE: "https://idle/", urls.PAGES: None}
    lines = urls.check_urls(answer, given)
    assert [x.status for x in lines] == [Status.CONFIRMED, Status.BROKEN, Status.BROKEN, Status.SKIPPED, Status.SKIPPED]
    assert "auth NONE" in lines[1].detail and "ConnectionRefusedError" in lines[2].detail
    assert sent[0] == ("https://in/", b"command=%2Fgpu&text=help")


def test_the_profile_pages_are_asked_for_a_link_to_no_run() -> None:
    seen: list[str] = []

    def answer(url: str, body: bytes | None, kind: str) -> tuple[int, str]:
        seen.append(url)
        assert body is None
        return 500, '{"error":"not configured"}'

    [line] = urls.check_urls(answer, {urls.PAGES: "https://pages/"})[-2:-1]
    assert seen == ["https://pages/profiles/gpufarm-doctor?expires=0&sig=0"]
    assert line.status is Status.BROKEN and "500" in line.detail and "not configured" in line.detail


def test_the_profile_upload_is_asked_to_begin_without_a_token() -> None:
    seen: list[tuple[str, bytes | None]] = []

    def answer(url: str, body: bytes | None, kind: str) -> tuple[int, str]:
        seen.append((url, body))
        return 401, '{"error":"an upload token is required"}'

    [line] = urls.check_urls(answer, {urls.UPLOAD: "https://upload/"})[-1:]
    assert seen == [("https://upload/begin", b"{}")]
    assert line.status is Status.CONFIRMED and line.check == "url profile upload"
