"""The profile pages function: a run's page for a signed, unexpired link; nothing for any other request."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufarm.adapters.profile_store import S3ProfileStore
from gpufarm.config import Settings
from gpufarm.handlers import runtime as rt
from gpufarm.handlers.profile_pages import handle
from gpufarm.profiling import reader, summary
from gpufarm.profiling.analysis import analyse
from gpufarm.profiling.links import LinkSigner

BUCKET = "gpufarm-profile-pages"
KEY = "ir-12/run-7-20261201t150000z"
SECRET = "pages-test-secret"
NOW = 1_796_000_000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"


def stored_summary(ir: int, run: str) -> bytes:
    """What an upload of the fixture trace stores for run `run` of IR-`ir`."""
    figures = analyse(reader.events(FIXTURES / "cpu_mlp.json"))
    uploaded = "2026-12-01 15:00:00Z"
    return summary.of(figures, ir=ir, run=run, uploaded=uploaded, trace_name="cpu_mlp.json").to_json()


class Clock:
    def now(self) -> Any:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(NOW, UTC)


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUFARM_PROFILE_BUCKET": BUCKET,
        "GPUFARM_PROFILE_LINK_SECRET": SECRET,
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        trace = tmp_path / "t.json.gz"
        shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "profiler" / "cpu_mlp.json.gz", trace)
        S3ProfileStore(Settings(), BUCKET, client=s3).put_run(KEY, trace, stored_summary(12, "run-7"))
        rt.override(clock=Clock())
        try:
            yield
        finally:
            rt.reset()


def _event(path: str, **query: str) -> dict[str, Any]:
    return {
        "version": "2.0",
        "rawPath": path,
        "queryStringParameters": query,
        "headers": {},
        "requestContext": {"http": {"method": "GET", "path": path}},
    }


def _signed(key: str = KEY, expires: int = NOW + 60, secret: str = SECRET) -> dict[str, Any]:
    sig = LinkSigner(secret.encode()).signature(key, expires)
    return _event(f"/profiles/{key}", expires=str(expires), sig=sig)


def test_a_signed_link_serves_the_page_with_headers_that_keep_it_self_contained(stored: None) -> None:
    answer = handle(_signed())
    assert answer["statusCode"] == 200 and "IR-12 · run-7" in answer["body"] and "<svg" in answer["body"]
    assert "default-src 'none'" in answer["headers"]["Content-Security-Policy"]
    assert answer["headers"]["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("event", "status"),
    [
        (_signed(expires=NOW - 1), 403),  # expired
        (_signed(secret="another"), 403),  # not our signature
        (
            _event(
                f"/profiles/{KEY}",
                expires=str(NOW + 60),
                sig=LinkSigner(SECRET.encode()).signature("ir-1/x-20261201t150000z", NOW + 60),
            ),
            403,
        ),
        (_event("/profiles/../../etc/passwd", expires="1", sig="x"), 403),  # not a run key
        (_signed(key="ir-12/run-8-20261201t150000z"), 404),  # signed, but no such run
        (_event("/elsewhere"), 404),
    ],
)
def test_anything_else_is_refused(stored: None, event: dict[str, Any], status: int) -> None:
    assert handle(event)["statusCode"] == status


def test_only_get(stored: None) -> None:
    event = _signed()
    event["requestContext"]["http"]["method"] = "POST"
    assert handle(event)["statusCode"] == 405


def test_the_bucket_keeps_runs_as_long_as_the_farm_says() -> None:
    import re

    from gpufarm.core.config.farm import ProfileSettings, parse_farm

    root = Path(__file__).resolve().parents[2]
    template = (root / "template.yaml").read_text()
    default = re.search(r"  ProfileRetentionDays:\n    Type: Number\n    Default: (\d+)\n", template)
    assert default is not None and "ExpirationInDays: !Ref ProfileRetentionDays" in template
    example = parse_farm((root / "config" / "farm.example.yaml").read_text()).profiles.retention_days
    assert int(default.group(1)) == ProfileSettings().retention_days == example


def test_the_sample_event_is_a_well_formed_request_for_a_run(stored: None) -> None:
    import json

    event = json.loads((Path(__file__).resolve().parents[2] / "events" / "profile_pages_get.json").read_text())
    assert handle(event)["statusCode"] == 403  # its signature is a placeholder: no secret signs it
    key = event["rawPath"].removeprefix("/profiles/")
    expires = int(event["queryStringParameters"]["expires"])
    event["queryStringParameters"]["sig"] = LinkSigner(SECRET.encode()).signature(key, expires)
    assert handle(event)["statusCode"] == 200


def test_a_teams_newest_run_is_served_for_its_signed_dashboard_link(stored: None, tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from gpufarm.profiling.links import latest_links

    signer = LinkSigner(SECRET.encode())
    now = datetime.fromtimestamp(NOW, UTC)
    links = latest_links("https://pages.example.test/", signer, ["nlp", "Bad Team"], now)
    assert list(links) == ["nlp"]
    # Signed in buckets: an hour later (the same bucket) the link is the same, so a re-apply changes nothing.
    assert links == latest_links("https://pages.example.test/", signer, ["nlp"], now + timedelta(hours=1))
    key, query = links["nlp"].removeprefix("https://pages.example.test/profiles/").split("?")
    args = dict(part.split("=") for part in query.split("&"))
    assert key == "latest/nlp"
    # No run of nlp stored yet: the dashboard's iframe shows a small page saying so, with the page's headers.
    empty = handle(_event(f"/profiles/{key}", **args))
    assert empty["statusCode"] == 200 and empty["headers"]["Content-Type"].startswith("text/html")
    assert "Team nlp: no profiler run yet" in empty["body"] and "gpufarm profile upload" in empty["body"]
    assert "{" not in empty["body"].split("</style>", 1)[1]  # a page, not a JSON error
    s3 = boto3.client("s3", region_name="us-east-1")
    trace = tmp_path / "t.json.gz"
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "profiler" / "cpu_mlp.json.gz", trace)
    S3ProfileStore(Settings(), BUCKET, client=s3).put_run(
        "ir-12/run-8-20261201t160000z", trace, stored_summary(12, "run-8"), latest="latest/nlp"
    )
    answer = handle(_event(f"/profiles/{key}", **args))
    assert answer["statusCode"] == 200 and "run-8" in answer["body"]


def test_a_run_of_more_steps_than_a_summary_keeps_shows_its_first_steps_and_says_so() -> None:
    from dataclasses import replace

    from gpufarm.profiling.page import render_summary

    figures = analyse(reader.events(FIXTURES / "cpu_mlp.json"))
    many = replace(figures, steps=5000, step_times_ms=tuple(1.0 + i / 1000 for i in range(5000)))
    data = summary.of(many, ir=12, run="run-7", uploaded="2026-12-01 15:00:00Z", trace_name="cpu_mlp.json")
    assert len(data.step_times_ms) == summary.MAX_STEP_TIMES and data.steps == 5000
    assert summary.parse(data.to_json(), KEY) == data
    page = render_summary(data)
    assert "The first 4,096 of 5,000 steps." in page and page.count("<rect") >= summary.MAX_STEP_TIMES
