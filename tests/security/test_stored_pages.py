"""Profile pages are generated from data, never served as uploaded HTML (docs/security.md, "Threat model",
"Stored profile pages").

Whoever can write to the profile bucket (an uploader's credentials, a leaked key) can store any object under any
run's key. The pages function serves a signed link's run only as gpufarm's own page rendered from the run's stored
summary data, after validating it against the closed, bounded schema: a stored HTML page (a phishing form), a JSON
that does not validate, a summary of another lease stored under a run's key, or an oversize object is "not a
profiler run" (404); hostile strings inside a valid summary render as text. A valid run renders exactly the page
its figures always gave.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufarm.adapters.profile_store import PREFIX, SUMMARY, S3ProfileStore
from gpufarm.config import Settings
from gpufarm.handlers import runtime as rt
from gpufarm.handlers.profile_pages import handle
from gpufarm.profiling import reader, summary
from gpufarm.profiling.analysis import analyse
from gpufarm.profiling.links import LinkSigner
from gpufarm.profiling.page import render

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"
BUCKET = "gpufarm-security-stored-pages"
SECRET = "stored-pages-secret"
IR, NAME = 21, "run-3"
RUN = f"ir-{IR}/{NAME}-20261202t090000z"
NOW = 1_796_000_000
UPLOADED = "2026-12-01 15:00:00Z"
PHISHING = (
    b'<!doctype html><base href="https://evil.example/"><h1>Session expired</h1>'
    b'<form action="https://evil.example/login" method="post"><input name="password"></form>'
)
HOSTILE = (
    '<form action="https://evil.example/login"><input name=p></form>',
    "<script>alert(1)</script>",
    "</script><script>alert(2)</script>",
    'javascript:alert(3)" href="javascript:alert(4)',
    "\"'><svg onload=alert(5)>",
    "</style><base href=https://evil.example/>",
)
# Every element gpufarm's template writes; anything else in a served page came from stored data.
TEMPLATE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "div", "span", "b", "p",
    "table", "tr", "td", "th", "code", "svg", "rect", "text",
}  # fmt: skip


class Clock:
    """A fixed now, inside the signed links' life."""

    def now(self) -> datetime:
        return datetime.fromtimestamp(NOW, UTC)


class Page(HTMLParser):
    """A served page as a browser reads it: its elements, their attributes and its text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str]] = []
        self.text: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend((name, value or "") for name, value in attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def valid(ir: int = IR, run: str = NAME, **fields: Any) -> dict[str, Any]:
    """The summary an upload of the fixture trace stores, as JSON data, with `fields` replaced."""
    figures = analyse(reader.events(FIXTURES / "cpu_mlp.json"))
    data = summary.of(figures, ir=ir, run=run, uploaded=UPLOADED, trace_name="cpu_mlp.json").model_dump(mode="json")
    return {**data, **fields}


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The (mocked) profile bucket, written to as anyone holding S3 write access could."""
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
        rt.override(clock=Clock())
        try:
            yield s3
        finally:
            rt.reset()


def served(key: str = RUN) -> dict[str, Any]:
    """The pages function's answer to a valid signed link for `key`."""
    expires = NOW + 60
    sig = LinkSigner(SECRET.encode()).signature(key, expires)
    path = f"/profiles/{key}"
    return handle(
        {
            "version": "2.0",
            "rawPath": path,
            "queryStringParameters": {"expires": str(expires), "sig": sig},
            "headers": {},
            "requestContext": {"http": {"method": "GET", "path": path}},
        }
    )


def put(s3: Any, key: str, name: str, body: bytes, content_type: str = "application/json") -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}{key}/{name}", Body=body, ContentType=content_type)


def assert_refused(answer: dict[str, Any], key: str = RUN) -> None:
    if key.startswith("latest/") and answer["statusCode"] == 200:
        # A team's newest-run link where no summary is stored shows the no-run page, never what else is stored.
        assert "no profiler run yet" in answer["body"], answer
    else:
        assert answer["statusCode"] == 404, answer
        assert "not a profiler run" in answer["body"] or "no such profiler run" in answer["body"]
    assert "evil.example" not in answer["body"] and "<form" not in answer["body"]


@pytest.mark.parametrize("key", [RUN, "latest/nlp"])
def test_a_stored_html_page_with_a_phishing_form_is_not_served(bucket: Any, key: str) -> None:
    put(bucket, key, "summary.html", PHISHING, "text/html; charset=utf-8")  # a page stored the way runs once were
    assert_refused(served(key), key)
    put(bucket, key, SUMMARY, PHISHING, "text/html; charset=utf-8")  # the same page under the summary's name
    assert_refused(served(key), key)


def test_hostile_strings_in_a_valid_summary_render_inert(bucket: Any) -> None:
    lanes = [
        {"name": text, "busy_us": 10.0, "share": 0.5, "timeline": [0.5] * 120} for text in HOSTILE
    ]  # fmt: skip
    rows = [[text, 1000.0, 3] for text in HOSTILE]
    data = valid(
        trace_name=" ".join(HOSTILE)[:255],
        cpu_threads=lanes,
        top_operators=rows,
        top_kernels=rows,
        memory_peak_bytes={text[:64]: 1024 for text in HOSTILE},
    )
    put(bucket, RUN, SUMMARY, json.dumps(data).encode())
    answer = served()
    assert answer["statusCode"] == 200
    page = Page(answer["body"])
    assert page.tags <= TEMPLATE_TAGS  # no form, input, script, base, a, style-breaking element
    for name, value in page.attrs:
        assert not name.startswith("on") and name not in {"href", "src", "action", "formaction", "xlink:href"}
        assert "javascript:" not in value.lower() and "evil.example" not in value
    text = "".join(page.text)
    for hostile in HOSTILE:  # each shown to the reader as the text it is
        assert hostile in text
    assert "<script" not in answer["body"] and "<form" not in answer["body"] and "<base" not in answer["body"]


def _too_long(field: str, length: int) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data[field] = "x" * length

    return change


INVALID: dict[str, Callable[[dict[str, Any]], Any]] = {
    "an unknown field": lambda d: d.update(html="<form></form>"),
    "another format": lambda d: d.update(format="gpufarm.profile-summary/0"),
    "a missing field": lambda d: d.pop("events"),
    "a string for a number": lambda d: d.update(events="12"),
    "a negative time": lambda d: d.update(window_us=-1.0),
    "a share over one": lambda d: d.update(comm_share=1.5),
    "a run name that is not one": lambda d: d.update(run="<b>run</b>"),
    "an upload time that is not one": lambda d: d.update(uploaded="<script>"),
    "a trace name over 255": _too_long("trace_name", 256),
    "a kernel name over the analysis bound": lambda d: d.update(top_kernels=[["k" * 161, 1.0, 1]]),
    "too many streams": lambda d: d.update(gpu_streams=[d["cpu_threads"][0]] * 17),
    "too many step times": lambda d: d.update(step_times_ms=[1.0] * 4097),
    "too many table rows": lambda d: d.update(top_operators=[["op", 1.0, 1]] * 51),
    "a timeline over its bins": lambda d: d.update(cpu_threads=[{**d["cpu_threads"][0], "timeline": [0.1] * 121}]),
    "another lease's run": lambda d: d.update(ir=IR + 1),
    "another run of the lease": lambda d: d.update(run=NAME + "0"),
}


@pytest.mark.parametrize("change", INVALID.values(), ids=INVALID.keys())
def test_a_summary_that_does_not_validate_is_refused(bucket: Any, change: Callable[[dict[str, Any]], Any]) -> None:
    data = valid()
    change(data)
    put(bucket, RUN, SUMMARY, json.dumps(data).encode())
    assert_refused(served())


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2, 3]", b'{"format": "gpufarm.profile-summary/1"}', b"NaN"],
    ids=["empty", "not json", "a list", "a stub", "a bare NaN"],
)
def test_a_stored_object_that_is_not_a_summary_is_refused(bucket: Any, body: bytes) -> None:
    put(bucket, RUN, SUMMARY, body)
    assert_refused(served())


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused(bucket: Any, token: str) -> None:
    data = valid()
    text = json.dumps(data).replace(f'"window_us": {json.dumps(data["window_us"])}', f'"window_us": {token}')
    assert token in text
    put(bucket, RUN, SUMMARY, text.encode())
    assert_refused(served())


def test_an_oversize_summary_is_refused_and_read_only_up_to_the_bound(bucket: Any) -> None:
    # Valid JSON of a valid run, padded with whitespace past the bound: refused for its size alone.
    body = json.dumps(valid()).encode() + b" " * summary.MAX_BYTES
    put(bucket, RUN, SUMMARY, body)
    assert_refused(served())

    reads: list[int] = []

    class Body:
        def read(self, size: int = -1) -> bytes:
            reads.append(size)
            return body if size < 0 else body[:size]

        def close(self) -> None:
            pass

    class Client:
        def get_object(self, **kw: Any) -> dict[str, Any]:
            return {"Body": Body()}

    raw = S3ProfileStore(Settings(), BUCKET, client=Client()).summary(RUN)
    assert reads == [summary.MAX_BYTES + 1] and len(raw) == summary.MAX_BYTES + 1


@pytest.mark.parametrize("key", [RUN, "latest/nlp"])
def test_a_valid_run_renders_the_page_its_figures_always_gave(bucket: Any, tmp_path: Path, key: str) -> None:
    figures = analyse(reader.events(FIXTURES / "cpu_mlp.json"), batch_size=32)
    trace = tmp_path / "t.json.gz"
    trace.write_bytes((FIXTURES / "cpu_mlp.json.gz").read_bytes())
    data = summary.of(figures, ir=IR, run=NAME, uploaded=UPLOADED, trace_name="cpu_mlp.json")
    S3ProfileStore(Settings(), BUCKET, client=bucket).put_run(RUN, trace, data.to_json(), latest="latest/nlp")
    answer = served(key)
    assert answer["statusCode"] == 200
    assert answer["body"] == render(figures, ir=IR, run=NAME, uploaded=UPLOADED, trace_name="cpu_mlp.json")
    listed = bucket.list_objects_v2(Bucket=BUCKET)["Contents"]
    assert not [o["Key"] for o in listed if o["Key"].endswith(".html")]  # nothing stored is a page
