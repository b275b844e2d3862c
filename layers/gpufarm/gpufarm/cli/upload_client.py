"""The researcher's side of a profiler upload: plain HTTP to gpufarm's upload function, with an upload token only.

`begin` states the runs and gets a presigned PUT URL per trace, each trace is PUT to its URL (S3), and `complete`
has the function analyse, store and record them (gpufarm.handlers.profile_upload). Nothing here holds or needs a
Datadog key, a link secret or an AWS credential.

Every request has bounded timeouts and is retried within bounds (MAX_ATTEMPTS, backing off) on 429, 5xx, a
connection error or a timeout; a 4xx is the function's refusal, raised at once as Refused with its reason. What
still fails after the retries is ServiceFailed. The token goes only in the Authorization header of the calls to
the function, never to S3, into a message or a log.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

MAX_ATTEMPTS = 4
BACKOFF_S = (1.0, 2.0, 4.0)
CALL_TIMEOUT_S = 30.0
# complete analyses the traces before it answers: up to the function's 300 s Timeout, and the URL's own margin.
COMPLETE_TIMEOUT_S = 330.0
PUT_TIMEOUT_S = 120.0  # between two reads or writes of the socket, not for the whole PUT
MAX_ANSWER_BYTES = 256 * 1024
_CHUNK = 1 << 20

Progress = Callable[[int], None]


class Refused(Exception):
    """The function (or S3) refused the request: a 4xx and its reason. Nothing was stored."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{reason} (HTTP {status})")
        self.status = status
        self.reason = reason


class ServiceFailed(Exception):
    """The function or S3 failed, or could not be reached, after the retries."""


@dataclass(frozen=True)
class Trace:
    """One file to upload, as the run it becomes."""

    path: Path
    run: str
    size: int


@dataclass(frozen=True)
class Stored:
    """One run taken in, as `complete` answers it."""

    name: str
    steps: int
    step_mean_ms: float | None
    link: str
    recorded: bool


class UploadClient:
    """Calls to one deployment's upload function with one upload token."""

    def __init__(self, api_url: str, token: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
        parts = urlsplit(api_url)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ValueError("GPUFARM_API_URL is not an http(s) URL")
        self.base = api_url.rstrip("/")
        self._token = token
        self._sleep = sleep

    def upload(self, ir: int, traces: Sequence[Trace], batch_size: int | None, progress: Progress) -> list[Stored]:
        """begin, PUT each trace, complete: the runs as the function stored them."""
        runs = [{"name": t.run, "bytes": t.size, "file": _file_name(t.path)} for t in traces]
        begun = self._call("/begin", {"ir": ir, "batch_size": batch_size, "runs": runs}, CALL_TIMEOUT_S)
        urls = {str(r.get("name")): str(r.get("url")) for r in begun.get("runs", []) if isinstance(r, dict)}
        ticket = begun.get("upload")
        if not isinstance(ticket, str) or set(urls) != {t.run for t in traces}:
            raise ServiceFailed("the upload function's answer to begin is not what gpufarm sends")
        for trace in traces:
            self._put(urls[trace.run], trace, progress)
        done = self._call("/complete", {"upload": ticket}, COMPLETE_TIMEOUT_S)
        out = []
        for run in done.get("runs", []):
            try:
                out.append(
                    Stored(
                        name=str(run["name"]),
                        steps=int(run["steps"]),
                        step_mean_ms=None if run.get("step_mean_ms") is None else float(run["step_mean_ms"]),
                        link=str(run["link"]),
                        recorded=bool(run.get("recorded")),
                    )
                )
            except (KeyError, TypeError, ValueError):
                raise ServiceFailed("the upload function's answer to complete is not what gpufarm sends") from None
        return out

    def _call(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}

        def once() -> bytes:
            request = urllib.request.Request(self.base + path, data=data, headers=headers, method="POST")  # noqa: S310
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - the deployment's URL
                return bytes(answer.read(MAX_ANSWER_BYTES + 1))

        raw = self._retried(once, f"POST {path}")
        try:
            value = json.loads(raw) if len(raw) <= MAX_ANSWER_BYTES else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ServiceFailed(f"POST {path}: the answer is not gpufarm's")
        return value

    def _put(self, url: str, trace: Trace, progress: Progress) -> None:
        if urlsplit(url).scheme not in ("https", "http"):
            raise ServiceFailed("the upload function gave a URL that is not http(s)")

        def once() -> bytes:
            with trace.path.open("rb") as handle:
                body = _Counting(handle, progress)
                # No Authorization header: the URL carries its own signature, and the token never goes to S3.
                headers = {"Content-Length": str(trace.size), "Content-Type": "application/octet-stream"}
                request = urllib.request.Request(url, data=body, headers=headers, method="PUT")  # noqa: S310
                try:
                    with urllib.request.urlopen(request, timeout=PUT_TIMEOUT_S) as answer:  # noqa: S310
                        return bytes(answer.read(MAX_ANSWER_BYTES))
                except BaseException:
                    progress(-body.sent)  # a retried PUT sends this trace from its start again
                    raise

        self._retried(once, f"PUT {trace.run}")

    def _retried(self, once: Callable[[], bytes], what: str) -> bytes:
        last = "no answer"
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                self._sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
            try:
                return once()
            except urllib.error.HTTPError as exc:
                if exc.code == 429 or exc.code >= 500:
                    last = f"HTTP {exc.code}"
                    continue
                raise Refused(exc.code, _reason(exc)) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = type(getattr(exc, "reason", exc)).__name__
                continue
        raise ServiceFailed(f"{what} failed after {MAX_ATTEMPTS} attempts ({last}); nothing was recorded, try again")


class _Counting:
    """A file read for an HTTP body, telling progress what went out."""

    def __init__(self, handle: IO[bytes], progress: Progress) -> None:
        self.handle = handle
        self.progress = progress
        self.sent = 0

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(_CHUNK if size is None or size < 0 else min(size, _CHUNK))
        self.sent += len(data)
        self.progress(len(data))
        return data


def _reason(exc: urllib.error.HTTPError) -> str:
    """The function's short reason (`{"error": ...}`), or S3's error code; never more than a line."""
    try:
        raw = exc.read(4096)
    except OSError:
        raw = b""
    try:
        value = json.loads(raw)
        text = str(value.get("error")) if isinstance(value, dict) and value.get("error") else ""
    except ValueError:
        text = ""
    if not text and b"<Code>" in raw:
        text = "storage refused the trace: " + raw.split(b"<Code>", 1)[1].split(b"<", 1)[0].decode("ascii", "replace")
    return " ".join((text or "refused").split())[:300]


def _file_name(path: Path) -> str:
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
    name = "".join(c if c in allowed else "_" for c in path.name)[:100]
    return name or "trace.json"
