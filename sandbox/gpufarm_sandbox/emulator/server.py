"""Serve a WSGI app (the sandbox, with or without the function host) on a loopback port in a thread."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server


class _QuietHandler(WSGIRequestHandler):
    """Request logs go to the `gpufarm_sandbox.emulator.http` logger at DEBUG instead of stderr."""

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        logging.getLogger("gpufarm_sandbox.emulator.http").debug("%s %s %s", self.command, self.path, code)


class ServerThread:
    """A threaded HTTP server in a daemon thread; `port=0` picks a free port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        # Bound here, so a busy port raises OSError (EADDRINUSE) to the caller; werkzeug's own bind would print
        # and exit the process instead.
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(128)
            self._server: BaseWSGIServer = make_server(
                host, port, app, threaded=True, request_handler=_QuietHandler, fd=listener.fileno()
            )
        finally:
            listener.close()  # the server holds its own descriptor of the socket
        self.host = host
        self.port: int = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"http-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """Base URL, no trailing slash."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerThread:
        """Start serving; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted."""
        self._server.serve_forever()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
