"""The host tag read through urllib3: what benchmarks/node.py measures the agent's own bounded HTTP/1.1 reader
(gpufarm_node.hosttags.HttpTagsTransport) against, side by side in the same run.

It takes and refuses the same answers as the agent's reader (tests/contract/test_node_tag_reads.py's), on one
kept-alive urllib3 connection pool, with the same timeouts, bounds and retry (a kept-alive connection the server
closed meanwhile is reopened once), so the two differ only in what a read costs.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HeaderParsingError
from urllib3.util.response import assert_header_parsing

from gpufarm_node.hosttags import MAX_BODY_BYTES, SOURCE


class TagReadError(OSError):
    """The read failed: no connection, a timeout, or an answer that is not HTTP/1.x or is over the bounds."""


class _StrictResponse(http.client.HTTPResponse):
    """http.client's answer, refusing a head it could not parse (urllib3 only logs that and reads on)."""

    def begin(self) -> None:
        """Read the status line and headers; a malformed header line fails the read."""
        super().begin()
        try:
            assert_header_parsing(self.msg)
        except HeaderParsingError as exc:
            raise http.client.HTTPException(f"malformed head: {exc}") from exc


class _Connection(HTTPConnection):
    response_class = _StrictResponse


class _TlsConnection(HTTPSConnection):
    response_class = _StrictResponse


class Urllib3TagsTransport:
    """GET /api/v1/tags/hosts/<host>?source=user through urllib3, on one kept-alive connection, held to what
    gpufarm_node.hosttags.HttpTagsTransport does.

    No redirects and no retries by urllib3: a kept-alive connection the server closed meanwhile is reopened once
    (a GET is safe), any other failure fails the read. The answer is bounded: a `Content-Length` over
    MAX_BODY_BYTES (or not a whole number) is refused before the body is read, a chunked or close-delimited body
    is read up to one byte past it; a head http.client cannot parse and 1xx answers fail too. A failed read drops
    the connection; the next read opens a new one.
    """

    def __init__(
        self,
        base_url: str,
        hostname: str,
        headers: Mapping[str, str],
        *,
        timeout: float = 3.0,
        verify: bool = True,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url[:80]!r}")
        for name, value in headers.items():
            if any(ch in f"{name}{value}" for ch in "\r\n\0"):
                raise ValueError(f"header {name!r} holds a line break")
        self.path = f"{parts.path.rstrip('/')}/api/v1/tags/hosts/{quote(hostname, safe='')}?source={SOURCE}"
        self._headers = {"Accept": "application/json", **headers}
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self._pool_args: dict[str, Any] = {"host": parts.hostname, "port": parts.port, "maxsize": 1}
        if parts.scheme == "https":
            self._pool_args.update(cert_reqs="CERT_REQUIRED" if verify else "CERT_NONE", ca_certs=ca_file)
            if not verify:
                self._pool_args["assert_hostname"] = False
        self._https = parts.scheme == "https"
        self._pool: urllib3.HTTPConnectionPool | None = None
        # The connection the last good read left open (urllib3 keeps it in the pool for the next read).
        self._connection: Any = None

    @classmethod
    def from_client(cls, client: Any, hostname: str, *, timeout: float = 3.0) -> Urllib3TagsTransport:
        """The same host, keys, TLS settings and user agent as a datadog-api-client ApiClient."""
        cfg = client.configuration
        auth = cfg.auth_settings()
        headers = {"User-Agent": client.user_agent}
        for name in ("apiKeyAuth", "appKeyAuth"):
            if name in auth:
                headers[auth[name]["key"]] = auth[name]["value"]
        return cls(cfg.host, hostname, headers, timeout=timeout, verify=bool(cfg.verify_ssl), ca_file=cfg.ssl_ca_cert)

    @property
    def connected(self) -> bool:
        """Whether a kept-alive connection is open for the next read."""
        return self._connection is not None and self._connection.is_connected

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        """One read; a kept-alive connection the server closed meanwhile is reopened once (a GET is safe)."""
        reused = self.connected
        try:
            return self._exchange()
        except OSError:
            if not reused:
                raise
        return self._exchange()

    def _exchange(self) -> tuple[int, bytes, Mapping[str, str]]:
        self._connection = None
        pool = self._pool or self._open()
        try:
            answer = pool.urlopen(
                "GET",
                self.path,
                headers=self._headers,
                retries=False,
                redirect=False,
                timeout=self._timeout,
                preload_content=False,
                decode_content=False,
            )
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            raise TagReadError(f"{type(exc).__name__}: {exc}") from exc
        # Taken now: urllib3 lets go of it (back to the pool) as soon as the body is read to its end.
        connection = answer.connection
        try:
            status, headers = answer.status, {name.lower(): value for name, value in answer.headers.items()}
            body = _bounded_body(answer, status, headers)
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            answer.close()  # closes the connection: what is left of the answer must not be read as the next one
            answer.release_conn()
            raise TagReadError(f"{type(exc).__name__}: {exc}") from exc
        answer.release_conn()
        self._connection = connection
        return status, body, headers

    def _open(self) -> urllib3.HTTPConnectionPool:
        pool: urllib3.HTTPConnectionPool
        if self._https:
            pool = urllib3.HTTPSConnectionPool(**self._pool_args)
            pool.ConnectionCls = _TlsConnection
        else:
            pool = urllib3.HTTPConnectionPool(**self._pool_args)
            pool.ConnectionCls = _Connection
        self._pool = pool
        return pool

    def close(self) -> None:
        """Close the connection (the next read opens a new one)."""
        pool, self._pool, self._connection = self._pool, None, None
        if pool is not None:
            pool.close()


def _bounded_body(answer: urllib3.BaseHTTPResponse, status: int, headers: Mapping[str, str]) -> bytes:
    """The answer's body, refused past MAX_BODY_BYTES; raises TagReadError on a 1xx or a bad Content-Length."""
    if status < 200:
        raise TagReadError(f"interim answer {status}")
    length_text = headers.get("content-length")
    if length_text is not None and "chunked" not in headers.get("transfer-encoding", "").lower():
        declared = _whole_number(length_text)
        if declared is None or declared > MAX_BODY_BYTES:
            raise TagReadError(f"Content-Length {length_text[:20]!r} refused")
    chunks: list[bytes] = []
    size = 0
    # Up to the end of the body (urllib3 checks a Content-Length body is whole only there), one byte past the bound.
    while chunk := answer.read(MAX_BODY_BYTES + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise TagReadError(f"host tags answer over {MAX_BODY_BYTES} bytes")
    return b"".join(chunks)


def _whole_number(text: str) -> int | None:
    """A Content-Length the agent's reader takes: 1 to 9 ASCII digits, else None."""
    text = text.strip()
    if not 0 < len(text) <= 9 or not text.isascii() or not text.isdigit():
        return None
    return int(text)
