"""The series push on the agent's own kept-alive connection, the client's path for every push that fails there.

A push through urllib3 (SeriesIntake) costs about 0.6 ms of CPU for one request of about 10 KB, nine tenths of it
urllib3's and http.client's request and response handling, not the socket's work (benchmarks/node.py); at the 60 s
flush that is about 0.15 ms of every cycle. DirectSeriesIntake sends the same request (the same URL, headers and
compressed body) over gpufarm_node.http1's connection and reads the answer with its bounded reader. Failures are
not its to decide: a push that does not come back 2xx there (no connection, a connection that broke, an answer
the reader does not take, any other status) goes again through SeriesIntake, whose client retry policy (bounded
retries, X-RateLimit-Reset) and error mapping decide as they did before; pushes stay on that path until one
succeeds, then come back. So a failing intake sees one request more per run of failures, and nothing else changes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from gpufarm_node.http1 import Http1Connection, request_head
from gpufarm_node.sender import SeriesIntake

# What the intake answers is a small JSON object (`{"errors": []}`); anything longer is not read.
MAX_ANSWER_BYTES = 64 << 10
DEFAULT_TIMEOUT_S = 15.0


class DirectSeriesIntake:
    """POST /api/v2/series on one kept-alive connection while pushes succeed, else through `fallback`."""

    def __init__(self, fallback: SeriesIntake, connection: Http1Connection) -> None:
        self.encoding = fallback.encoding
        self._fallback = fallback
        self._connection = connection
        head = request_head("POST", urlsplit(fallback.url).path, connection.netloc, fallback.headers)
        # The head up to its empty line; each push adds its Content-Length and the empty line.
        self._head = head[:-2].encode("latin-1")
        self._direct = True
        # Pushes made on each path (for tests and the benchmark).
        self.direct_posts = 0
        self.client_posts = 0

    @classmethod
    def from_client(cls, client: Any, encoding: str | None = None) -> DirectSeriesIntake:
        """The same host, keys, TLS settings, user agent and timeouts as a datadog-api-client ApiClient, which
        also carries every push that fails on the direct connection."""
        fallback = SeriesIntake(client, encoding)
        cfg = client.configuration
        connection = Http1Connection(
            cfg.host,
            timeout=fallback.read_timeout or DEFAULT_TIMEOUT_S,
            verify=bool(cfg.verify_ssl),
            ca_file=cfg.ssl_ca_cert,
        )
        return cls(fallback, connection)

    def post(self, compressed: bytes) -> None:
        """Send one payload; 2xx or IntakeError (from the client's path)."""
        if self._direct:
            if self._post_direct(compressed):
                self.direct_posts += 1
                return
            self._direct = False
        self.client_posts += 1
        self._fallback.post(compressed)
        self._direct = True

    def _post_direct(self, compressed: bytes) -> bool:
        """Whether the intake took the payload (2xx) on the kept connection; a connection the server closed while
        it was idle is reopened before sending, not after."""
        connection = self._connection
        connection.dropped()
        request = b"%sContent-Length: %d\r\n\r\n%s" % (self._head, len(compressed), compressed)
        try:
            status, _, _ = connection.exchange(request, MAX_ANSWER_BYTES)
        except OSError:
            return False
        return 200 <= status <= 299

    @property
    def connected(self) -> bool:
        """Whether the direct connection is held."""
        return self._connection.open

    def close(self) -> None:
        """Close the direct connection (the client's pool is the client's)."""
        self._connection.close()
