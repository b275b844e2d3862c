"""A source the sync skipped is one Datadog event per source per sync: title, source, error class, never the
message (which the source wrote, and may carry anything), grouped by an aggregation key; and the sync posts them."""

from __future__ import annotations

import logging

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.inventory.source_events import error_class, post_source_events, source_events
from gpufarm.core.inventory.sources import merge
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import Event, SourceError, SourceReading
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync.run import sync

NOW = 1_800_000_000
SECRET = "sig=c2VjcmV0LXNhcy10b2tlbg"  # what a cloud's error text might hold: never in an event


class Events:
    """An EventSink that keeps what it is given (or fails)."""

    def __init__(self, fail: bool = False) -> None:
        self.posted: list[Event] = []
        self.fail = fail

    def post_event(self, event: Event) -> None:
        if self.fail:
            raise UpstreamError("post event: HTTP 503")
        self.posted.append(event)


def errors_ledger(*readings: SourceReading):  # type: ignore[no-untyped-def]
    return merge([], list(readings), now=float(NOW), down_after_minutes=None)


AWS = SourceReading(
    "aws",
    errors=(
        SourceError(
            "aws", "us-east-1", f"describe_instances: RequestLimitExceeded: slow down {SECRET}", throttled=True
        ),
        SourceError("aws", "us-west-2", "describe_instances: RequestLimitExceeded: slow down", throttled=True),
    ),
    calls=4,
)
AZURE = SourceReading(
    "azure", errors=(SourceError("azure", "sub/eastus", f"usage.list: HttpResponseError 403: denied {SECRET}"),)
)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("describe_instances: RequestLimitExceeded: Request limit exceeded.", "RequestLimitExceeded"),
        ("virtual_machines.list_all: HttpResponseError 429: Too many requests", "HttpResponseError 429"),
        # a source that raised (gpufarm.core.inventory.sources.read_all)
        ("ClientError: An error occurred", "ClientError"),
        ("query: UpstreamError: query metrics: HTTP 503", "UpstreamError"),
        ("no answer within 45 s", "Timeout"),
        ("something odd happened", "Error"),
    ],
)
def test_the_error_class_is_read_from_the_messages_leading_parts(message: str, kind: str) -> None:
    assert error_class(SourceError("x", "*", message)) == kind


def test_one_event_per_failing_source_with_its_parts_and_classes_and_no_message_text() -> None:
    ok = SourceReading("static", calls=0)
    events = source_events(errors_ledger(AWS, AZURE, ok), NOW)
    assert [e.title for e in events] == [
        "gpufarm inventory source aws skipped: RequestLimitExceeded",
        "gpufarm inventory source azure skipped: HttpResponseError 403",
    ]
    aws, azure = events
    assert aws.aggregation_key == "gpufarm-inventory-source-aws" and aws.alert_type == "warning"  # throttled
    assert azure.alert_type == "error"
    assert set(aws.tags) == {"gpufarm:inventory", "source:aws", "error_class:requestlimitexceeded"}
    assert "- us-east-1: RequestLimitExceeded (throttled)" in aws.text and "- us-west-2:" in aws.text
    assert "nothing was marked down or untagged" in aws.text
    assert aws.date_happened == NOW
    assert all(SECRET not in e.text and SECRET not in e.title and "slow down" not in e.text for e in events)


def test_a_source_failing_in_many_places_is_still_one_bounded_event() -> None:
    many = SourceReading("aws", errors=tuple(SourceError("aws", f"r-{i}", "x: Throttling: y") for i in range(500)))
    [event] = source_events(errors_ledger(many), NOW)
    assert event.text.count("\n- r-") == 20 and "and 480 more" in event.text and len(event.text) <= 4000


def test_no_failure_no_event_and_a_failed_post_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    sink = Events()
    assert post_source_events(sink, errors_ledger(SourceReading("aws", calls=3)), NOW) == 0
    assert sink.posted == []
    assert post_source_events(None, errors_ledger(AWS), NOW) == 0
    with caplog.at_level(logging.WARNING, logger="gpufarm.core.inventory.sources"):
        assert post_source_events(Events(fail=True), errors_ledger(AWS, AZURE), NOW) == 0
    assert caplog.text.count("inventory source event not posted") == 2


class Failing:
    name = "aws"

    def read(self) -> SourceReading:
        return SourceReading("aws", errors=(SourceError("aws", "us-east-1", "x: Throttling: y", throttled=True),))


def test_the_sync_posts_one_event_per_failing_source_each_sync() -> None:
    clock = FakeClock()
    sink = Events()
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=FakeHosts(),
        chat=FakeChat(operators=frozenset()),
        clock=clock,
        farm=parse_farm(FARM_YAML),
        metrics=FakeMetrics(),
        sources=(Failing(),),
        events=sink,
    )
    sync(svc.context)
    sync(svc.context)
    assert [e.aggregation_key for e in sink.posted] == ["gpufarm-inventory-source-aws"] * 2
    assert sink.posted[0].date_happened == int(clock.now().timestamp())
