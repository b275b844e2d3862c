"""The agent's Datadog side through the real datadog-api-client against the sandbox: series intake (gzip, the
recorded request shape), reading them back by IR, an outage and its recovery, and host registration."""

from __future__ import annotations

import gzip
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from datadog_api_client.v1.api.metrics_api import MetricsApi as MetricsApiV1
from datadog_api_client.v1.model.host_tags import HostTags
from recorded import interactions, key_paths

from gpufarm_node.datadog import DatadogTarget, api_client, tags_api
from gpufarm_node.fakenode import fake_node
from gpufarm_node.registration import HostRegistrar
from gpufarm_node.sender import DatadogSender, Intake, IntakeError, SeriesIntake
from gpufarm_node.series_post import DirectSeriesIntake
from gpufarm_node.topology import load_topology
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.faults import FaultSpec
from gpufarm_sandbox.emulator.server import ServerThread

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "node"


class Recorder:
    """WSGI middleware in front of the session sandbox that keeps the series requests it passes on."""

    def __init__(self, app: Sandbox) -> None:
        self.app = app
        self.requests: list[tuple[dict[str, str], bytes]] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] == "/api/v2/series":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
            self.requests.append((headers, body))
            environ["wsgi.input"] = io.BytesIO(body)
        return self.app(environ, start_response)


@pytest.fixture
def recorder(sandbox: Sandbox) -> Iterator[tuple[Recorder, str]]:
    wrapped = Recorder(sandbox)
    with ServerThread(wrapped, "127.0.0.1", 0) as server:
        yield wrapped, server.url


@pytest.fixture(params=["client", "direct"])
def make_intake(request: pytest.FixtureRequest) -> Any:
    """Each test of the push runs on the client's path (SeriesIntake) and on the agent's own connection, which hands
    every failure to the client's path (DirectSeriesIntake)."""

    def make(client: Any, encoding: str | None = None) -> Intake:
        if request.param == "direct":
            return DirectSeriesIntake.from_client(client, encoding)
        return SeriesIntake(client, encoding)

    return make


def _client(url: str, *, retries: int = 0) -> Any:
    return api_client(DatadogTarget(url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY), max_retries=retries)


def _node(tmp_path: Path, sender: DatadogSender, clock: Any, **kwargs: Any) -> Any:
    node = fake_node(
        load_topology(FIXTURES / "tiny.yaml", seed="contract"),
        tmp_path,
        sender,
        hostname="gpu-contract-01",
        environment="onprem-hpc",
        cluster="hpc-a",
        clock=clock,
        **kwargs,
    )
    node.agent.start()
    return node


def test_series_go_zstd1_in_the_recorded_v2_shape_and_read_back_by_ir(
    sandbox: Sandbox, recorder: tuple[Recorder, str], tmp_path: Path, make_intake: Any
) -> None:
    rec, url = recorder
    client = _client(url)
    node = _node(
        tmp_path, DatadogSender(make_intake(client), "gpu-contract-01", clock=sandbox.clock.now), sandbox.clock.now
    )
    for _ in range(3):
        report = node.agent.cycle()
        assert report.flushed is True
        sandbox.clock.advance(15)
    node.agent.close()

    assert len(rec.requests) == 3
    headers, raw = rec.requests[0]
    assert headers["Content-Encoding"] == "zstd1" and headers["Dd-Api-Key"] == DEFAULT_DD_API_KEY
    payload = json.loads(zstandard.ZstdDecompressor().decompress(raw))
    (recorded,) = interactions("v2-metrics.json", 'Submit metrics returns "Payload accepted" response')
    # Our series use the recorded request's fields plus the documented optional tags, unit and interval.
    extra = key_paths(payload) - key_paths(recorded["request"]["body"]["value"])
    assert extra <= {"series[].tags", "series[].unit", "series[].interval"}

    now = sandbox.clock.now()
    v1 = MetricsApiV1(client)
    answer = v1.query_metrics(_from=int(now - 300), to=int(now), query="avg:gpufarm.gpu.utilization{*} by {gpu_ir}")
    groups = {tuple(s.tag_set): s for s in answer.series}
    assert set(groups) == {("gpu_ir:ir-70",), ("gpu_ir:none",)}
    assert groups[("gpu_ir:ir-70",)].pointlist[-1].value[1] > 50
    assert groups[("gpu_ir:none",)].pointlist[-1].value[1] == 0
    by_host = v1.query_metrics(_from=int(now - 300), to=int(now), query="sum:gpufarm.ir.gpus{ir:ir-70} by {host}")
    assert [tuple(s.tag_set) for s in by_host.series] == [("host:gpu-contract-01",)]


def test_an_outage_is_buffered_and_delivered_once_the_api_is_back(
    sandbox: Sandbox, sandbox_url: str, tmp_path: Path, make_intake: Any
) -> None:
    sender = DatadogSender(make_intake(_client(sandbox_url)), "gpu-contract-01", clock=sandbox.clock.now)
    node = _node(tmp_path, sender, sandbox.clock.now)
    sandbox.faults.configure(FaultSpec(rate=1.0, statuses=[503], paths="^/api/v2/series"))
    for _ in range(2):
        assert node.agent.cycle().flushed is False
        sandbox.clock.advance(15)
    assert sender.buffered > 0 and "gpufarm.gpu.utilization" not in sandbox.metrics.metric_names()
    sandbox.faults.clear()
    assert node.agent.cycle().flushed is True and sender.buffered == 0
    now = sandbox.clock.now()
    (group,) = sandbox.metrics.query_series("sum:gpufarm.node.gpus{host:gpu-contract-01}", now - 300, now, 15)
    assert [v for _, v in group.points] == [2.0, 2.0, 2.0]  # all three cycles arrived, in order
    node.agent.close()


def test_registration_appends_then_replaces_stale_values_keeping_allocation_tags(
    sandbox: Sandbox, sandbox_url: str
) -> None:
    client = _client(sandbox_url)
    tags = tags_api(client)
    registrar = HostRegistrar(tags, "gpu-contract-02", "onprem-hpc", "hpc-a", clock=time.monotonic)
    assert registrar.refresh("H200", 8) is True
    expected = {"gpufarm:managed", "gpu_model:h200", "gpu_count:8", "environment:onprem-hpc", "cluster:hpc-a"}
    assert set(sandbox.hosts.tags_for("gpu-contract-02")) >= expected
    # The allocator tags the host, then the node loses a GPU: only the count changes.
    tags.create_host_tags(
        host_name="gpu-contract-02", body=HostTags(host="gpu-contract-02", tags=["ir:ir-31", "team:nlp"])
    )
    assert registrar.refresh("H200", 7) is True
    user = set(tags.get_host_tags(host_name="gpu-contract-02", source="user").tags)
    assert user == (expected - {"gpu_count:8"}) | {"gpu_count:7", "ir:ir-31", "team:nlp"}
    assert registrar.host_ir() == "ir-31"


def test_series_intake_uses_the_client_s_host_auth_header_timeouts_and_encoding() -> None:
    client = api_client(DatadogTarget("http://127.0.0.1:9", "the-key", None), connect_timeout=2, read_timeout=7)
    intake = SeriesIntake(client)
    assert intake.url == "http://127.0.0.1:9/api/v2/series"
    assert intake._headers["DD-API-KEY"] == "the-key" and intake._headers["Content-Encoding"] == "zstd1"
    assert SeriesIntake(client, "gzip")._headers["Content-Encoding"] == "gzip"
    assert (intake._timeout.connect_timeout, intake._timeout.read_timeout) == (2, 7)
    client.close()


def test_a_rejected_payload_is_dropped_and_counted(sandbox: Sandbox, sandbox_url: str, make_intake: Any) -> None:
    intake = make_intake(_client(sandbox_url), "gzip")
    with pytest.raises(IntakeError) as raised:
        intake.post(gzip.compress(b'{"series": "not a list"}'))
    assert raised.value.status == 400 and raised.value.retry is False and "series" in raised.value.reason
    bad_key = make_intake(api_client(DatadogTarget(sandbox_url, "wrong-key", None), max_retries=0), "gzip")
    with pytest.raises(IntakeError) as raised:
        bad_key.post(gzip.compress(b'{"series": []}'))
    assert raised.value.status == 403 and raised.value.retry is True
