"""The agent's per-cycle host tags read over real HTTP against the sandbox: keys, path, rate-limit headers."""

from __future__ import annotations

import socket
import threading

import pytest
import urllib3

from gpufarm_node.datadog import DatadogTarget, api_client
from gpufarm_node.hosttags import HostTagWatch, HttpTagsTransport

HOST = "gpu-shared-01"


def test_the_http_transport_reads_the_sandbox_and_follows_its_rate_limit(sandbox_url: str) -> None:
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY

    keys = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
    uuid = "mig-0e6a0b7a-3d2d-5c8c-9a3f-7c1b2d4e5f60"
    http = urllib3.PoolManager()
    tagged = http.request(
        "POST",
        f"{sandbox_url}/api/v1/tags/hosts/{HOST}?source=user",
        json={"tags": [f"gpu_assign:ir-12/{uuid}"]},
        headers=keys,
    )
    assert tagged.status == 201
    limited = http.request(
        "POST", f"{sandbox_url}/_sandbox/ratelimits", json={"groups": {"tags": {"limit": 3, "period": 60}}}
    )
    assert limited.status == 200
    client = api_client(DatadogTarget(sandbox_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY))
    watch = HostTagWatch.from_client(client, HOST)
    try:
        assert watch.poll()
        assert watch.assignments == {uuid: "ir-12"}
        assert watch.last_rate is not None and watch.last_rate.limit == 3 and watch.last_rate.remaining == 2
        assert watch.poll()  # remaining 1 of 3: under the low-water mark from now on
        assert watch.stats["slowed"] == 1
        assert not watch.poll()  # waits for the window instead of spending the last request
        assert watch.stats["reads"] == 2 and watch.assignments == {uuid: "ir-12"}
    finally:
        watch.close()
        client.close()


class RawServer:
    """A loopback server answering each connection's requests from a script of raw answers (then closing)."""

    def __init__(self, answers: list[list[bytes]]) -> None:
        self._answers = answers
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        for connection_answers in self._answers:
            conn, _ = self._listener.accept()
            with conn:
                for answer in connection_answers:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += conn.recv(65536)
                    self.requests.append(request)
                    conn.sendall(answer)

    def close(self) -> None:
        self._listener.close()


BODY = b'{"host":"h","tags":["ir:ir-3"]}'
OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-RateLimit-Remaining: 9\r\n\r\n%s"
    % (
        len(BODY),
        BODY,
    )
)


def _transport(url: str) -> HttpTagsTransport:
    return HttpTagsTransport(url, "h", {"DD-API-KEY": "k", "DD-APPLICATION-KEY": "a"}, timeout=2.0)


def test_the_request_carries_the_keys_and_a_connection_the_server_closed_is_reopened() -> None:
    server = RawServer([[OK], [OK]])  # the first connection closes after one answer
    transport = _transport(server.url)
    try:
        assert transport.get() == (
            200,
            BODY,
            {"content-type": "application/json", "content-length": str(len(BODY)), "x-ratelimit-remaining": "9"},
        )
        assert transport.get()[1] == BODY
    finally:
        transport.close()
        server.close()
    first = server.requests[0].decode()
    assert first.startswith("GET /api/v1/tags/hosts/h?source=user HTTP/1.1\r\n")
    assert "DD-API-KEY: k\r\n" in first and "DD-APPLICATION-KEY: a\r\n" in first and "Host: 127.0.0.1:" in first


def test_chunked_answers_and_answers_that_end_with_the_connection_are_read() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"
        + BODY[:5]
        + b"\r\n"
        + b"%x;x=1\r\n" % (len(BODY) - 5)
        + BODY[5:]
        + b"\r\n0\r\nX-T: 1\r\n\r\n"
    )
    until_close = b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n" + BODY
    server = RawServer([[chunked, until_close]])
    transport = _transport(server.url)
    try:
        assert transport.get()[:2] == (200, BODY)
        assert transport.get()[:2] == (404, BODY)
    finally:
        transport.close()
        server.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
    ],
)
def test_answers_outside_the_reader_s_bounds_fail_the_read_and_drop_the_connection(answer: bytes) -> None:
    server = RawServer([[answer]])
    transport = _transport(server.url)
    try:
        with pytest.raises(OSError):
            transport.get()
        assert not transport.connected
    finally:
        transport.close()
        server.close()
