"""The worker, incident webhook, idle alert and quota sync handlers over in-memory ports (no sockets)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeMonitorStates, FakeQueue

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.hosts import SQUATTER_MONITOR_TAG
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases import probe
from gpufarm.handlers import idle_alert, incident_webhook, quota_sync, runtime, slack_worker

EVENTS = Path(__file__).resolve().parents[2] / "events"
SECRET = "test-webhook-secret-0000"
OPS = "U0000000OPS"
RESPONSE_URL = "https://hooks.slack.com/commands/T0000000001/1111111111111/FAKEfakeFAKEfakeFAKEfake"


def event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return data


class Parts:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.incidents = FakeIncidents(self.clock)
        self.hosts = FakeHosts()
        for i in (1, 2):
            self.hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
        self.chat = FakeChat(operators=frozenset({OPS}))
        self.metrics = FakeMetrics()
        self.queue = FakeQueue()
        self.monitors = FakeMonitorStates()

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.get_by_ir(ir))


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_OPERATORS_USERGROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    p = Parts()
    runtime.reset()
    runtime.override(
        clock=p.clock,
        incidents=p.incidents,
        hosts=p.hosts,
        metrics=p.metrics,
        chat=p.chat,
        farm=parse_farm(FARM_YAML),
        queue=p.queue,
        monitor_states=p.monitors,
    )
    yield p
    runtime.reset()


def job(kind: str, user: str = "U0000000001", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "user": user, "channel": "C0000000002", "response_url": RESPONSE_URL, **extra}


def request_job(count: int = 8, user: str = "U0000000001", rid: str = "slack-cmd-00000001") -> dict[str, Any]:
    request = {
        "team": "nlp",
        "project": "llm-ko",
        "gpu_model": "H100",
        "gpu_count": count,
        "environment": "hpc",
        "duration_days": 7,
        "purpose": "",
        "requester": user,
        "channel": "C0000000002",
        "request_id": rid,
    }
    return job("request", user=user, request=request)


def run_commands(parts: Parts) -> list[str]:
    """Be the queue consumer for every incident command queued so far (in order), as the FIFO group would."""
    done: list[str] = []
    while commands := [(g, b) for g, b in parts.queue.sent if "command" in b]:
        parts.queue.sent = [(g, b) for g, b in parts.queue.sent if "command" not in b]
        for _, body in commands:
            assert incident_webhook.handle(_sqs(body)) == {"batchItemFailures": []}
            done.append(body["command"]["op"])
    return done


def requested(parts: Parts, **kwargs: Any) -> dict[str, Any]:
    """The worker creates the request's incident; the consumer runs its queued policy decision."""
    result = slack_worker.handle(request_job(**kwargs))
    run_commands(parts)
    return result


# -- worker ---------------------------------------------------------------------------------------------------------


def test_worker_creates_the_incident_and_answers_with_the_ir(parts: Parts) -> None:
    result = slack_worker.handle(request_job())
    # Nothing is created outside the pool's queue group: the create (and its decision) waits there.
    assert result == {"ok": True, "kind": "request", "queued": True}
    assert parts.incidents.creates == 0 and parts.chat.to(RESPONSE_URL) == []
    assert [g for g, _ in parts.queue.sent] == ["hpc"]
    assert run_commands(parts) == ["create"]
    assert parts.alloc(1).phase is Phase.APPROVED
    [answer] = parts.chat.to(RESPONSE_URL)
    assert "IR-1" in answer.text


def test_duplicate_worker_invocations_create_one_incident(parts: Parts) -> None:
    requested(parts)
    requested(parts)
    assert parts.incidents.creates == 1


def test_worker_answers_by_dm_without_a_response_url(parts: Parts) -> None:
    payload = request_job()
    del payload["response_url"]
    slack_worker.handle(payload)
    run_commands(parts)
    assert "IR-1" in parts.chat.to("U0000000001", "dm")[-1].text


def test_worker_refuses_a_request_naming_someone_else(parts: Parts) -> None:
    payload = request_job(user="U0000000002")
    payload["user"] = "U0000000001"
    result = slack_worker.handle(payload)
    assert result["ok"] is False and "another requester" in result["text"]
    assert parts.incidents.creates == 0


def test_worker_explains_domain_errors_to_the_user(parts: Parts) -> None:
    result = slack_worker.handle(job("command", command={"verb": "status", "ir": 42}))
    assert result["ok"] is False
    assert "IR-42 does not exist" in parts.chat.to(RESPONSE_URL)[-1].text


def test_worker_answers_again_after_slack_refused_every_retry(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing redelivers a worker invoke: an answer Slack refused through the adapter's retries gets one more round.
    monkeypatch.setattr(slack_worker, "REPLY_PAUSE_S", 0.0)
    respond = parts.chat.respond
    failures = iter([UpstreamError("slack response_url failed: service_unavailable (HTTP 503)")])

    def flaky(url: str, text: str, blocks: Any = None, **kwargs: Any) -> None:
        error = next(failures, None)
        if error is not None:
            raise error
        respond(url, text, blocks, **kwargs)

    monkeypatch.setattr(parts.chat, "respond", flaky)
    slack_worker.handle(job("command", command={"verb": "status", "ir": 42}))
    [answer] = parts.chat.to(RESPONSE_URL)
    assert "IR-42 does not exist" in answer.text


def test_non_operator_clicking_approve_changes_nothing(parts: Parts) -> None:
    requested(parts, count=8)
    requested(parts, count=4, rid="slack-cmd-00000002")
    assert parts.alloc(2).phase is Phase.REQUESTED
    result = slack_worker.handle(job("action", action="gpu_approve", ir=2))
    assert result == {"ok": True, "kind": "action", "queued": True}
    assert run_commands(parts) == ["approve"]
    assert "only GPU operators" in parts.chat.to(RESPONSE_URL)[-1].text
    assert parts.alloc(2).phase is Phase.REQUESTED
    slack_worker.handle(job("action", user=OPS, action="gpu_approve", ir=2))
    run_commands(parts)
    assert parts.alloc(2).phase is Phase.APPROVED


def test_an_action_on_an_unknown_ir_is_answered_at_once(parts: Parts) -> None:
    result = slack_worker.handle(job("command", command={"verb": "release", "ir": 42}))
    assert result["ok"] is False and "IR-42 does not exist" in result["text"]
    assert parts.queue.sent == []


def test_a_retried_delivery_of_one_action_is_queued_once_and_two_clicks_twice(parts: Parts) -> None:
    requested(parts)
    release = job("command", command={"verb": "release", "ir": 1, "confirmed": True})
    slack_worker.handle(release)
    slack_worker.handle(release)  # Slack's retry of the same delivery: same response_url
    other = {**release, "response_url": RESPONSE_URL.replace("FAKE", "EKAF")}
    slack_worker.handle(other)
    assert run_commands(parts) == ["release", "release"]
    answers = [m.text for m in parts.chat.sent if m.target.startswith("https://")]
    assert "being released" in answers[-2] and "has already ended" in answers[-1]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"kind": "request", "user": "bob"},
        {"kind": "nonsense", "user": "U0000000001"},
        {"kind": "command", "user": "U0000000001", "surprise": 1},
    ],
)
def test_malformed_worker_payloads_do_nothing(parts: Parts, payload: dict[str, Any]) -> None:
    assert slack_worker.handle(payload) == {"ok": False, "error": "malformed payload"}
    assert parts.chat.sent == []


def test_malformed_command_or_request_inside_a_valid_job(parts: Parts) -> None:
    assert slack_worker.handle(job("command", command={"verb": "boom"}))["ok"] is False
    assert slack_worker.handle(job("request", request={"team": "nlp"}))["ok"] is False
    assert slack_worker.handle(job("action", action="gpu_explode", ir=1))["ok"] is False
    assert parts.incidents.creates == 0


def test_the_sample_worker_event_runs(parts: Parts) -> None:
    sample = event("slack_worker_request.json")
    sample["request"]["environment"] = "hpc"  # the unit farm's pool name
    assert slack_worker.handle(sample)["ok"] is True


def test_an_upstream_failure_is_explained_and_logged(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(query: str) -> Any:
        raise UpstreamError("datadog search incidents failed: HTTP 503")

    monkeypatch.setattr(parts.incidents, "search", boom)
    result = slack_worker.handle(job("command", command={"verb": "list", "scope": "all"}))
    assert result["ok"] is False and "try again" in result["text"]


# -- incident webhook -----------------------------------------------------------------------------------------------


def _webhook_for(parts: Parts, name: str, ir: int = 1, **fields: str) -> dict[str, Any]:
    """A sample webhook event re-aimed at an incident the fakes hold."""
    sample = event(name)
    body = json.loads(sample["body"])
    body["incident_uuid"] = parts.alloc(ir).incident_id
    body["incident_fields"].update(fields)
    sample["body"] = json.dumps(body)
    return sample


def test_webhook_enqueues_per_pool_with_a_dedup_id(parts: Parts) -> None:
    requested(parts)
    incident_id = parts.alloc(1).incident_id
    answer = incident_webhook.handle(_webhook_for(parts, "incident_webhook_approved.json"))
    assert answer["statusCode"] == 202
    [(group, body)] = parts.queue.sent
    assert group == "hpc"
    assert body == {"incident_id": incident_id, "reason": "active/approved"}
    # A duplicate delivery of the same change has the same dedup id and is dropped by the FIFO queue.
    assert incident_webhook.handle(_webhook_for(parts, "incident_webhook_approved_duplicate.json"))["statusCode"] == 202
    assert len(parts.queue.sent) == 1
    # A new change of the incident is a new message.
    parts.clock.advance(seconds=5)
    parts.incidents.update(incident_id, {f.STATE: "resolved"})
    incident_webhook.handle(_webhook_for(parts, "incident_webhook_resolved.json"))
    assert len(parts.queue.sent) == 2 and parts.queue.sent[1][1]["reason"] == "resolved/approved"


def test_webhook_takes_the_pool_from_the_incident_not_the_body(parts: Parts) -> None:
    requested(parts)
    incident_webhook.handle(_webhook_for(parts, "incident_webhook_approved.json", environment="slices"))
    assert parts.queue.sent[0][0] == "hpc"


def test_webhook_for_an_unknown_incident_is_answered_200_and_changes_nothing(parts: Parts) -> None:
    """Gone, or another type's: nothing for gpufarm to do and nothing for Datadog to retry."""
    answer = incident_webhook.handle(event("incident_webhook_approved.json"))
    assert answer["statusCode"] == 200 and parts.queue.sent == []
    assert json.loads(answer["body"]) == {"ignored": "not a gpufarm allocation"}


def test_webhook_token_is_checked(parts: Parts) -> None:
    answer = incident_webhook.handle(event("incident_webhook_bad_token.json"))
    assert answer["statusCode"] == 401
    missing = event("incident_webhook_approved.json")
    del missing["headers"]["x-gpufarm-token"]
    assert incident_webhook.handle(missing)["statusCode"] == 401
    assert parts.queue.sent == []


def _unsubstituted_header(parts: Parts, *, token: str | None, fields: object) -> dict[str, Any]:
    """The approved webhook as Datadog might send it: the header variable left as its name, the token (if any) in
    the payload, `$INCIDENT_FIELDS` rendered as `fields`."""
    sample = _webhook_for(parts, "incident_webhook_approved.json")
    sample["headers"]["x-gpufarm-token"] = "$GPUFARM_WEBHOOK_SECRET"
    body = json.loads(sample["body"])
    body["incident_fields"] = fields
    if token is not None:
        body["token"] = token
    sample["body"] = json.dumps(body)
    return sample


@pytest.mark.parametrize("fields", [{"phase": "approved"}, json.dumps({"phase": "approved"}), None])
def test_the_payload_token_authenticates_when_the_header_is_not_substituted(parts: Parts, fields: object) -> None:
    requested(parts)
    answer = incident_webhook.handle(_unsubstituted_header(parts, token=SECRET, fields=fields))
    assert answer["statusCode"] == 202 and len(parts.queue.sent) == 1
    assert "token" not in json.dumps(parts.queue.sent[0][1])


def test_neither_a_literal_header_nor_a_wrong_payload_token_authenticates(parts: Parts) -> None:
    requested(parts)
    for token in (None, "wrong-token", "$GPUFARM_WEBHOOK_SECRET"):
        assert incident_webhook.handle(_unsubstituted_header(parts, token=token, fields={}))["statusCode"] == 401
    unreadable = _unsubstituted_header(parts, token=SECRET, fields={})
    unreadable["body"] = "{not json"
    assert incident_webhook.handle(unreadable)["statusCode"] == 401
    assert parts.queue.sent == []


def test_a_probe_s_webhook_says_how_it_arrived_and_only_that_is_written(parts: Parts) -> None:
    created = parts.incidents.create("gpufarm doctor probe", probe.probe_fields("handlercheck", "hpc", "nlp"))
    sample = _unsubstituted_header(parts, token=SECRET, fields=json.dumps({"phase": "rejected"}))
    body = json.loads(sample["body"])
    body["incident_uuid"] = created.id
    sample["body"] = json.dumps(body)
    assert incident_webhook.handle(sample)["statusCode"] == 202
    [(group, message)] = parts.queue.sent
    assert group == "hpc"
    assert message["arrival"] == "token in payload; fields as string; trigger resolved/rejected"
    before = parts.incidents.by_ir(created.public_id)
    assert incident_webhook.process_message(runtime.current(), json.dumps(message)) == [
        f"IR-{created.public_id}: probe noted"
    ]
    after = parts.incidents.by_ir(created.public_id)
    assert probe.webhook_seen(after) == message["arrival"]
    assert {k for k in after.fields if after.fields[k] != before.fields.get(k)} == {f.HISTORY}


@pytest.mark.parametrize(
    "body",
    ["", "not json", "[]", '{"incident_uuid": "not-a-uuid"}', '{"incident_public_id": "1"}'],
)
def test_webhook_malformed_bodies_are_400(parts: Parts, body: str) -> None:
    bad = event("incident_webhook_approved.json")
    bad["body"] = body
    answer = incident_webhook.handle(bad)
    assert answer["statusCode"] == 400 and "error" in json.loads(answer["body"])
    assert parts.queue.sent == []


def test_webhook_without_secret_or_queue_is_a_500(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime.override(queue=None)
    assert incident_webhook.handle(event("incident_webhook_approved.json"))["statusCode"] == 500
    monkeypatch.delenv("GPUFARM_WEBHOOK_SECRET")
    assert incident_webhook.handle(event("incident_webhook_approved.json"))["statusCode"] == 500


def _sqs(body: dict[str, Any]) -> dict[str, Any]:
    sample = event("sqs_allocation_message.json")
    sample["Records"][0]["body"] = json.dumps(body)
    return sample


def test_queue_consumer_allocates_and_reclaims(parts: Parts) -> None:
    requested(parts)
    incident_id = parts.alloc(1).incident_id
    assert incident_webhook.handle(_sqs({"incident_id": incident_id, "reason": "active/approved"})) == {
        "batchItemFailures": []
    }
    assert parts.alloc(1).hosts == ("hpc-1",)
    parts.incidents.update(incident_id, {f.STATE: "resolved"})
    incident_webhook.handle(_sqs({"incident_id": incident_id, "reason": "resolved/allocated"}))
    assert parts.alloc(1).phase is Phase.RECLAIMED and parts.hosts.user("hpc-1") == []


def test_queue_consumer_reports_upstream_failures_for_redelivery(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    requested(parts)
    incident_id = parts.alloc(1).incident_id

    def boom(host: str, tags: Any, source: str = "user") -> list[str]:
        raise UpstreamError("datadog update host tags failed: HTTP 503")

    monkeypatch.setattr(parts.hosts, "replace_tags", boom)
    result = incident_webhook.handle(_sqs({"incident_id": incident_id}))
    assert result == {"batchItemFailures": [{"itemIdentifier": "059f36b4-87a3-44ab-83d2-661975830a7d"}]}
    assert parts.alloc(1).phase is Phase.APPROVED


@pytest.mark.parametrize(
    "body",
    [
        {"incident_id": "3f1b9c2e-8a4d-4c6f-9e2a-1b2c3d4e5f60"},
        {"pool": "hpc", "reason": "sync"},
        {"nonsense": True},
        {"incident_id": "x", "pool": "hpc"},
    ],
)
def test_queue_consumer_drops_what_can_never_succeed(parts: Parts, body: dict[str, Any]) -> None:
    # An unknown incident, a sync with nothing to do, and malformed messages all complete without redelivery.
    assert incident_webhook.handle(_sqs(body)) == {"batchItemFailures": []}


def test_sample_sqs_events_parse(parts: Parts) -> None:
    assert incident_webhook.handle(event("sqs_allocation_message.json")) == {"batchItemFailures": []}
    assert incident_webhook.handle(event("sqs_pool_sync_message.json")) == {"batchItemFailures": []}


# -- idle alert and sync --------------------------------------------------------------------------------------------


def _allocated(parts: Parts) -> None:
    requested(parts)
    incident_webhook.handle(_sqs({"incident_id": parts.alloc(1).incident_id}))


def test_idle_alert_warns_then_recovers(parts: Parts) -> None:
    _allocated(parts)
    answer = idle_alert.handle(event("idle_alert_triggered.json"))
    assert answer["statusCode"] == 202 and json.loads(answer["body"]) == {"ir": "IR-1", "queued": "idle"}
    # Datadog's retry of the same notification collapses in the queue.
    idle_alert.handle(event("idle_alert_triggered.json"))
    assert parts.alloc(1).phase is Phase.ALLOCATED
    assert run_commands(parts) == ["idle"]
    assert parts.alloc(1).phase is Phase.IDLE_WARNED
    idle_alert.handle(event("idle_alert_recovered.json"))
    assert run_commands(parts) == ["busy"]
    assert parts.alloc(1).phase is Phase.ALLOCATED


def test_idle_alert_without_a_queue_acts_at_once(parts: Parts) -> None:
    _allocated(parts)
    runtime.override(queue=None)
    answer = idle_alert.handle(event("idle_alert_triggered.json"))
    assert answer["statusCode"] == 200 and json.loads(answer["body"])["outcome"] == "warned"
    assert parts.alloc(1).phase is Phase.IDLE_WARNED


def test_idle_alerts_out_of_order_or_stale_change_nothing(parts: Parts) -> None:
    _allocated(parts)
    runtime.override(queue=None)
    # The Recovered arrives first: nothing to clear; the late Triggered finds its group OK now and is ignored.
    parts.monitors.set(1234567, "ir:ir-1", "OK")
    assert json.loads(idle_alert.handle(event("idle_alert_recovered.json"))["body"])["outcome"].startswith("nothing")
    late = idle_alert.handle(event("idle_alert_triggered.json"))
    assert late["statusCode"] == 200 and "stale Triggered" in json.loads(late["body"])["ignored"]
    assert parts.alloc(1).phase is Phase.ALLOCATED
    assert not [m for m in parts.chat.to("U0000000001", "dm") if "idle" in m.text]
    # Idle for real: warned; a stale Recovered (the group is in Alert again) does not clear the warning.
    parts.monitors.set(1234567, "ir:ir-1", "Alert")
    assert json.loads(idle_alert.handle(event("idle_alert_triggered.json"))["body"])["outcome"] == "warned"
    stale = idle_alert.handle(event("idle_alert_recovered.json"))
    assert "in Alert again" in json.loads(stale["body"])["ignored"]
    assert parts.alloc(1).phase is Phase.IDLE_WARNED
    assert parts.monitors.asked[-1] == (1234567, ("ir:ir-1",))


def test_a_recovered_host_clears_only_its_own_warning_while_another_host_of_the_lease_is_idle(parts: Parts) -> None:
    _allocated(parts)
    runtime.override(queue=None)
    # The lease holds both hosts (as an operator-approved 16-GPU lease would).
    both = {f.HOSTS: ["hpc-1", "hpc-2"], f.HOST_GPUS: ["hpc-1=8", "hpc-2=8"], f.GPU_COUNT: "16"}
    parts.incidents.update(parts.alloc(1).incident_id, both)
    for host in ("hpc-1", "hpc-2"):
        parts.monitors.set(1234567, f"gpu_ir:ir-1,host:{host}", "Alert")
    parts.monitors.set(7654321, "gpu_ir:ir-1,host:hpc-1", "Alert")  # another kind's monitor, same host
    parts.monitors.set(7654321, "gpu_ir:ir-2,host:hpc-9", "Alert")  # another lease's

    def alert(name: str, host: str) -> dict[str, Any]:
        sent = event(name)
        sent["body"] = json.dumps({**json.loads(sent["body"]), "alert_scope": f"gpu_ir:ir-1,host:{host}"})
        return sent

    for host in ("hpc-1", "hpc-2"):
        assert json.loads(idle_alert.handle(alert("idle_alert_triggered.json", host))["body"])["outcome"].startswith(
            "warned"
        )
    # hpc-1 gets busy by one monitor while the other kind still sees it idle: its warning stands.
    parts.monitors.set(1234567, "gpu_ir:ir-1,host:hpc-1", "OK")
    answer = json.loads(idle_alert.handle(alert("idle_alert_recovered.json", "hpc-1"))["body"])
    assert answer["ignored"].startswith("IR-1 is still idle on hpc-1")
    # Asked of gpufarm's monitors other than the squatter monitor, whose groups name a hurt lease, not an idle one.
    assert parts.monitors.excluded == [SQUATTER_MONITOR_TAG]
    # Both monitors see hpc-1 busy: its warning goes, hpc-2's (still idle) stays.
    parts.monitors.set(7654321, "gpu_ir:ir-1,host:hpc-1", "OK")
    answer = json.loads(idle_alert.handle(alert("idle_alert_recovered.json", "hpc-1"))["body"])
    assert answer["outcome"] == "recovered hpc-1; still idle hpc-2"
    assert parts.alloc(1).phase is Phase.IDLE_WARNED
    # hpc-2 too: now the lease is busy and the warning goes.
    parts.monitors.set(1234567, "gpu_ir:ir-1,host:hpc-2", "OK")
    assert json.loads(idle_alert.handle(alert("idle_alert_recovered.json", "hpc-2"))["body"])["outcome"] == "recovered"
    assert parts.alloc(1).phase is Phase.ALLOCATED


def test_idle_alert_bad_input(parts: Parts) -> None:
    # An alert for an IR gpufarm does not hold is answered 200 (Datadog must not retry it) and changes nothing.
    unknown = idle_alert.handle(event("idle_alert_triggered.json"))
    assert unknown["statusCode"] == 200 and "ignored" in json.loads(unknown["body"])
    wrong = event("idle_alert_triggered.json")
    wrong["headers"]["x-gpufarm-token"] = "nope"
    assert idle_alert.handle(wrong)["statusCode"] == 401
    for body in ("{}", "nope", json.dumps({"alert_transition": ""})):
        bad = event("idle_alert_triggered.json")
        bad["body"] = body
        assert idle_alert.handle(bad)["statusCode"] == 400
    scopeless = event("idle_alert_triggered.json")
    scopeless["body"] = json.dumps({"alert_transition": "Triggered", "alert_scope": "host:x"})
    assert json.loads(idle_alert.handle(scopeless)["body"]) == {"ignored": "the alert scope names no ir"}
    warn = copy.deepcopy(event("idle_alert_triggered.json"))
    warn["body"] = json.dumps({"alert_transition": "Warn", "alert_scope": "ir:ir-1"})
    assert "ignored" in json.loads(idle_alert.handle(warn)["body"])


def test_quota_sync_queues_pool_repairs_and_publishes_gauges(parts: Parts) -> None:
    _allocated(parts)
    summary = quota_sync.handle(event("quota_sync_schedule.json"))
    assert summary["pools_queued"] == ["cloud", "hpc", "slices"]
    assert summary["series"] > 0
    assert parts.metrics.value("gpufarm.quota.allocated", "team:nlp", "environment:hpc", "gpu_model:h100") == 8
