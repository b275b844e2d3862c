"""Public endpoints are bounded (docs/security.md, "Threat model", "Public endpoints").

An outsider can call every Function URL whose AuthType is NONE: Lambda invokes, and bills, the function before any
signature or token is checked. So each such function has reserved concurrency from a template parameter (a flood is
throttled at its bound), an alarm on a surge of 4xx answers, and a handler that refuses an oversize body from its
length alone, before it decodes or parses anything or reads its configuration (the profile upload function reads
its token key only after that check). The served profile pages forbid
forms and <base> in their CSP. The public functions are read from template.yaml, so a new public URL is held to the
same rules.
"""

from __future__ import annotations

import base64
import importlib
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufarm.adapters.profile_store import S3ProfileStore
from gpufarm.config import Settings
from gpufarm.handlers import http
from gpufarm.handlers import runtime as rt
from gpufarm.profiling import reader, summary
from gpufarm.profiling.analysis import analyse
from gpufarm.profiling.links import LinkSigner
from gpufarm_sandbox.localhost.template import load_yaml

REPO = Path(__file__).resolve().parents[2]
RAW = load_yaml((REPO / "template.yaml").read_text())
RESOURCES: dict[str, Any] = RAW["Resources"]
PUBLIC = sorted(
    name
    for name, resource in RESOURCES.items()
    if resource["Type"] == "AWS::Serverless::Function"
    and (resource["Properties"].get("FunctionUrlConfig") or {}).get("AuthType") == "NONE"
)
# Lambda keeps at least 100 of the account's regional concurrency unreserved; the default limit is 1,000.
ACCOUNT_DEFAULT_LIMIT = 1000
UNRESERVED_MINIMUM = 100
# Larger than any body Slack or Datadog sends, and than the 6 MB a Function URL accepts.
HUGE = 8 * 1024 * 1024
# The method each public handler serves (POST unless listed): a GET page link.
METHODS = {"profile_pages": "GET"}


def _properties(name: str) -> dict[str, Any]:
    return dict(RESOURCES[name]["Properties"])


def _module(name: str) -> str:
    """The gpufarm.handlers module a public function's entry point wraps (functions/<dir>/<dir>.py)."""
    return str(_properties(name)["CodeUri"]).removeprefix("functions/")


def test_the_template_has_public_urls_to_hold() -> None:
    # The five of today's template; a sixth public URL is held by every test below as it comes.
    assert {
        "SlackIngressFunction",
        "IncidentWebhookFunction",
        "IdleAlertFunction",
        "ProfilePagesFunction",
        "ProfileUploadFunction",
    } <= set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_function_reserves_concurrency_from_a_parameter(name: str) -> None:
    reserved = _properties(name).get("ReservedConcurrentExecutions")
    assert isinstance(reserved, dict) and set(reserved) == {"Ref"}, f"{name}: no parameter bounds its concurrency"
    parameter = RAW["Parameters"][reserved["Ref"]]
    assert parameter["Type"] == "Number"
    # Never 0 (that would stop the function) and never the whole account.
    assert 1 <= parameter["MinValue"] <= parameter["Default"] <= parameter["MaxValue"]
    assert parameter["MaxValue"] <= ACCOUNT_DEFAULT_LIMIT - UNRESERVED_MINIMUM


def test_the_defaults_leave_the_account_its_unreserved_minimum() -> None:
    reserved = [
        RAW["Parameters"][_properties(name)["ReservedConcurrentExecutions"]["Ref"]]["Default"]
        for name in PUBLIC
        if isinstance(_properties(name).get("ReservedConcurrentExecutions"), dict)
    ]
    assert len(reserved) == len(PUBLIC)
    assert sum(reserved) <= ACCOUNT_DEFAULT_LIMIT - UNRESERVED_MINIMUM


def _url_4xx_alarms(function: str) -> list[dict[str, Any]]:
    return [
        resource["Properties"]
        for resource in RESOURCES.values()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
        and resource["Properties"].get("Namespace") == "AWS/Lambda"
        and resource["Properties"].get("MetricName") == "Url4xxCount"
        and {"Name": "FunctionName", "Value": {"Ref": function}} in resource["Properties"].get("Dimensions", [])
    ]


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_function_has_a_4xx_surge_alarm_to_the_alarm_topic(name: str) -> None:
    (alarm,) = _url_4xx_alarms(name)
    assert (alarm["Statistic"], alarm["ComparisonOperator"]) == ("Sum", "GreaterThanOrEqualToThreshold")
    assert alarm["Threshold"] == {"Ref": "PublicUrl4xxAlarmThreshold"}
    # A URL nobody calls has no data point: missing data is quiet, not an alarm.
    assert alarm["TreatMissingData"] == "notBreaching"
    # Where the dead-letter alarms go.
    dead_letter = RESOURCES["AllocationDeadLetterAlarm"]["Properties"]["AlarmActions"]
    assert alarm["AlarmActions"] == dead_letter


# --- Oversize bodies are refused before anything reads them -----------------------------------------------------


class Body(str):
    """A request body that records every read beyond its length: decoding, slicing, iterating, searching."""

    __slots__ = ()
    reads: list[str] = []

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        Body.reads.append("encode")
        return str.encode(self, *args, **kwargs)

    def __getitem__(self, index: Any) -> str:  # type: ignore[override]
        Body.reads.append("getitem")
        return str.__getitem__(self, index)

    def __iter__(self) -> Iterator[str]:
        Body.reads.append("iter")
        return str.__iter__(self)

    def strip(self, chars: str | None = None) -> str:
        Body.reads.append("strip")
        return str.strip(self, chars)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every parser and the configuration, spied: what a handler reached past its size check."""
    reached: list[str] = []
    Body.reads = reached

    def spy(what: str, real: Callable[..., Any] | None = None) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            reached.append(what)
            if real is None:
                raise rt.ConfigurationError("spied: the test stops here")
            return real(*args, **kwargs)

        return called

    monkeypatch.setattr(rt, "current", spy("runtime"))
    monkeypatch.setattr(http.bounded, "loads", spy("json", http.bounded.loads))
    monkeypatch.setattr(http.base64, "b64decode", spy("base64", base64.b64decode))
    monkeypatch.setattr(http, "json_object", spy("json object", http.json_object))
    ingress = importlib.import_module("gpufarm.handlers.slack_ingress")
    monkeypatch.setattr(ingress, "_form", spy("form", ingress._form))
    yield reached


def _event(module: str, body: str, *, encoded: bool = False) -> dict[str, Any]:
    method = METHODS.get(module, "POST")
    path = "/profiles/ir-1/run-1" if module == "profile_pages" else "/"
    return {
        "version": "2.0",
        "rawPath": path,
        "headers": {"content-type": "application/x-www-form-urlencoded"},
        "queryStringParameters": {"expires": "1", "sig": "0" * 64},
        "requestContext": {"http": {"method": method, "path": path}},
        "body": Body(body),
        "isBase64Encoded": encoded,
    }


def _handle(module: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    handle: Callable[[dict[str, Any]], dict[str, Any]] = importlib.import_module(f"gpufarm.handlers.{module}").handle
    return handle


@pytest.mark.parametrize("name", PUBLIC)
@pytest.mark.parametrize("encoded", [False, True], ids=["text", "base64"])
def test_a_huge_body_is_refused_before_any_parsing(name: str, encoded: bool, spies: list[str]) -> None:
    module = _module(name)
    body = base64.b64encode(b"a" * HUGE).decode() if encoded else "a" * HUGE
    answer = _handle(module)(_event(module, body, encoded=encoded))
    assert (answer["statusCode"], answer["body"]) == (413, '{"error":"body too large"}')
    assert spies == []


LIMITS = {
    "slack_ingress": http.SLACK_MAX_BODY_BYTES,
    "incident_webhook": http.WEBHOOK_MAX_BODY_BYTES,
    "idle_alert": http.WEBHOOK_MAX_BODY_BYTES,
    "profile_pages": 0,
    "profile_upload": importlib.import_module("gpufarm.handlers.profile_upload").MAX_BODY_BYTES,
}


def _of_length(module: str, size: int) -> str:
    """A body of `size` bytes each handler's next step can read (a form field, a JSON object or nothing)."""
    if module == "slack_ingress":
        return "a=" + "b" * (size - 2)
    if module == "profile_pages":
        return "x" * size
    return '{"a":"' + "b" * (size - 8) + '"}'


def test_every_public_handler_has_its_bound_listed() -> None:
    assert {_module(name) for name in PUBLIC} == set(LIMITS)


@pytest.mark.parametrize("name", PUBLIC)
@pytest.mark.parametrize("encoded", [False, True], ids=["text", "base64"])
def test_a_body_at_the_bound_goes_on_and_a_longer_one_does_not(name: str, encoded: bool, spies: list[str]) -> None:
    module, limit = _module(name), LIMITS[_module(name)]
    handle = _handle(module)

    def event(size: int) -> dict[str, Any]:
        body = _of_length(module, size)
        return _event(module, base64.b64encode(body.encode()).decode() if encoded else body, encoded=encoded)

    # Base64 text comes in groups of 4 characters for 3 bytes, so its length alone rules out a whole group more.
    answer = handle(event(limit + (3 if encoded else 1)))
    assert (answer["statusCode"], spies) == (413, [])
    # At the bound the handler reads on, up to its configuration (spied: 500 "not configured").
    answer = handle(event(limit))
    assert answer["statusCode"] == 500 and "runtime" in spies


# --- The profile pages' CSP -------------------------------------------------------------------------------------


def _directives(policy: str) -> dict[str, list[str]]:
    parts = (p.split() for p in policy.split(";") if p.strip())
    return {words[0]: words[1:] for words in parts}


class Clock:
    """A fixed now, inside the signed link's life."""

    def now(self) -> datetime:
        return datetime.fromtimestamp(NOW, UTC)


NOW = 1_796_000_000
BUCKET = "gpufarm-security-pages"
KEY = "ir-1/run-1-20261201t150000z"
SECRET = "security-pages-secret"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The profile pages function's answer to a signed link, its page stored in (mocked) S3."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUFARM_PROFILE_BUCKET": BUCKET,
        "GPUFARM_PROFILE_LINK_SECRET": SECRET,
    }.items():
        monkeypatch.setenv(key, value)
    pages = importlib.import_module("gpufarm.handlers.profile_pages")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        trace = tmp_path / "t.json.gz"
        shutil.copy(REPO / "tests" / "fixtures" / "profiler" / "cpu_mlp.json.gz", trace)
        figures = analyse(reader.events(REPO / "tests" / "fixtures" / "profiler" / "cpu_mlp.json"))
        data = summary.of(figures, ir=1, run="run-1", uploaded="2026-12-01 15:00:00Z", trace_name="cpu_mlp.json")
        S3ProfileStore(Settings(), BUCKET, client=s3).put_run(KEY, trace, data.to_json())
        rt.override(clock=Clock())
        try:
            expires = NOW + 60
            sig = LinkSigner(SECRET.encode()).signature(KEY, expires)
            event = {
                **_event("profile_pages", ""),
                "rawPath": f"/profiles/{KEY}",
                "queryStringParameters": {"expires": str(expires), "sig": sig},
                "body": None,
            }
            yield pages.handle(event)
        finally:
            rt.reset()


def _directives(policy: str) -> dict[str, list[str]]:
    parts = (p.split() for p in policy.split(";") if p.strip())
    return {words[0]: words[1:] for words in parts}


def test_a_served_page_forbids_forms_and_base_and_is_framed_by_datadog_only(served: dict[str, Any]) -> None:
    # The page is gpufarm's own (tests/security/test_stored_pages.py): the CSP holds even if a form got in.
    assert served["statusCode"] == 200 and "IR-1 · run-1" in served["body"]
    csp = _directives(served["headers"]["Content-Security-Policy"])
    # form-action and base-uri do not fall back to default-src: each must be set.
    assert csp["form-action"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert csp["default-src"] == ["'none'"]
    assert not {"script-src", "connect-src", "frame-src", "object-src"} & set(csp)  # all fall back to 'none'
    assert csp["frame-ancestors"] == [
        "https://*.datadoghq.com",
        "https://*.datadoghq.eu",
        "https://*.ddog-gov.com",
        "'self'",
    ]
