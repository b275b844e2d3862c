"""Page links rotate and live no longer than a bound (docs/security.md, "Threat model", "Page links").

A profiler run's page link (gpufarm.profiling.links) is an HMAC over the run and its expiry. Two controls keep a
leaked link or a leaked key short-lived: the link key rotates (the previous key is accepted only while the gpufarm
secret still holds it as `profile_link_secret_previous`), and every link's life is bounded
(GPUFARM_PROFILE_LINK_DAYS, default 30) when it is CHECKED, so a link signed for longer does not open even with a
valid signature. The dashboards' `latest/<team>` iframes are signed for the bound by `gpufarm datadog apply` and
re-signed by the scheduled sync when they near their expiry; a sync with nothing due writes no dashboard.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeQueue
from moto import mock_aws

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.adapters.datadog_dashboards import ProjectDashboardEditor
from gpufarm.adapters.profile_store import S3ProfileStore
from gpufarm.config import SecretStr, SettingInvalid, Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.handlers import profile_pages, quota_sync
from gpufarm.handlers import runtime as rt
from gpufarm.profiling import reader, summary
from gpufarm.profiling.analysis import analyse
from gpufarm.profiling.dashboard_links import newest_run_links
from gpufarm.profiling.links import DAY_S, LinkSigner, latest_expiry, link_checker, link_signer
from gpufarm.setup import apply as setup
from gpufarm.setup import dashboards as dash
from gpufarm.setup import plan as planning

pytestmark = pytest.mark.security

BUCKET = "gpufarm-page-links"
RUN = "ir-12/run-7-20261201t150000z"
PAGES = "https://pages.example.test"
CURRENT, PREVIOUS = "link-key-after-the-rotation-0001", "link-key-before-the-rotation-001"
START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
BOUND_S = 30 * DAY_S
TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "profiler" / "cpu_mlp.json.gz"


class Clock:
    """The pages function's clock, moved by the test."""

    def __init__(self) -> None:
        self.current = START

    def now(self) -> datetime:
        return self.current


@pytest.fixture
def pages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Clock]:
    """The pages function over a moto bucket holding one run and nlp's newest run; the current link key set."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUFARM_PROFILE_BUCKET": BUCKET,
        "GPUFARM_PROFILE_LINK_SECRET": CURRENT,
    }.items():
        monkeypatch.setenv(key, value)
    for name in ("GPUFARM_PROFILE_LINK_SECRET_PREVIOUS", "GPUFARM_PROFILE_LINK_DAYS", "GPUFARM_SECRETS_NAME"):
        monkeypatch.delenv(name, raising=False)
    clock = Clock()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        trace = tmp_path / "t.json.gz"
        shutil.copy(TRACE, trace)
        # What an upload stores: the run's figures as data (gpufarm.profiling.summary), the page rendered when served.
        figures = analyse(reader.events(TRACE))
        data = summary.of(figures, ir=12, run="run-7", uploaded="2026-12-01 15:00:00Z", trace_name="cpu_mlp.json")
        S3ProfileStore(Settings(), BUCKET, client=s3).put_run(RUN, trace, data.to_json(), "latest/nlp")
        rt.reset()
        rt.override(clock=clock)
        try:
            yield clock
        finally:
            rt.reset()


def _open(link: str) -> dict[str, Any]:
    """What the pages function answers a browser following `link`."""
    parts = urlsplit(link)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    event = {
        "version": "2.0",
        "rawPath": parts.path,
        "queryStringParameters": query,
        "headers": {},
        "requestContext": {"http": {"method": "GET", "path": parts.path}},
    }
    return profile_pages.handle(event)


def _link(secret: str, expires: float, key: str = RUN) -> str:
    return LinkSigner(secret.encode()).link(PAGES, key, int(expires))


# -- rotation ----------------------------------------------------------------------------------------------------


def test_a_link_of_the_previous_key_opens_during_the_rotation_and_not_after(
    pages: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _link(PREVIOUS, START.timestamp() + 7 * DAY_S)
    after = _link(CURRENT, START.timestamp() + 7 * DAY_S)
    # Rotation step 1-2: the old key moves to `_previous`, a new one signs.
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_SECRET_PREVIOUS", PREVIOUS)
    assert _open(before)["statusCode"] == 200
    assert _open(after)["statusCode"] == 200
    # Last step: `_previous` removed; only the new key's links open.
    monkeypatch.delenv("GPUFARM_PROFILE_LINK_SECRET_PREVIOUS")
    refused = _open(before)
    assert refused["statusCode"] == 403 and "not valid" in refused["body"]
    assert _open(after)["statusCode"] == 200


def test_the_previous_key_comes_from_the_gpufarm_secret_and_never_signs() -> None:
    settings = Settings(profile_link_secret=SecretStr("x")).with_secrets(
        {"profile_link_secret": CURRENT, "profile_link_secret_previous": PREVIOUS}
    )
    signer = link_checker(settings)
    assert signer.previous == PREVIOUS.encode()
    assert link_signer(settings).previous is None  # what signs accepts the link key only
    # Signing always uses the current key: a new link is the current key's, whichever key checks it.
    now = START.timestamp()
    link = signer.link(PAGES, RUN, int(now) + 60)
    assert "sig=" + LinkSigner(b"x").signature(RUN, int(now) + 60) in link
    assert link_checker(Settings(profile_link_secret=SecretStr(CURRENT))).previous is None


# -- the bound ---------------------------------------------------------------------------------------------------


def test_a_link_past_the_bound_is_refused_even_with_a_valid_signature(pages: Clock) -> None:
    now = START.timestamp()
    # The dashboards' links of earlier releases: signed to the start of the year after next.
    two_years = _link(CURRENT, datetime(START.year + 2, 1, 1, tzinfo=UTC).timestamp(), key="latest/nlp")
    refused = _open(two_years)
    assert refused["statusCode"] == 403 and refused["body"].count("not valid") == 1
    assert _open(_link(CURRENT, now + 9_999_999_999 - now))["statusCode"] == 403  # "expiry 9999999999"
    assert _open(_link(CURRENT, now + BOUND_S + 60))["statusCode"] == 403
    assert _open(_link(CURRENT, now + BOUND_S))["statusCode"] == 200
    # The same link opens once it is within the bound of now, and not after its expiry.
    link = _link(CURRENT, now + BOUND_S + 3600)
    pages.current = START + timedelta(hours=2)
    assert _open(link)["statusCode"] == 200
    pages.current = START + timedelta(seconds=BOUND_S + 3601)
    assert "expired" in _open(link)["body"]


def test_the_bound_is_a_setting_with_a_range(pages: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    week = _link(CURRENT, START.timestamp() + 7 * DAY_S)
    assert _open(week)["statusCode"] == 200
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_DAYS", "6")
    assert _open(week)["statusCode"] == 403
    for days in ("0", "366", "1" + "0" * 5000):
        with pytest.raises(SettingInvalid, match="profile_link_days"):
            Settings(profile_link_days=days)


def test_a_link_is_never_signed_for_longer_than_the_bound() -> None:
    signer = LinkSigner(CURRENT.encode(), max_age_s=7 * DAY_S)
    now = START.timestamp()
    assert signer.expiry(now, 30 * DAY_S) == int(now) + 7 * DAY_S  # the runs' retention is longer: the bound
    assert signer.expiry(now, 3 * DAY_S) == int(now) + 3 * DAY_S  # shorter: the retention


# -- dashboard iframes: apply and the sync -----------------------------------------------------------------------


def _settings(**values: Any) -> Settings:
    return Settings(**{"profile_pages_url": PAGES, "profile_link_secret": SecretStr(CURRENT), **values})


def _iframe_links(body: Mapping[str, Any]) -> list[str]:
    from gpufarm.setup.dashboards_widgets import walk

    return [w["definition"]["url"] for w in walk(body["widgets"]) if w["definition"]["type"] == "iframe"]


def _project(settings: Settings, now: datetime) -> dict[str, Any]:
    farm = parse_farm(FARM_YAML)
    specs = dash.desired_dashboards(farm, newest_run_links(settings, farm, now))
    return next(copy.deepcopy(s.body) for s in specs if s.key == "project")


def _expiry(link: str) -> int:
    return int(parse_qs(urlsplit(link).query)["expires"][0])


def test_apply_signs_the_iframes_within_the_bound_and_in_buckets() -> None:
    settings = _settings()
    signer = link_signer(settings)
    links = _iframe_links(_project(settings, START))
    assert links and all("/profiles/latest/" in link for link in links)
    now = START.timestamp()
    for link in links:
        assert BOUND_S / 2 <= _expiry(link) - now <= BOUND_S
        key = urlsplit(link).path.removeprefix("/profiles/")
        signer.check(key, str(_expiry(link)), parse_qs(urlsplit(link).query)["sig"][0], now)
    # Within a bucket a re-apply signs the same links (no drift); a bucket later they move by one bucket.
    assert _iframe_links(_project(settings, START + timedelta(hours=1))) == links
    later = START + timedelta(seconds=BOUND_S // 2)
    assert _expiry(_iframe_links(_project(settings, later))[0]) == _expiry(links[0]) + BOUND_S // 2
    assert latest_expiry(now, BOUND_S) == _expiry(links[0])


class Editor:
    """The project dashboard as the sync sees it (ProjectDashboardEditor's interface); records every write."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.body = body
        self.writes: list[dict[str, Any]] = []

    def project(self) -> tuple[str, dict[str, Any]] | None:
        return None if self.body is None else ("abc-def-ghi", copy.deepcopy(self.body))

    def replace(self, dashboard_id: str, body: Mapping[str, Any]) -> None:
        assert dashboard_id == "abc-def-ghi"
        self.writes.append(dict(body))
        self.body = {**(self.body or {}), **copy.deepcopy(dict(body))}


@pytest.fixture
def sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeClock, Editor]]:
    """The scheduled sync over the in-memory fakes, with the profile pages configured and an editor to fill."""
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_PROFILE_LINK_SECRET_PREVIOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFARM_PROFILE_PAGES_URL", PAGES)
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_SECRET", CURRENT)
    clock = FakeClock(START)
    editor = Editor(None)
    rt.reset()
    rt.override(
        clock=clock,
        incidents=FakeIncidents(clock),
        hosts=FakeHosts(),
        metrics=FakeMetrics(),
        chat=FakeChat(),
        farm=parse_farm(FARM_YAML),
        queue=FakeQueue(),
        dashboard_editor=editor,
    )
    yield clock, editor
    rt.reset()


def test_the_sync_resigns_the_iframes_near_their_expiry_and_writes_nothing_otherwise(
    sync: tuple[FakeClock, Editor],
) -> None:
    clock, editor = sync
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "no dashboard"
    editor.body = _project(_settings(), START)
    signed = _iframe_links(editor.body)
    due = _expiry(signed[0]) - BOUND_S // 4
    clock.current = datetime.fromtimestamp(due - 60, UTC)
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "current"
    assert editor.writes == []  # no dashboard write on a sync with nothing due
    clock.current = datetime.fromtimestamp(due + 60, UTC)
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "re-signed"
    (written,) = editor.writes
    fresh = _iframe_links(written)
    assert len(fresh) == len(signed) and fresh != signed
    now = clock.current.timestamp()
    assert all(BOUND_S / 2 <= _expiry(link) - now <= BOUND_S for link in fresh)
    # Only the links changed: the rest of the dashboard is written back as it was read.
    assert {k: v for k, v in written.items() if k != "widgets"} == {
        k: v for k, v in _project(_settings(), START).items() if k != "widgets"
    }
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "current"
    assert len(editor.writes) == 1
    # The every-minute sweep never reads the dashboard.
    assert "dashboard_links" not in quota_sync.handle({"job": "sweep"})


def _signed_by(secret: str, link: str) -> bool:
    key = urlsplit(link).path.removeprefix("/profiles/")
    return LinkSigner(secret.encode()).signed_now(key, _expiry(link), parse_qs(urlsplit(link).query)["sig"][0])


def test_the_sync_resigns_links_of_the_previous_key_and_links_past_the_bound(
    sync: tuple[FakeClock, Editor], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, editor = sync
    # Mid-rotation: the dashboard still carries the previous key's links, fresh in time.
    editor.body = _project(_settings(profile_link_secret=SecretStr(PREVIOUS)), START)
    assert all(_signed_by(PREVIOUS, link) for link in _iframe_links(editor.body))
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_SECRET_PREVIOUS", PREVIOUS)
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "re-signed"
    assert all(_signed_by(CURRENT, link) for link in _iframe_links(editor.writes[0]))
    # A two-year link (an earlier release's apply) is due at once, though its signature is the current key's.
    editor.writes.clear()
    body = _project(_settings(), START)
    two_years = int(datetime(START.year + 2, 1, 1, tzinfo=UTC).timestamp())
    _replace_links(body, lambda key: _link(CURRENT, two_years, key=key))
    editor.body = body
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "re-signed"
    fresh = _iframe_links(editor.writes[0])
    assert fresh and all(_expiry(link) - START.timestamp() <= BOUND_S for link in fresh)


def test_a_deployment_without_the_pages_or_with_datadog_down_still_syncs(
    sync: tuple[FakeClock, Editor], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufarm.core.kernel.errors import UpstreamError

    _, editor = sync
    editor.body = _project(_settings(), START)
    monkeypatch.delenv("GPUFARM_PROFILE_PAGES_URL")
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "not configured"
    monkeypatch.setenv("GPUFARM_PROFILE_PAGES_URL", PAGES)

    def down() -> None:
        raise UpstreamError("Datadog answered 503 to list dashboards")

    editor.project = down  # type: ignore[method-assign,assignment]
    assert quota_sync.handle({"job": "quota_sync"})["dashboard_links"] == "not refreshed"
    assert editor.writes == []


def _replace_links(body: dict[str, Any], link: Any) -> None:
    from gpufarm.setup.dashboards_widgets import walk

    for widget in walk(body["widgets"]):
        if widget["definition"]["type"] == "iframe":
            key = urlsplit(widget["definition"]["url"]).path.removeprefix("/profiles/")
            widget["definition"]["url"] = link(key)


def test_the_sync_resigns_a_dashboard_apply_made_in_the_sandbox(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end against the sandbox: apply writes the project dashboard, the real editor reads it; a sync
    with nothing due writes nothing (the dashboard's modified_at stays), a sync near expiry re-signs it."""
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", "hook-secret-for-page-link-tests-1")
    monkeypatch.setenv("GPUFARM_PROFILE_PAGES_URL", PAGES)
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_SECRET", CURRENT)
    settings = Settings(max_retries=1)
    farm = parse_farm(FARM_YAML)
    spec = planning.SetupSpec(
        incident_webhook_url="http://127.0.0.1:9/fn/incident_webhook/",
        idle_webhook_url="http://127.0.0.1:9/fn/idle_alert/",
        valid_values=farm.valid_values(),
        has_secret=True,
        dashboards=dash.desired_dashboards(farm, newest_run_links(settings, farm, START)),
        metric_metadata={},
    )
    admin = DatadogAdmin(settings)
    try:
        setup.apply_setup(admin, spec, secret=SecretStr("hook-secret-for-page-link-tests-1"), dry_run=False)
        editor = ProjectDashboardEditor(settings)
        found = editor.project()
        assert found is not None
        dashboard_id, before = found
        signed = _iframe_links(before)
        clock = FakeClock(datetime.fromtimestamp(_expiry(signed[0]) - BOUND_S // 2, UTC))
        rt.reset()
        rt.override(clock=clock, dashboard_editor=editor)
        runtime = rt.current()
        assert quota_sync.refresh_dashboard_links(runtime) == "current"
        assert admin.get_dashboard(dashboard_id) == before
        clock.current = datetime.fromtimestamp(_expiry(signed[0]) - BOUND_S // 8, UTC)
        assert quota_sync.refresh_dashboard_links(runtime) == "re-signed"
        after = admin.get_dashboard(dashboard_id)
        assert after is not None
        fresh = _iframe_links(after)
        assert len(fresh) == len(signed) and all(_expiry(link) > _expiry(signed[0]) for link in fresh)
        assert after["title"] == before["title"] and after["description"] == before["description"]
    finally:
        rt.reset()
        admin.close()
