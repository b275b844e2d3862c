"""SQS queues as the local host runs them: SendMessage's checks, FIFO groups delivered one batch at a time in
order, deduplication within five minutes, partial batch responses and bounded redelivery to a dead-letter log."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.localhost.env import ACCOUNT_ID, REGION
from gpufarm_sandbox.localhost.functions import LocalFunction
from gpufarm_sandbox.localhost.template import QueueSpec

if TYPE_CHECKING:
    from gpufarm_sandbox.localhost.function_host import FunctionHost

log = logging.getLogger("gpufarm_sandbox.localhost")

MAX_ASYNC_PAYLOAD = 256 * 1024  # async invoke and SQS message limits
DEDUP_WINDOW_S = 300.0  # SQS FIFO deduplication interval
SQS_SENDER_ID = "AIDAIENQZJOLO23YVJ4VO"


@dataclass
class QueuedMessage:
    """One SQS message as the local queue holds it."""

    message_id: str
    body: str
    group: str
    dedup_id: str | None
    sent_ms: int
    sequence: str
    receive_count: int = 0
    first_receive_ms: int | None = None


@dataclass
class LocalQueue:
    """An SQS queue: FIFO groups delivered one batch at a time, in order, with bounded redelivery."""

    spec: QueueSpec
    url: str
    name: str
    consumer: LocalFunction | None = None
    batch_size: int = 1
    report_failures: bool = False
    groups: dict[str, deque[QueuedMessage]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    dedup: dict[str, tuple[float, str]] = field(default_factory=dict)
    sequence: int = 0
    sent: int = 0
    delivered: int = 0

    @property
    def arn(self) -> str:
        """The queue ARN an SQS event names."""
        return f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{self.name}"

    def depth(self) -> int:
        """Messages waiting or in flight."""
        return sum(len(q) for q in self.groups.values())


def sqs_error(status: int, kind: str, message: str) -> Response:
    """SQS's JSON-protocol error shape."""
    _, body = _sqs_refusal(status, kind, message)
    return Response(json.dumps(body), status=status, content_type="application/x-amz-json-1.0")


def _sqs_refusal(status: int, kind: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"__type": f"com.amazonaws.sqs#{kind}", "message": message}


def check_message(queue: LocalQueue, text: str, group: str | None, dedup_id: str | None) -> tuple[int, str, str] | None:
    """SendMessage's validation: size, FIFO group and deduplication id rules."""
    if not text or len(text.encode()) > MAX_ASYNC_PAYLOAD:
        return 400, "InvalidParameterValue", "Message must be between 1 and 262144 bytes long."
    for label, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup_id)):
        if value is not None and (not 1 <= len(value) <= 128 or not value.isprintable() or " " in value):
            return 400, "InvalidParameterValue", f"{label} must be 1-128 printable characters without spaces."
    if queue.spec.fifo:
        if not group:
            return 400, "MissingParameter", "The request must contain the parameter MessageGroupId."
        if not dedup_id and not queue.spec.content_dedup:
            return (
                400,
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
                "provided explicitly",
            )
    return None


def failed_items(queue: LocalQueue, batch: list[QueuedMessage], result: Any) -> set[str]:
    """Partial batch response: ids listed in batchItemFailures fail (only with ReportBatchItemFailures)."""
    if not queue.report_failures or not isinstance(result, dict):
        return set()
    items = result.get("batchItemFailures")
    if not items:
        return set()
    ids = {m.message_id for m in batch}
    failed = {str(i.get("itemIdentifier")) for i in items if isinstance(i, dict)}
    # An unknown or empty identifier fails the whole batch, as Lambda does.
    return ids if not failed <= ids else failed


def sqs_record(queue: LocalQueue, message: QueuedMessage) -> dict[str, Any]:
    """The SQS event record Lambda builds for one received message."""
    attributes = {
        "ApproximateReceiveCount": str(message.receive_count),
        "SentTimestamp": str(message.sent_ms),
        "SenderId": SQS_SENDER_ID,
        "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
    }
    if queue.spec.fifo:
        attributes["SequenceNumber"] = message.sequence
        attributes["MessageGroupId"] = message.group
        if message.dedup_id:
            attributes["MessageDeduplicationId"] = message.dedup_id
    return {
        "messageId": message.message_id,
        "receiptHandle": base64.b64encode(f"{message.message_id}:{message.receive_count}".encode()).decode(),
        "body": message.body,
        "attributes": attributes,
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(message.body.encode()).hexdigest(),  # noqa: S324 - SQS's checksum, not security
        "eventSource": "aws:sqs",
        "eventSourceARN": queue.arn,
        "awsRegion": REGION,
    }


class QueueRunner:
    """The template's queues, each delivering to the function whose SQS event names it."""

    def __init__(self, host: FunctionHost) -> None:
        self.host = host
        self.queues: dict[str, LocalQueue] = {
            qid: LocalQueue(spec, host.urls.queue(qid), host.resolver.queue_name(qid))
            for qid, spec in host.template.queues.items()
        }
        for fn in host.functions.values():
            for event in fn.spec.queues:
                queue = self.queues[event.queue]
                if queue.consumer is not None:
                    log.warning("queue %s has two consumers; %s is used", event.queue, queue.consumer.spec.logical_id)
                    continue
                queue.consumer, queue.batch_size, queue.report_failures = fn, event.batch_size, event.report_failures

    def send(self, queue_id: str, body: Any, *, group: str | None = None, dedup_id: str | None = None) -> str:
        """Enqueue a message as SendMessage would; returns the MessageId (the original one for a duplicate)."""
        queue = self.queues[queue_id]
        text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
        problem = check_message(queue, text, group, dedup_id)
        if problem:
            raise ValueError(problem[2])
        return self.enqueue(queue, text, group, dedup_id)

    def pending(self) -> bool:
        """True while a queue with a consumer holds messages waiting or in flight (lock held by the caller)."""
        return any(q.consumer and q.depth() for q in self.queues.values())

    def forget_duplicates(self) -> None:
        """Drop every queue's deduplication ids."""
        for queue in self.queues.values():
            queue.dedup.clear()

    def state(self) -> dict[str, Any]:
        """Queue depths and counters for `/_local/state`."""
        return {
            qid: {
                "url": q.url,
                "name": q.name,
                "fifo": q.spec.fifo,
                "consumer": q.consumer.spec.logical_id if q.consumer else None,
                "depth": q.depth(),
                "in_flight_groups": sorted(q.busy),
                "sent": q.sent,
                "delivered": q.delivered,
            }
            for qid, q in self.queues.items()
        }

    def send_request(self, request: Request, queue_id: str) -> Response:
        """`POST /_local/queues/<queue_id>/messages`: SendMessage over HTTP, as the runtime's local queue calls it."""
        try:
            body = json.loads(request.get_data(cache=True) or b"null")
        except (ValueError, UnicodeDecodeError):
            if queue_id not in self.queues:
                return sqs_error(400, "QueueDoesNotExist", "The specified queue does not exist.")
            return sqs_error(400, "InvalidParameterValue", "The request body is not valid JSON.")
        status, answer = self.accept(queue_id, body)
        ctype = "application/json" if status == 200 else "application/x-amz-json-1.0"
        return Response(json.dumps(answer), status=status, content_type=ctype)

    def accept(self, queue_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        """SendMessage of `{"body", "group", "dedup_id"}`: (200, the answer) or (4xx/503, SQS's error shape).

        The HTTP route and the in-process hand-off (`seams`) share it, so both refuse the same messages.
        """
        queue = self.queues.get(queue_id)
        if queue is None:
            return _sqs_refusal(400, "QueueDoesNotExist", "The specified queue does not exist.")
        if not isinstance(body, dict) or "body" not in body:
            return _sqs_refusal(400, "MissingParameter", 'Expected {"body": ..., "group": ..., "dedup_id": ...}.')
        raw = body["body"]
        text = raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
        group, dedup_id = body.get("group"), body.get("dedup_id")
        if (group is not None and not isinstance(group, str)) or (
            dedup_id is not None and not isinstance(dedup_id, str)
        ):
            return _sqs_refusal(400, "InvalidParameterValue", "group and dedup_id must be strings.")
        problem = check_message(queue, text, group, dedup_id)
        if problem:
            return _sqs_refusal(*problem)
        if self.host.closed:
            return _sqs_refusal(503, "ServiceUnavailable", "the local host is closed")
        message_id = self.enqueue(queue, text, group, dedup_id)
        return 200, {"MessageId": message_id, "MD5OfMessageBody": hashlib.md5(text.encode()).hexdigest()}  # noqa: S324

    def enqueue(self, queue: LocalQueue, text: str, group: str | None, dedup_id: str | None) -> str:
        """Add a checked message (FIFO: dropped as a duplicate within the window) and start its delivery."""
        now = self.host.clock.now()
        with self.host.lock:
            if queue.spec.fifo:
                dedup = dedup_id or hashlib.sha256(text.encode()).hexdigest()
                for key, (seen, _) in list(queue.dedup.items()):
                    # Expired, or recorded "in the future" because the sandbox clock was reset since.
                    if now - seen >= DEDUP_WINDOW_S or seen > now + 1:
                        del queue.dedup[key]
                if dedup in queue.dedup:
                    # SQS FIFO accepts the duplicate and drops it within the 5-minute window.
                    return queue.dedup[dedup][1]
            else:
                dedup = None
            queue.sequence += 1
            queue.sent += 1
            message = QueuedMessage(
                message_id=str(uuid.uuid4()),
                body=text,
                group=(group or "") if queue.spec.fifo else "",
                dedup_id=dedup,
                sent_ms=int(now * 1000),
                sequence=f"{18_000_000_000_000_000_000 + queue.sequence}",
            )
            if dedup is not None:
                queue.dedup[dedup] = (now, message.message_id)
            queue.groups.setdefault(message.group, deque()).append(message)
            self._pump(queue)
            return message.message_id

    def _pump(self, queue: LocalQueue) -> None:
        """Hand each idle group's next batch to the consumer (lock held); FIFO: one batch per group at a time."""
        if queue.consumer is None or self.host.closed:
            return
        for group, pending in queue.groups.items():
            if not pending or group in queue.busy:
                continue
            if not queue.spec.fifo and queue.busy:
                # A standard queue here delivers one batch at a time too; ordering is not promised, just kept.
                return
            batch = list(pending)[: max(1, queue.batch_size)]
            queue.busy.add(group)
            try:
                self.host.start_task(self._guarded_delivery, queue, group, batch, lane="queue")
            except RuntimeError:
                queue.busy.discard(group)
                return

    def _guarded_delivery(self, queue: LocalQueue, group: str, batch: list[QueuedMessage]) -> None:
        try:
            self._deliver(queue, group, batch)
        except Exception:
            log.exception("delivery from %s failed", queue.spec.logical_id)
            with self.host.lock:
                queue.busy.discard(group)

    def _deliver(self, queue: LocalQueue, group: str, batch: list[QueuedMessage]) -> None:
        now_ms = int(self.host.clock.now() * 1000)
        with self.host.lock:
            for message in batch:
                message.receive_count += 1
                message.first_receive_ms = message.first_receive_ms or now_ms
        event = {"Records": [sqs_record(queue, m) for m in batch]}
        assert queue.consumer is not None
        ok, result = self.host.execute(queue.consumer, event, f"sqs:{queue.spec.logical_id}")
        failed = {m.message_id for m in batch}
        if ok:
            failed = failed_items(queue, batch, result)
        with self.host.lock:
            pending = queue.groups.get(group, deque())
            done = {m.message_id for m in batch}
            kept = [m for m in pending if m.message_id not in done]
            retry: list[QueuedMessage] = []
            for message in batch:
                if message.message_id not in failed:
                    queue.delivered += 1
                elif message.receive_count >= queue.spec.max_receives:
                    reason = "handler error" if not ok else "reported in batchItemFailures"
                    self.host.dead_letter(
                        f"sqs:{queue.spec.logical_id}",
                        queue.spec.dead_letter_queue or queue.spec.logical_id,
                        f"{reason} after {message.receive_count} receives",
                        message.body,
                    )
                else:
                    retry.append(message)
            queue.groups[group] = deque(retry + kept)
            queue.busy.discard(group)
            self._pump(queue)
