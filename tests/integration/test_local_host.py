"""The local function host over loopback: Function URLs, async invokes, FIFO queues and schedules.

Runs tests/fixtures/functions/template.yaml (tiny fixture handlers) so the host is tested without the real
functions; the events it builds are checked against Powertools' own models of the real Lambda events.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel, LambdaFunctionUrlModel, SqsModel
from click.testing import CliRunner

from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.handlers import runtime
from gpufarm_sandbox import load
from gpufarm_sandbox.demo.runner import run_demo
from gpufarm_sandbox.localhost import LocalEnv, seams, start_local
from gpufarm_sandbox.localhost.cli import describe, local, run_local
from gpufarm_sandbox.localhost.env import LOCAL_UPLOAD_TOKEN_SECRET, LOCAL_WEBHOOK_SECRET
from gpufarm_sandbox.localhost.host import FunctionTimeout

pytestmark = pytest.mark.integration

FUNCTIONS = Path(__file__).resolve().parent.parent / "fixtures" / "functions"
TEMPLATE = FUNCTIONS / "template.yaml"
REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def env() -> Iterator[LocalEnv]:
    with start_local(port=0, template=TEMPLATE) as running:
        yield running


@pytest.fixture
def local_env(env: LocalEnv) -> LocalEnv:
    """The module's environment with the fixture functions' records and the sandbox cleared."""
    assert env.host.drain(10)
    env.sandbox.reset()
    for name in ("EchoFunction", "WorkerFunction", "ConsumerFunction", "TickerFunction"):
        module = env.host.module(name)
        module.SEEN.clear()
        getattr(module, "OVERLAPS", []).clear()
    return env


def http(
    method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def post_json(url: str, body: Any) -> tuple[int, Any]:
    status, data, _ = http("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return status, json.loads(data) if data else None


def state(env: LocalEnv) -> dict[str, Any]:
    status, data, _ = http("GET", f"{env.url}/_local/state")
    assert status == 200
    return dict(json.loads(data))


# -- Function URLs -------------------------------------------------------------------------------------------------


def test_function_url_event_is_a_real_payload_2_event(local_env: LocalEnv) -> None:
    status, data, _ = http(
        "POST",
        f"{local_env.url}/fn/echo/some/path?a=1&a=2&b=x",
        json.dumps({"hello": "world"}).encode(),
        {"Content-Type": "application/json", "Cookie": "c1=v1; c2=v2", "X-Custom": "Yes", "User-Agent": "tester"},
    )
    assert status == 200
    answer = json.loads(data)
    event, ctx = answer["event"], answer["context"]
    LambdaFunctionUrlModel.model_validate(event)
    assert (event["version"], event["routeKey"], event["rawPath"]) == ("2.0", "$default", "/some/path")
    assert event["rawQueryString"] == "a=1&a=2&b=x"
    assert event["queryStringParameters"] == {"a": "1,2", "b": "x"}
    assert event["cookies"] == ["c1=v1", "c2=v2"] and "cookie" not in event["headers"]
    assert event["headers"]["x-custom"] == "Yes" and all(k == k.lower() for k in event["headers"])
    http_ctx = event["requestContext"]["http"]
    assert http_ctx == {
        "method": "POST",
        "path": "/some/path",
        "protocol": "HTTP/1.1",
        "sourceIp": "127.0.0.1",
        "userAgent": "tester",
    }
    assert event["requestContext"]["accountId"] == "anonymous"
    assert abs(event["requestContext"]["timeEpoch"] / 1000 - local_env.sandbox.clock.now()) < 60
    assert (event["body"], event["isBase64Encoded"]) == ('{"hello": "world"}', False)
    assert ctx["function_name"] == "EchoFunction" and ctx["memory_limit_in_mb"] == 256
    assert ctx["invoked_function_arn"].endswith(":function:EchoFunction")
    assert 0 < ctx["remaining_ms"] <= 1000


def test_function_url_bodies_text_or_base64(local_env: LocalEnv) -> None:
    http("POST", f"{local_env.url}/fn/echo/", b"a=1&b=two+words", {"Content-Type": "application/x-www-form-urlencoded"})
    http("POST", f"{local_env.url}/fn/echo/", b"\x00\x01\xfe", {"Content-Type": "application/octet-stream"})
    http("GET", f"{local_env.url}/fn/echo/")
    form, binary, empty = local_env.host.module("EchoFunction").SEEN
    assert (form["body"], form["isBase64Encoded"]) == ("a=1&b=two+words", False)
    assert (binary["body"], binary["isBase64Encoded"]) == ("AAH+", True)
    assert "body" not in empty and empty["isBase64Encoded"] is False and empty["rawPath"] == "/"


def test_function_url_results_map_to_http(local_env: LocalEnv) -> None:
    status, data, headers = http("GET", f"{local_env.url}/fn/echo/cookie")
    assert (status, data, headers["X-Echo"]) == (201, b"{}", "1")
    assert headers.get_all("Set-Cookie") == ["a=1", "b=2; Path=/"]
    assert headers["Content-Type"] == "application/json"
    assert http("GET", f"{local_env.url}/fn/echo/raw")[:2] == (200, b'{"plain": true}')
    assert http("GET", f"{local_env.url}/fn/echo/text")[:2] == (200, b"hello")
    status, data, headers = http("GET", f"{local_env.url}/fn/echo/binary")
    assert (status, data, headers["Content-Type"]) == (200, b"\x00\x01\xff", "application/octet-stream")
    assert http("GET", f"{local_env.url}/fn/echo/bad")[0] == 502


def test_handler_errors_are_502_and_logged_and_the_host_keeps_serving(
    local_env: LocalEnv, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="gpufarm_sandbox.localhost"):
        status, data, _ = http("GET", f"{local_env.url}/fn/echo/boom")
    assert (status, json.loads(data)) == (502, {"Message": "Internal Server Error"})
    assert "boom on purpose" in caplog.text and "Traceback" in caplog.text
    assert http("GET", f"{local_env.url}/fn/echo/raw")[0] == 200
    last = state(local_env)["invocations"][-2]
    assert (last["function"], last["trigger"], last["status"]) == ("EchoFunction", "url", "error")
    assert last["error"] == "RuntimeError: boom on purpose"


def test_unknown_broken_and_missing_functions(local_env: LocalEnv) -> None:
    assert http("GET", f"{local_env.url}/fn/nope/")[0] == 403
    assert http("GET", f"{local_env.url}/fn/worker/")[0] == 403  # no FunctionUrlConfig
    assert http("GET", f"{local_env.url}/fn/broken/")[0] == 502
    assert http("GET", f"{local_env.url}/fn/missing/")[0] == 502
    functions = {f["name"]: f for f in state(local_env)["functions"]}
    assert "cannot be imported on purpose" in functions["BrokenFunction"]["load_error"]
    assert functions["MissingFunction"]["present"] is False
    assert functions["EchoFunction"]["url"] == f"{local_env.url}/fn/echo/"


def test_slow_handlers_time_out_like_lambda(local_env: LocalEnv) -> None:
    assert http("GET", f"{local_env.url}/fn/echo/slow")[0] == 502
    with pytest.raises(FunctionTimeout):
        local_env.host.invoke("EchoFunction", {"rawPath": "/slow"})
    assert state(local_env)["invocations"][-1]["status"] == "timeout"


def test_direct_invoke(local_env: LocalEnv) -> None:
    assert local_env.host.invoke("EchoFunction", {"rawPath": "/raw"}) == {"plain": True}
    assert local_env.host.invoke("echo", {"rawPath": "/text"}) == "hello"
    with pytest.raises(RuntimeError, match="boom on purpose"):
        local_env.host.invoke("EchoFunction", {"rawPath": "/boom"})
    with pytest.raises(KeyError):
        local_env.host.invoke("NoSuchFunction", {})


# -- environment ---------------------------------------------------------------------------------------------------


def test_template_variables_resolve_to_local_values(local_env: LocalEnv) -> None:
    resolved = local_env.host.invoke("EchoFunction", {"rawPath": "/env"})
    assert resolved == {
        "FIXTURE_GREETING": "hello",
        "FIXTURE_WORKER": "WorkerFunction",
        "FIXTURE_WORKER_ARN": "arn:aws:lambda:us-east-1:123456789012:function:WorkerFunction",
        "FIXTURE_QUEUE_URL": f"{local_env.url}/_local/queues/WorkQueue",
        "FIXTURE_QUEUE_NAME": "gpufarm-local-work.fifo",
        "FIXTURE_SELF_URL": f"{local_env.url}/fn/echo/",
        "FIXTURE_SUB": "us-east-1:hello:${Literal}",
        "FIXTURE_IF": "greeted",
        "FIXTURE_JOIN": "a-hello",
        "FIXTURE_NOVALUE": None,
        "GPUFARM_SECRETS_NAME": None,  # locally secrets come from the sandbox, never Secrets Manager
    }
    assert os.environ["GPUFARM_DATADOG_HOST"] == local_env.url
    assert os.environ["GPUFARM_SLACK_API_URL"] == f"{local_env.url}/slack/api/"
    assert os.environ["SLACK_SIGNING_SECRET"] == local_env.sandbox.slack_signing_secret
    assert os.environ["GPUFARM_LOCAL_INVOKE_URL"] == f"{local_env.url}/_local/invoke"
    assert os.environ["GPUFARM_INCIDENT_WEBHOOK_URL"] == f"{local_env.url}/fn/incident_webhook/"
    assert os.environ["GPUFARM_WEBHOOK_SECRET"] == LOCAL_WEBHOOK_SECRET
    # `/gpu profile-token` signs with it in the worker the local host runs.
    assert os.environ["GPUFARM_UPLOAD_TOKEN_SECRET"] == LOCAL_UPLOAD_TOKEN_SECRET
    assert local_env.env["DD_API_KEY"] in local_env.sandbox.dd_api_keys


def test_environment_is_restored_after_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_SECRETS_NAME", "kept/outside")
    monkeypatch.delenv("FIXTURE_GREETING", raising=False)
    outer = dict(os.environ)
    with start_local(port=0, template=TEMPLATE, parameters={"Greeting": "hi"}) as running:
        assert os.environ["FIXTURE_GREETING"] == "hi" and "GPUFARM_SECRETS_NAME" not in os.environ
        assert running.host.invoke("EchoFunction", {"rawPath": "/env"})["FIXTURE_IF"] == "silent"
    assert dict(os.environ) == outer


# -- async invokes -------------------------------------------------------------------------------------------------


def test_async_invoke_runs_the_worker_which_reaches_the_sandbox(local_env: LocalEnv) -> None:
    status, _ = post_json(f"{local_env.url}/_local/invoke/WorkerFunction", {"n": 1})
    assert status == 202
    runtime.current().invoker().invoke("WorkerFunction", {"n": 2})  # the runtime's invoker, seamed by the host
    assert local_env.host.drain(10)
    worker = local_env.host.module("WorkerFunction")
    assert sorted(e["n"] for e in worker.SEEN) == [1, 2]
    texts = sorted(m.text for m in local_env.sandbox.slack.state.find_messages(channel="C0000000001"))
    assert texts == ["worker got 1", "worker got 2"]
    triggers = [i["trigger"] for i in state(local_env)["invocations"] if i["function"] == "WorkerFunction"]
    assert triggers[-2:] == ["async", "async"]


def test_failed_async_invoke_is_retried_then_dead_lettered(local_env: LocalEnv) -> None:
    assert post_json(f"{local_env.url}/_local/invoke/WorkerFunction", {"fail": True, "n": 9})[0] == 202
    assert local_env.host.drain(10)
    assert len(local_env.host.module("WorkerFunction").SEEN) == 2  # MaximumRetryAttempts: 1
    dead = state(local_env)["dead_letters"][-1]
    assert (dead["source"], dead["target"]) == ("async", "WorkerFunction")
    assert json.loads(dead["payload"]) == {"fail": True, "n": 9}


def test_hand_offs_inside_the_process_skip_http_but_not_the_checks(
    local_env: LocalEnv, caplog: pytest.LogCaptureFixture
) -> None:
    url = local_env.url
    invoker, queue = seams.HostInvoker(f"{url}/_local/invoke"), seams.HostQueue(f"{url}/_local/queues/WorkQueue")
    clock = seams.SandboxClock(f"{url}/_sandbox/clock")
    local_env.sandbox.clock.advance(3600)
    caplog.set_level(logging.DEBUG, logger="gpufarm_sandbox.emulator.http")  # one line per HTTP request served
    assert abs(clock.epoch() - local_env.sandbox.clock.now()) < 1
    invoker.invoke("WorkerFunction", {"n": 5})
    queue.send({"i": 1}, group="g", dedup_id="d-1")
    assert local_env.host.drain(10)
    assert [e["n"] for e in local_env.host.module("WorkerFunction").SEEN] == [5]
    assert [s["body"] for s in local_env.host.module("ConsumerFunction").SEEN] == [{"i": 1}]
    with pytest.raises(UpstreamError, match="answered 404, expected 202"):
        invoker.invoke("NoSuchFunction", {})
    with pytest.raises(UpstreamError, match="answered 400, expected 200"):
        seams.HostQueue(f"{url}/_local/queues/NoSuchQueue").send({}, group="g", dedup_id="d")
    served = [r.getMessage() for r in caplog.records if r.name == "gpufarm_sandbox.emulator.http"]
    assert served and not [line for line in served if "/_local/" in line or "/_sandbox/clock" in line]


def test_a_closed_host_takes_no_hand_off_in_process() -> None:
    with start_local(port=0, template=TEMPLATE) as running:
        invoker = seams.HostInvoker(running.host.urls.invoke)
        assert seams.in_process(running.host.urls.invoke, seams.INVOKE_PATH) == (running.host, "")
        running.host.close()
        assert seams.in_process(running.host.urls.invoke, seams.INVOKE_PATH) is None
        with pytest.raises(UpstreamError, match="answered 503"):
            invoker.invoke("WorkerFunction", {"n": 6})  # over HTTP now, where the closed host refuses it


def test_invoke_endpoint_validates(local_env: LocalEnv) -> None:
    status, body = post_json(f"{local_env.url}/_local/invoke/NoSuchFunction", {})
    assert status == 404 and "Function not found" in body["message"]
    status, _, headers = http("POST", f"{local_env.url}/_local/invoke/WorkerFunction", b"{nope")
    assert status == 400 and headers["x-amzn-ErrorType"] == "InvalidRequestContentException"
    status, _, _ = http("POST", f"{local_env.url}/_local/invoke/WorkerFunction", b"x" * (256 * 1024 + 1))
    assert status == 413
    assert local_env.host.drain(5)
    assert local_env.host.module("WorkerFunction").SEEN == []


# -- queues ----------------------------------------------------------------------------------------------------------


def test_fifo_groups_are_ordered_one_at_a_time(local_env: LocalEnv) -> None:
    queue = seams.HostQueue(os.environ["FIXTURE_QUEUE_URL"])  # what the runtime's queue seam posts through

    def send(group: str) -> None:
        for i in range(5):
            queue.send({"group": group, "i": i, "sleep": 0.01}, group=group, dedup_id=f"{group}-{i}")

    senders = [threading.Thread(target=send, args=(g,)) for g in ("pool-a", "pool-b")]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    assert local_env.host.drain(10)
    consumer = local_env.host.module("ConsumerFunction")
    for group in ("pool-a", "pool-b"):
        assert [s["body"]["i"] for s in consumer.SEEN if s["body"]["group"] == group] == list(range(5))
    assert consumer.OVERLAPS == []
    record = consumer.SEEN[0]["record"]
    SqsModel.model_validate({"Records": [record]})
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == "arn:aws:sqs:us-east-1:123456789012:gpufarm-local-work.fifo"
    assert set(record["attributes"]) >= {
        "MessageGroupId",
        "MessageDeduplicationId",
        "SequenceNumber",
        "ApproximateReceiveCount",
        "SentTimestamp",
    }
    assert state(local_env)["queues"]["WorkQueue"]["depth"] == 0


def test_duplicates_within_five_minutes_are_dropped(local_env: LocalEnv) -> None:
    url = f"{os.environ['FIXTURE_QUEUE_URL']}/messages"
    first = post_json(url, {"body": {"n": 1}, "group": "g", "dedup_id": "same"})
    again = post_json(url, {"body": {"n": 2}, "group": "g", "dedup_id": "same"})
    assert first[0] == again[0] == 200 and first[1]["MessageId"] == again[1]["MessageId"]
    assert local_env.host.drain(10)
    local_env.sandbox.clock.advance(301)
    assert post_json(url, {"body": {"n": 3}, "group": "g", "dedup_id": "same"})[0] == 200
    assert local_env.host.drain(10)
    assert [s["body"]["n"] for s in local_env.host.module("ConsumerFunction").SEEN] == [1, 3]


def test_queue_send_validates_like_sqs(local_env: LocalEnv) -> None:
    url = f"{os.environ['FIXTURE_QUEUE_URL']}/messages"
    status, body = post_json(url, {"body": {"n": 1}, "dedup_id": "x"})
    assert status == 400 and body["__type"].endswith("MissingParameter")
    status, body = post_json(url, {"body": {"n": 1}, "group": "g"})
    assert status == 400 and "ContentBasedDeduplication" in body["message"]
    status, body = post_json(url, {"group": "g", "dedup_id": "x"})
    assert status == 400
    status, body = post_json(f"{local_env.url}/_local/queues/NoQueue/messages", {"body": "x", "group": "g"})
    assert status == 400 and body["__type"].endswith("QueueDoesNotExist")
    assert local_env.host.drain(5)
    assert local_env.host.module("ConsumerFunction").SEEN == []


def test_failed_messages_are_redelivered_in_order_then_dead_lettered(local_env: LocalEnv) -> None:
    host = local_env.host
    host.send("WorkQueue", {"name": "a", "fail_times": 1}, group="g", dedup_id="a")
    host.send("WorkQueue", {"name": "b"}, group="g", dedup_id="b")
    host.send("WorkQueue", {"name": "poison", "fail_times": 9}, group="h", dedup_id="p")
    host.send("WorkQueue", {"name": "raises", "raise": True}, group="i", dedup_id="r")
    assert host.drain(10)
    seen = host.module("ConsumerFunction").SEEN
    in_g = [
        (s["body"]["name"], s["record"]["attributes"]["ApproximateReceiveCount"])
        for s in seen
        if s["record"]["attributes"]["MessageGroupId"] == "g"
    ]
    assert in_g == [("a", "1"), ("a", "2"), ("b", "1")]  # b waits for a: FIFO order within the group
    assert sum(s["body"]["name"] == "poison" for s in seen) == 3  # maxReceiveCount
    assert sum(s["body"]["name"] == "raises" for s in seen) == 3
    dead = [d for d in state(local_env)["dead_letters"] if d["source"] == "sqs:WorkQueue"][-2:]
    assert {json.loads(d["payload"])["name"] for d in dead} == {"poison", "raises"}
    assert {d["target"] for d in dead} == {"WorkDeadLetters"}


# -- schedules -------------------------------------------------------------------------------------------------------


def test_schedules_tick_on_the_sandbox_clock(local_env: LocalEnv) -> None:
    ticker = local_env.host.module("TickerFunction")
    before = {s["name"]: s for s in state(local_env)["schedules"]}
    assert before["EveryFiveMinutes"]["next_tick"] and before["Nightly"]["next_tick"]
    local_env.sandbox.clock.advance(301)
    assert local_env.host.drain(10)
    assert {"job": "tick"} in ticker.SEEN  # ScheduleV2 delivers its Input as-is
    ticker.SEEN.clear()
    local_env.sandbox.clock.advance(86_400)  # a day: each schedule fires once, not once per missed period
    assert local_env.host.drain(10)
    assert ticker.SEEN.count({"job": "tick"}) == 1
    (nightly,) = [e for e in ticker.SEEN if e != {"job": "tick"}]
    EventBridgeModel.model_validate(nightly)
    assert nightly["detail-type"] == "Scheduled Event" and nightly["source"] == "aws.events"
    after = {s["name"]: s for s in state(local_env)["schedules"]}
    assert after["Nightly"]["next_tick"].endswith("T03:00:00Z") and after["Nightly"]["fired"] >= 1


# -- state and lifecycle ---------------------------------------------------------------------------------------------


def test_state_shows_everything_but_secrets(local_env: LocalEnv) -> None:
    current = state(local_env)
    assert {f["name"] for f in current["functions"]} == {
        "EchoFunction",
        "WorkerFunction",
        "ConsumerFunction",
        "TickerFunction",
        "BrokenFunction",
        "MissingFunction",
    }
    queue = current["queues"]["WorkQueue"]
    assert (queue["consumer"], queue["fifo"], queue["url"]) == (
        "ConsumerFunction",
        True,
        f"{local_env.url}/_local/queues/WorkQueue",
    )
    text = json.dumps(current)
    for secret in (local_env.sandbox.slack_signing_secret, LOCAL_WEBHOOK_SECRET, local_env.env["SLACK_BOT_TOKEN"]):
        assert secret not in text


def test_close_stops_accepting_work() -> None:
    with start_local(port=0, template=TEMPLATE) as running:
        host, url = running.host, running.url
        host.close()
        assert post_json(f"{url}/_local/invoke/WorkerFunction", {"n": 1})[0] == 503
        assert http("GET", f"{url}/fn/echo/")[0] == 503
        assert host.state()["closed"] is True


# -- the real template and the CLI -------------------------------------------------------------------------------------


def test_the_real_template_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with start_local(port=0) as running:
        current = running.host.state()
        urls = {f["name"]: f["url"] for f in current["functions"]}
        assert urls == {
            "SlackIngressFunction": f"{running.url}/fn/slack_ingress/",
            "SlackWorkerFunction": None,
            "IncidentWebhookFunction": f"{running.url}/fn/incident_webhook/",
            "IdleAlertFunction": f"{running.url}/fn/idle_alert/",
            "QuotaSyncFunction": None,
            "ProfilePagesFunction": f"{running.url}/fn/profile_pages/",
            "ProfileUploadFunction": f"{running.url}/fn/profile_upload/",
            "DailyDigestFunction": None,
        }
        assert current["queues"]["AllocationQueue"]["consumer"] == "IncidentWebhookFunction"
        assert [(s["function"], s["expression"]) for s in current["schedules"]] == [
            ("QuotaSyncFunction", "rate(15 minutes)"),
            ("QuotaSyncFunction", "rate(1 minute)"),
            ("DailyDigestFunction", "cron(0/15 * * * ? *)"),
        ]
        assert os.environ["GPUFARM_WORKER_FUNCTION"] == "SlackWorkerFunction"
        assert os.environ["GPUFARM_ALLOCATION_QUEUE_URL"] == f"{running.url}/_local/queues/AllocationQueue"
        assert os.environ["GPUFARM_OPERATORS_USERGROUP"] == "S0000000001"
        assert "GPUFARM_FARM_CONFIG_PARAMETER" not in os.environ


def test_slash_commands_from_12_threads_are_all_acked_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
    from gpufarm_sandbox.example_farm import ALICE, BOB, CAROL

    monkeypatch.chdir(REPO)
    with start_local(port=0) as running:
        farm = LocalFarm.ready(running)
        try:
            irs = load.seed_live(farm, 5, requester=ALICE)
            assert farm.settle(30)
            report = load.run_load(farm, load.mixed_commands(100, (ALICE, BOB, CAROL), irs), threads=12)
            dead = list(running.host.dead_letters)
        finally:
            farm.close()
    assert report.errors == [] and report.acked == 100
    assert report.ack(100) < 2000, report.summary()  # generous for a busy CI box: Slack allows 3 s
    assert report.settled and report.worker_failures == [] and report.dead_letters == 0, dead[:2]
    assert sum(len(ms) for ms in report.worker_ms.values()) >= 100  # every command reached the worker
    assert set(report.worker_ms) == {"list", "status", "request"}


def test_run_local_prints_urls_masks_secrets_and_runs_hooks(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []

    def hook(running: LocalEnv) -> Any:
        calls.append(f"start {running.url}")
        return lambda: calls.append("stop")

    run_local("127.0.0.1", 0, template=TEMPLATE, hooks=[hook], wait=lambda stop: calls.append("wait"))
    out = capsys.readouterr().out
    assert "/fn/echo/" in out and "queue WorkQueue" in out and "schedule TickerFunction.Nightly" in out
    assert "export SLACK_SIGNING_SECRET=***" in out and LOCAL_WEBHOOK_SECRET not in out
    assert [c.split()[0] for c in calls] == ["start", "wait", "stop"]


def test_describe_can_show_secrets(env: LocalEnv) -> None:
    lines = "\n".join(describe(env, show_secrets=True))
    assert f"export GPUFARM_WEBHOOK_SECRET={LOCAL_WEBHOOK_SECRET}" in lines


def test_local_and_demo_say_which_datadog_quirks_the_sandbox_plays(env: LocalEnv) -> None:
    assert "datadog quirks: none" in describe(env)
    with start_local(port=0, template=TEMPLATE, quirks="tag-source-User,facets-400") as running:
        assert running.sandbox.quirks == {"tag-source-User", "facets-400"}
        assert "datadog quirks: facets-400, tag-source-User" in describe(running)
    said: list[str] = []
    run_demo(said.append, stages=(), quirks=["no-header-vars"])
    assert "datadog quirks: no-header-vars" in said


def test_gpufarm_local_help_and_bad_template(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(local, ["--help"])
    assert result.exit_code == 0 and "--port" in result.output
    empty = tmp_path / "template.yaml"
    empty.write_text("AWSTemplateFormatVersion: '2010-09-09'\n")
    broken = runner.invoke(local, ["--port", "0", "--template", str(empty)])
    assert broken.exit_code == 1 and "has no Resources" in broken.output and "Traceback" not in broken.output
