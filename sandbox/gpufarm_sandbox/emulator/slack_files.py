"""Sandbox module part: Slack's external file upload (files.getUploadURLExternal, the upload URL, then
files.completeUploadExternal), as slack_sdk's `files_upload_v2` drives it.

Step 1 reserves a file id and hands out an upload URL this sandbox serves itself (`/slack/upload/<token>`, a
capability: no bot token, as Slack's files.slack.com URLs); step 2 POSTs the raw bytes there (HTTP 200 `OK - <n>`);
step 3 shares the uploaded files into a channel, with the initial comment as the message Slack posts. A file
reserved but never uploaded cannot be completed (`file_not_found`-like errors as Slack names them). Every file is
kept, bytes and all, so a test or the demo reads it back: `GET /_sandbox/slack/files` lists them,
`GET /_sandbox/slack/files/<id>` answers the bytes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.slack_workspace import SlackFailure
from gpufarm_sandbox.emulator.web import Auth, Route, json_response, slack_error

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.context import SandboxContext
    from gpufarm_sandbox.emulator.slack_state import SlackState

# Slack's own ceiling is 1 GB; the sandbox keeps files in memory, so it refuses what no gpufarm report reaches.
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_FILES_KEPT = 1_000
MAX_FILENAME = 255
MAX_TITLE = 255
MAX_FILES_PER_COMPLETE = 10
MAX_ALT_TXT = 1000
UPLOAD_TTL_S = 600.0  # an upload URL is good for a few minutes


@dataclass
class StoredFile:
    """One file: reserved by step 1, its bytes by step 2, shared by step 3."""

    id: str
    filename: str
    length: int
    created: float
    token: str
    title: str = ""
    content: bytes | None = None
    completed: bool = False
    channels: list[str] = field(default_factory=list)
    initial_comment: str | None = None
    message_ts: str | None = None
    snippet_type: str | None = None
    alt_txt: str | None = None

    def public(self) -> dict[str, Any]:
        """The file object Slack answers completeUploadExternal with (the subset gpufarm's clients read)."""
        return {
            "id": self.id,
            "created": int(self.created),
            "timestamp": int(self.created),
            "name": self.filename,
            "title": self.title or self.filename,
            "mimetype": _mimetype(self.filename),
            "filetype": self.filename.rsplit(".", 1)[-1].lower() if "." in self.filename else "binary",
            "pretty_type": self.filename.rsplit(".", 1)[-1].upper() if "." in self.filename else "Binary",
            "user": "",
            "size": self.length,
            "is_external": False,
            "is_public": True,
            "channels": list(self.channels),
            "shares": {"public": {c: [{"ts": self.message_ts}] for c in self.channels}} if self.channels else {},
        }

    def inspect(self) -> dict[str, Any]:
        """Shape of `GET /_sandbox/slack/files`: what the file is and where it went, without its bytes."""
        return {
            **self.public(),
            "uploaded": self.content is not None,
            "completed": self.completed,
            "initial_comment": self.initial_comment,
            "message_ts": self.message_ts,
        }


def _mimetype(filename: str) -> str:
    ext = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    return {
        "csv": "text/csv",
        "txt": "text/plain",
        "json": "application/json",
        "html": "text/html",
        "png": "image/png",
        "pdf": "application/pdf",
    }.get(ext, "application/octet-stream")


class SlackFiles:
    """Files uploaded to the sandbox's workspace; its methods run under the sandbox lock (SlackModule calls them)."""

    def __init__(self, context: SandboxContext, state: SlackState) -> None:
        self.ctx = context
        self.state = state
        self.files: dict[str, StoredFile] = {}
        self._by_token: dict[str, str] = {}
        self._seq = 0

    def routes(self) -> list[Route]:
        """The upload URL (no auth: the URL is the capability) and the inspection endpoints."""
        return [
            Route("/slack/upload/<token>", ("POST",), self._upload, Auth.NONE),
            Route("/_sandbox/slack/files", ("GET",), self._files_get, Auth.NONE),
            Route("/_sandbox/slack/files/<file_id>", ("GET",), self._file_content, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget every file."""
        self.files.clear()
        self._by_token.clear()
        self._seq = 0

    def dump(self) -> list[dict[str, Any]]:
        """Every file's metadata (never its bytes, never its upload token)."""
        return [f.inspect() for f in self.files.values()]

    # -- step 1 ------------------------------------------------------------------------------------------------------

    def get_upload_url(self, args: dict[str, Any]) -> dict[str, Any]:
        """files.getUploadURLExternal: validate filename and length, reserve a file id, hand out its upload URL."""
        filename = args.get("filename")
        if not isinstance(filename, str) or not filename.strip():
            raise SlackFailure("invalid_arguments")
        if len(filename) > MAX_FILENAME or any(ch in filename for ch in "/\\\x00"):
            raise SlackFailure("invalid_arguments")
        length = _int(args.get("length"))
        if length is None:
            raise SlackFailure("invalid_arguments")
        if length <= 0:
            raise SlackFailure("missing_argument")  # Slack's answer to length 0
        if length > MAX_FILE_BYTES:
            raise SlackFailure("file_upload_size_restricted")
        alt_txt = args.get("alt_txt")
        if isinstance(alt_txt, str) and len(alt_txt) > MAX_ALT_TXT:
            raise SlackFailure("alt_txt_too_large")
        self._seq += 1
        file_id = f"F{self._seq:010d}"
        token = secrets.token_urlsafe(18)
        snippet = args.get("snippet_type")
        self.files[file_id] = StoredFile(
            id=file_id,
            filename=filename,
            length=length,
            created=self.ctx.clock.now(),
            token=token,
            snippet_type=snippet if isinstance(snippet, str) and snippet else None,
            alt_txt=alt_txt if isinstance(alt_txt, str) and alt_txt else None,
        )
        self._by_token[token] = file_id
        self._trim()
        return {"upload_url": f"{self.ctx.base_url}/slack/upload/{token}", "file_id": file_id}

    def _trim(self) -> None:
        while len(self.files) > MAX_FILES_KEPT:
            oldest = next(iter(self.files))
            self._by_token.pop(self.files.pop(oldest).token, None)

    # -- step 2 ------------------------------------------------------------------------------------------------------

    def _upload(self, request: Request, token: str) -> Response:
        # The upload host is not the Web API, so injected faults are picked here (as for response_urls).
        fault = self.ctx.faults.pick(request.path)
        if fault is not None:
            response = Response("rate_limited" if fault == 429 else "service_unavailable", status=fault)
            if fault == 429:
                response.headers["Retry-After"] = "1"
            return response
        if (request.content_length or 0) > MAX_FILE_BYTES:
            return Response("file_too_large", status=413)
        data = request.get_data(cache=False)
        with self.ctx.lock:
            file_id = self._by_token.get(token)
            stored = self.files.get(file_id) if file_id else None
            if stored is None:
                return Response("not_found", status=404)
            if self.ctx.clock.now() - stored.created > UPLOAD_TTL_S:
                return Response("expired_url", status=404)
            if stored.completed:
                return Response("already_completed", status=400)
            if len(data) != stored.length:
                # Slack checks the bytes against the length step 1 announced.
                return Response("length_mismatch", status=400)
            stored.content = bytes(data)
        return Response(f"OK - {len(data)}", status=200, content_type="text/plain; charset=utf-8")

    # -- step 3 ------------------------------------------------------------------------------------------------------

    def complete(self, args: dict[str, Any]) -> dict[str, Any]:
        """files.completeUploadExternal: title the uploaded files and share them (with the comment) to a channel."""
        chosen = [self._uploaded(item) for item in _file_items(args.get("files"))]
        channel = self._channel(args)
        comment = args.get("initial_comment")
        comment = comment if isinstance(comment, str) and comment.strip() else None
        fresh = [stored for stored, _ in chosen if not stored.completed]
        for stored, title in chosen:
            stored.title = title
        # A retried completion (its first answer lost to a 5xx) shares nothing twice.
        if channel is not None and fresh:
            self._share(fresh, channel, comment, args.get("thread_ts") or None)
        for stored in fresh:
            stored.completed = True
        return {"files": [stored.public() for stored, _ in chosen]}

    def _uploaded(self, item: Any) -> tuple[StoredFile, str]:
        """One `files` entry of a completion: its uploaded file and the title it gets."""
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise SlackFailure("invalid_arguments")
        stored = self.files.get(item["id"])
        if stored is None:
            raise SlackFailure("file_not_found")
        if stored.content is None:
            raise SlackFailure("file_uploads_not_completed")
        title = item.get("title")
        title = title if isinstance(title, str) and title.strip() else stored.filename
        if len(title) > MAX_TITLE:
            raise SlackFailure("invalid_arguments")
        return stored, title

    def _share(self, fresh: list[StoredFile], channel: str, comment: str | None, thread_ts: Any) -> None:
        """One message in the channel carrying the files (and the comment)."""
        message = self.state.new_message(
            "message",
            channel,
            comment or "",
            None,
            thread_ts=str(thread_ts) if thread_ts else None,
        )
        message.files = [stored.id for stored in fresh]
        for stored in fresh:
            stored.channels.append(channel)
            stored.message_ts = message.ts
            stored.initial_comment = comment

    def _channel(self, args: dict[str, Any]) -> str | None:
        raw = args.get("channel_id") or args.get("channels")
        if not raw:
            return None
        # gpufarm shares into one channel; of a comma-separated `channels` list the first is taken.
        return self.state.resolve_channel(str(raw).split(",")[0].strip())

    # -- inspection --------------------------------------------------------------------------------------------------

    def _files_get(self, request: Request) -> Response:
        channel = request.args.get("channel")
        with self.ctx.lock:
            found = [f.inspect() for f in self.files.values() if not channel or channel in f.channels]
        return json_response({"files": found})

    def _file_content(self, request: Request, file_id: str) -> Response:
        with self.ctx.lock:
            stored = self.files.get(file_id)
            content = stored.content if stored is not None else None
            mimetype = _mimetype(stored.filename) if stored is not None else "application/octet-stream"
        if content is None:
            return slack_error("file_not_found", 404)
        return Response(content, status=200, content_type=mimetype)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 20:
        return int(value.strip())
    return None


def _file_items(items: Any) -> list[Any]:
    """The `files` argument of a completion: a JSON list (or its text) of 1 to 10 entries."""
    if isinstance(items, str):
        try:
            items = json.loads(items)
        except ValueError:
            raise SlackFailure("invalid_arguments") from None
    if not isinstance(items, list) or not items or len(items) > MAX_FILES_PER_COMPLETE:
        raise SlackFailure("invalid_arguments")
    return items
