"""One kept-alive HTTP/1.1 connection to Datadog with a small bounded answer reader (the agent's per-cycle calls).

The agent's calls to Datadog that run every cycle or every flush (the host tag read, gpufarm_node.hosttags; the
series push, gpufarm_node.series_post) go over a connection of this kind instead of urllib3: through urllib3 each
request goes through http.client's header parsing (the `email` package) and urllib3's request and response objects,
about 0.4-0.6 ms of CPU a request, more than the request's own socket work (benchmarks/node.py, docs/nvml.md §10).
The request's bytes are the caller's; the answer is read as: status line, headers, then a `Content-Length` body, a
chunked one, or one that ends with the connection, each bounded. Anything it does not take (a 1xx answer, a
malformed line, an answer over the bounds) raises AnswerError and drops the connection; the next exchange opens a
new one.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 << 10


class AnswerError(OSError):
    """The server's answer is not the HTTP/1.1 this reader takes (or is over its bounds): the connection is dropped."""


class Http1Connection:
    """One kept-alive connection to the host of `base_url` (TLS through `ssl` for https)."""

    def __init__(self, base_url: str, *, timeout: float = 3.0, verify: bool = True, ca_file: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url[:80]!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self.netloc = parts.netloc
        self.base_path = parts.path.rstrip("/")
        self._timeout = timeout
        self._context: ssl.SSLContext | None = None
        if self._https:
            self._context = ssl.create_default_context(cafile=ca_file)
            if not verify:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
        self._sock: socket.socket | None = None
        self._buffer = b""

    @property
    def open(self) -> bool:
        """Whether a connection is kept."""
        return self._sock is not None

    def dropped(self) -> bool:
        """Whether the kept connection was closed by the server (or has bytes nobody asked for) since the last
        answer: then it is closed here, and the next exchange opens a new one. No connection kept: False."""
        if self._sock is None:
            return False
        try:
            readable = bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):
            readable = True
        if readable or self._buffer:
            self.close()
            return True
        return False

    def exchange(self, request: bytes, max_body: int) -> tuple[int, bytes, Mapping[str, str]]:
        """Send `request` (whole: head and body) and read the answer: (status, body, headers with lower-case
        names). Raises OSError (AnswerError for an answer it does not take); the connection is then closed."""
        if self._sock is None:
            sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._host)
            self._sock, self._buffer = sock, b""
        try:
            self._sock.sendall(request)
            status, headers = parse_head(self._until(b"\r\n\r\n", MAX_HEAD_BYTES))
            body = self._body(headers, max_body)
        except OSError:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body, headers

    def _body(self, headers: Mapping[str, str], max_body: int) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            size = 0
            while True:
                line = self._until(b"\r\n", 64).partition(b";")[0].strip()
                if not line or len(line) > 8 or any(ch not in b"0123456789abcdefABCDEF" for ch in line):
                    raise AnswerError("malformed chunk size")
                length = int(line, 16)
                if not length:
                    while self._until(b"\r\n", MAX_HEAD_BYTES):  # trailers, up to the empty line
                        pass
                    return b"".join(chunks)
                size += length
                if size > max_body:
                    raise AnswerError(f"answer over {max_body} bytes")
                chunks.append(self._exactly(length))
                if self._exactly(2) != b"\r\n":
                    raise AnswerError("malformed chunk")
        length_text = headers.get("content-length")
        if length_text is None:
            # The body ends with the connection.
            while self._receive(max_body):
                pass
            body, self._buffer = self._buffer, b""
            self.close()
            return body
        declared = small_int(length_text)
        if declared is None or declared > max_body:
            raise AnswerError(f"Content-Length {length_text[:20]!r} refused")
        return self._exactly(declared)

    def _receive(self, limit: int) -> bool:
        """More bytes into the buffer; False at the end of the stream. Raises past `limit` bytes buffered."""
        if len(self._buffer) > limit:
            raise AnswerError(f"answer over {limit} bytes")
        assert self._sock is not None
        chunk = self._sock.recv(65536)
        self._buffer += chunk
        return bool(chunk)

    def _until(self, delimiter: bytes, limit: int) -> bytes:
        """The buffered bytes up to `delimiter` (consumed with it, returned without)."""
        while delimiter not in self._buffer:
            if not self._receive(limit):
                raise AnswerError("the connection closed mid-answer")
        found, _, self._buffer = self._buffer.partition(delimiter)
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._receive(size):
                raise AnswerError("the connection closed mid-answer")
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def close(self) -> None:
        """Close the connection (the next exchange opens a new one)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buffer = None, b""


def request_head(method: str, path: str, netloc: str, headers: Mapping[str, str]) -> str:
    """An HTTP/1.1 request's head (up to and with the empty line); a header holding a line break is refused."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {netloc}"]
    for name, value in headers.items():
        if any(ch in f"{name}{value}" for ch in "\r\n\0"):
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    return "\r\n".join(lines) + "\r\n\r\n"


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names) of an answer's head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status_text = rest[:3]
    if not version.startswith("HTTP/1.") or len(status_text) != 3 or not status_text.isdigit():
        raise AnswerError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
    status = int(status_text)
    if status < 200:
        raise AnswerError(f"interim answer {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise AnswerError(f"malformed header line {line[:40]!r}")
        headers[name.lower()] = value.strip()
    return status, headers


def small_int(text: str | None) -> int | None:
    """A small whole number (at most nine digits) in a header; None for anything else."""
    if text is None:
        return None
    text = text.strip()
    if not 0 < len(text) <= 9 or not text.isascii() or not text.isdigit():
        return None
    return int(text)
