"""moto's S3 server, with presigned URLs checked as S3 checks them.

moto (5.x) stores what a presigned URL sends without checking its signature, so a URL signed for one key would
store another there; S3 refuses that (SigV4's signature covers the method, the bucket and key, the query and the
signed headers: docs/slack-lambda.md, "S3 presigned URLs"). This server sits in front of moto's application and
checks every request that carries a query signature the way S3 does (the canonical request rebuilt from what
arrived, signed with the local stand-in key through botocore's own SigV4 query signer, compared, and the URL's
expiry) before moto sees it; a request with neither a query signature nor an Authorization header is refused as a
private bucket refuses it. Calls signed in their Authorization header (gpufarm's own clients) go to moto as they
came.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from threading import Thread
from typing import Any
from urllib.parse import parse_qsl, quote

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
_ALGORITHM = "AWS4-HMAC-SHA256"


class PresignedChecked:
    """WSGI middleware: refuse (403, S3's error document) a presigned request S3 would refuse."""

    def __init__(self, app: WsgiApp, keys: Mapping[str, str], now: Callable[[], float] = time.time) -> None:
        self.app = app
        self.keys = dict(keys)
        self.now = now

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        query = str(environ.get("QUERY_STRING") or "")
        if "X-Amz-Signature=" in query:
            refusal = self.refusal(environ, query)
        elif environ.get("HTTP_AUTHORIZATION"):
            refusal = None
        else:
            refusal = ("AccessDenied", "Anonymous access to this bucket is refused")
        if refusal is None:
            return self.app(environ, start_response)
        code, message = refusal
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
        ).encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def refusal(self, environ: Mapping[str, Any], query: str) -> tuple[str, str] | None:
        """None when the query signature is the one S3 would compute for this request, else (code, message)."""
        pairs = parse_qsl(query, keep_blank_values=True)
        params = dict(pairs)
        try:
            access_key, _, region, service, _ = params["X-Amz-Credential"].split("/")
            stamp = params["X-Amz-Date"]
            expires = int(params["X-Amz-Expires"])
            signed = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        except (KeyError, ValueError):
            return ("AuthorizationQueryParametersError", "The query parameters are not a SigV4 presigned URL")
        if params.get("X-Amz-Algorithm") != _ALGORITHM or service != "s3":
            return ("AuthorizationQueryParametersError", "Only AWS4-HMAC-SHA256 for s3 is accepted")
        secret = self.keys.get(access_key)
        if secret is None:
            return ("InvalidAccessKeyId", "The access key is not one this server knows")
        if self.now() > signed + expires:
            return ("AccessDenied", "Request has expired")
        if params.get("X-Amz-SignedHeaders") != "host":
            return ("AccessDenied", "Only URLs that sign the host header are accepted here")
        raw = str(environ.get("RAW_URI") or environ.get("REQUEST_URI") or quote(str(environ.get("PATH_INFO", ""))))
        path = raw.split("?", 1)[0]
        unsigned = "&".join(f"{k}={quote(v, safe='-_.~')}" for k, v in pairs if k != "X-Amz-Signature")
        host = str(environ.get("HTTP_HOST") or "")
        request = AWSRequest(method=str(environ.get("REQUEST_METHOD")), url=f"http://{host}{path}?{unsigned}")
        request.headers["host"] = host
        request.context["timestamp"] = stamp
        auth = S3SigV4QueryAuth(Credentials(access_key, secret), "s3", region, expires=expires)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        if not hmac.compare_digest(expected, params["X-Amz-Signature"]):
            return (
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided",
            )
        return None


class CheckedMotoServer(ThreadedMotoServer):
    """moto's threaded server with PresignedChecked in front of its application."""

    def __init__(self, keys: Mapping[str, str], ip_address: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(ip_address=ip_address, port=port, verbose=False)
        self._keys = dict(keys)
        self._failed: BaseException | None = None

    def _server_entry(self) -> None:
        app = PresignedChecked(DomainDispatcherApplication(create_backend_app), self._keys)
        try:
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        except BaseException as exc:
            self._failed = exc
            raise
        finally:
            self._server_ready_event.set()
        self._server.serve_forever()

    def start(self) -> None:
        """Serve on a daemon thread; returns once the socket listens (raises what stopped it from listening)."""
        self._thread = Thread(target=self._server_entry, daemon=True)
        self._thread.start()
        self._server_ready_event.wait()
        if self._failed is not None:
            raise RuntimeError(f"moto's S3 server did not start: {self._failed}") from self._failed
