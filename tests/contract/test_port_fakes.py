"""One port contract, two implementations: the real adapters (Datadog gateway and Slack chat on the sandbox,
SQS FIFO queue on moto) and the unit tests' fakes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import boto3
import pytest
from fakes import FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeQueue
from moto import mock_aws
from port_contract import (
    ChatContract,
    HostTagsContract,
    IncidentStoreContract,
    Received,
    SeedGroup,
    SeedHosts,
    WorkQueueContract,
)

from gpufarm.adapters.aws import SqsFifoQueue
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.slack import SlackChat
from gpufarm.cli.datadog import run_apply
from gpufarm.config import Settings
from gpufarm.core.kernel.ports import Chat, HostTags, IncidentStore, WorkQueue
from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN

VALID_VALUES = {"team": ["nlp", "vision"], "gpu_model": ["H100", "A100"], "environment": ["onprem-hpc", "cloud"]}


@pytest.fixture
def gateway(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[DatadogGateway]:
    """The real gateway on a sandbox set up as `gpufarm datadog apply` leaves an organisation."""
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", "hook-secret-for-port-contract-0123")
    settings = Settings(max_retries=1, http_timeout=5)
    run_apply(
        settings,
        incident_webhook_url="http://127.0.0.1:9/fn/incident_webhook/",
        idle_webhook_url="http://127.0.0.1:9/fn/idle_alert/",
        valid_values=VALID_VALUES,
    )
    gw = DatadogGateway(settings, create_backoff_s=0.05)
    yield gw
    gw.close()


class TestDatadogIncidents(IncidentStoreContract):
    @pytest.fixture
    def incidents(self, gateway: DatadogGateway) -> IncidentStore:
        return gateway


class TestFakeIncidents(IncidentStoreContract):
    @pytest.fixture
    def incidents(self) -> IncidentStore:
        return FakeIncidents(FakeClock())


def _post(url: str, body: object) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


class TestDatadogHosts(HostTagsContract):
    @pytest.fixture
    def hosts(self, gateway: DatadogGateway) -> HostTags:
        return gateway

    @pytest.fixture
    def seed_hosts(self, sandbox_url: str) -> SeedHosts:
        def seed(hosts: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
            body = {"hosts": [{"name": name, "tags": dict(tags)} for name, tags in hosts.items()]}
            _post(f"{sandbox_url}/_sandbox/hosts", body)

        return seed


class TestFakeHosts(HostTagsContract):
    @pytest.fixture
    def hosts(self) -> HostTags:
        return FakeHosts()

    @pytest.fixture
    def seed_hosts(self, hosts: FakeHosts) -> SeedHosts:
        def seed(seeded: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
            for name, tags in seeded.items():
                hosts.tags[name] = {source: list(values) for source, values in tags.items()}

        return seed


class TestSlackChat(ChatContract):
    @pytest.fixture
    def chat(self, sandbox_url: str) -> Chat:
        return SlackChat(DEFAULT_SLACK_TOKEN, base_url=f"{sandbox_url}/slack/api/", timeout=5)

    @pytest.fixture
    def seed_group(self, sandbox_url: str) -> SeedGroup:
        def seed(group: str, members: Sequence[str]) -> None:
            body = {"usergroups": [{"id": group, "handle": f"group-{group.lower()}", "users": list(members)}]}
            _post(f"{sandbox_url}/_sandbox/slack/usergroups", body)

        return seed


class TestFakeChat(ChatContract):
    @pytest.fixture
    def chat(self) -> Chat:
        return FakeChat()

    @pytest.fixture
    def seed_group(self, chat: FakeChat) -> SeedGroup:
        def seed(group: str, members: Sequence[str]) -> None:
            chat.usergroup, chat.operators = group, frozenset(members)

        return seed


class TestSqsFifoQueue(WorkQueueContract):
    @pytest.fixture
    def sqs(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
        """SQS as moto serves it in-process, with fake credentials so nothing looks for an account."""
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        with mock_aws():
            yield boto3.client("sqs", region_name="us-east-1")

    @pytest.fixture
    def queue_url(self, sqs: Any) -> str:
        attributes = {"FifoQueue": "true"}
        return str(sqs.create_queue(QueueName="allocations.fifo", Attributes=attributes)["QueueUrl"])

    @pytest.fixture
    def queue(self, queue_url: str) -> WorkQueue:
        return SqsFifoQueue(Settings(), queue_url)

    @pytest.fixture
    def received(self, sqs: Any, queue_url: str) -> Received:
        def receive() -> list[tuple[str, dict[str, Any]]]:
            answer = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"]
            )
            return [(m["Attributes"]["MessageGroupId"], json.loads(m["Body"])) for m in answer.get("Messages", [])]

        return receive


class TestFakeQueue(WorkQueueContract):
    @pytest.fixture
    def queue(self) -> WorkQueue:
        return FakeQueue()

    @pytest.fixture
    def received(self, queue: FakeQueue) -> Received:
        return lambda: list(queue.sent)
