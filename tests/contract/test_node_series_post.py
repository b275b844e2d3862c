"""The series push on the agent's own connection (gpufarm_node.series_post): one kept-alive connection while pushes
succeed, a connection the server closed reopened before sending, and every failure handed to the client's path."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from gpufarm_node.datadog import DatadogTarget, api_client
from gpufarm_node.sender import DatadogSender, IntakeError
from gpufarm_node.series_post import DirectSeriesIntake

ACCEPTED = b'HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"errors":[]}'
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown"


class ScriptedIntake:
    """A loopback server answering each request, on whichever connection, with the next scripted answer; an answer
    scripted with `close` closes its connection after it."""

    def __init__(self, script: list[tuple[bytes, bool]]) -> None:
        self._script = list(script)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        # (connection number, request head, body) of each request.
        self.requests: list[tuple[int, bytes, bytes]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        number = 0
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            number += 1
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                with self._lock:
                    self.requests.append((number, head, body))
                    answer, close = self._script.pop(0)
                conn.sendall(answer)
                if close:
                    return

    def close(self) -> None:
        self._listener.close()


def _intake(url: str) -> tuple[DirectSeriesIntake, Any]:
    client = api_client(DatadogTarget(url, "the-key", None), max_retries=0)
    return DirectSeriesIntake.from_client(client), client


def test_pushes_share_one_connection_and_carry_the_client_s_request() -> None:
    server = ScriptedIntake([(ACCEPTED, False)] * 3)
    intake, client = _intake(server.url)
    try:
        for n in range(3):
            intake.post(b"payload-%d" % n)
    finally:
        intake.close()
        client.close()
        server.close()
    assert [(number, body) for number, _, body in server.requests] == [
        (1, b"payload-0"),
        (1, b"payload-1"),
        (1, b"payload-2"),
    ]
    lines = server.requests[0][1].split(b"\r\n")
    assert lines[0] == b"POST /api/v2/series HTTP/1.1"
    assert {b"DD-API-KEY: the-key", b"Content-Encoding: zstd1", b"Content-Length: 9"} <= set(lines)
    assert (intake.direct_posts, intake.client_posts) == (3, 0)


def test_the_sender_closes_the_intake_s_connection_with_its_last_flush() -> None:
    server = ScriptedIntake([(ACCEPTED, False)])
    intake, client = _intake(server.url)
    sender = DatadogSender(intake, "h", clock=lambda: 1_000_000.0)
    try:
        sender.send([("gpufarm.node.gpus", 8.0, ("environment:x",))], 1_000_000)
        sender.close()
    finally:
        client.close()
        server.close()
    assert not intake.connected and sender.buffered == 0
    assert [number for number, _, _ in server.requests] == [1]


def test_a_connection_the_server_closed_while_idle_is_reopened_before_sending() -> None:
    server = ScriptedIntake([(ACCEPTED, True), (ACCEPTED, False)])
    intake, client = _intake(server.url)
    try:
        intake.post(b"first")
        time.sleep(0.2)  # the server's close reaches this side before the next push
        intake.post(b"second")
    finally:
        intake.close()
        client.close()
        server.close()
    assert [(number, body) for number, _, body in server.requests] == [(1, b"first"), (2, b"second")]
    assert (intake.direct_posts, intake.client_posts) == (2, 0)


@pytest.mark.parametrize(
    "failure",
    [UNAVAILABLE, b"not http at all\r\n\r\n", b"HTTP/1.1 202 Accepted\r\nContent-Length: 999999999\r\n\r\n"],
    ids=["503", "garbage", "oversized"],
)
def test_a_push_that_fails_on_the_connection_goes_through_the_client_s_path(failure: bytes) -> None:
    server = ScriptedIntake([(failure, True), (ACCEPTED, False), (ACCEPTED, False)])
    intake, client = _intake(server.url)
    try:
        intake.post(b"once")
        intake.post(b"next")
    finally:
        intake.close()
        client.close()
        server.close()
    # The failed payload again on the client's own connection; the next push back on a direct one.
    assert [body for _, _, body in server.requests] == [b"once", b"once", b"next"]
    assert server.requests[0][0] != server.requests[1][0]
    assert (intake.direct_posts, intake.client_posts) == (1, 1)


def test_the_client_s_path_decides_a_failure_and_carries_the_pushes_until_one_succeeds() -> None:
    server = ScriptedIntake([(UNAVAILABLE, False), (UNAVAILABLE, False), (UNAVAILABLE, False), (ACCEPTED, False)])
    intake, client = _intake(server.url)
    try:
        with pytest.raises(IntakeError) as raised:
            intake.post(b"first")
        assert raised.value.status == 503 and raised.value.retry is True
        with pytest.raises(IntakeError):
            intake.post(b"second")  # straight to the client's path: one request
        intake.post(b"third")
    finally:
        intake.close()
        client.close()
        server.close()
    assert [body for _, _, body in server.requests] == [b"first", b"first", b"second", b"third"]
    assert (intake.direct_posts, intake.client_posts) == (0, 3)


def test_nothing_answering_is_the_client_s_connection_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    intake, client = _intake(url)
    try:
        with pytest.raises(IntakeError) as raised:
            intake.post(b"lost")
    finally:
        client.close()
    assert raised.value.status == 0 and raised.value.retry is True


def test_a_429_holds_every_push_until_its_reset_and_is_not_sent_again_at_once() -> None:
    limited = b"HTTP/1.1 429 Too Many Requests\r\nX-RateLimit-Reset: 7\r\nContent-Length: 4\r\n\r\nslow"
    server = ScriptedIntake([(limited, False), (ACCEPTED, False)])
    client = api_client(DatadogTarget(server.url, "the-key", None), max_retries=0)
    now = [100.0]
    intake = DirectSeriesIntake.from_client(client, clock=lambda: now[0])
    try:
        with pytest.raises(IntakeError) as raised:
            intake.post(b"first")
        assert (raised.value.status, raised.value.retry) == (429, True)
        now[0] += 6.5
        with pytest.raises(IntakeError) as held:
            intake.post(b"first")  # still within the reset: nothing is sent
        assert held.value.status == 429
        assert [body for _, _, body in server.requests] == [b"first"]
        now[0] += 1.0
        intake.post(b"first")
    finally:
        intake.close()
        client.close()
        server.close()
    assert [body for _, _, body in server.requests] == [b"first", b"first"]


def test_a_payload_refused_for_its_content_is_dropped_not_sent_again() -> None:
    too_big = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig"
    server = ScriptedIntake([(too_big, False), (ACCEPTED, False)])
    intake, client = _intake(server.url)
    try:
        with pytest.raises(IntakeError) as raised:
            intake.post(b"huge")
        assert (raised.value.status, raised.value.retry) == (413, False)
        intake.post(b"next")
    finally:
        intake.close()
        client.close()
        server.close()
    assert [body for _, _, body in server.requests] == [b"huge", b"next"]
