"""Slack adapter: core.kernel.ports.Chat over slack_sdk's WebClient and WebhookClient, and request signature checks.

On the Slack ingress path (3-second budget) this module is imported first, so it imports only slack_sdk pieces
(~70 ms) and nothing from datadog_api_client. 429s are retried a bounded number of times honouring Retry-After
(slack_sdk does not retry them by default); every failure becomes a SlackError carrying Slack's error code, never
the token.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.client import WebClient

from gpufarm.adapters import time_budget

# The signature check lives beside this module, on the standard library alone (the ingress checks signatures
# without importing slack_sdk); re-exported for those who take it from here.
from gpufarm.adapters.slack_signature import SignatureCheck as SignatureCheck  # noqa: PLC0414
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed

if TYPE_CHECKING:
    from slack_sdk.webhook import WebhookResponse

    from gpufarm.config import Settings

log = logging.getLogger(__name__)

USERGROUP_TTL_S = 60.0  # usergroups.users.list is Tier 2: cache members for a minute
DEFAULT_MAX_RETRY_WAIT_S = 30.0
# Uploads: gpufarm shares reports (CSV, HTML); Slack would take 1 GB, but nothing gpufarm writes nears 20 MiB, and a
# Lambda holds the bytes in memory.
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_UPLOAD_TITLE = 255
MAX_UPLOAD_COMMENT = 4000
# A plain file name: no path, no control characters, an extension Slack can type the file by.
UPLOAD_FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,119}\.[A-Za-z0-9]{1,10}$")
UPLOAD_RETRY_STATUSES = (429, 500, 502, 503, 504)
# The header in which Slack names the scopes a token holds, comma-separated.
SCOPES_HEADER = "x-oauth-scopes"


class SlackError(UpstreamError):
    """A Slack call failed after bounded retries; `code` is Slack's error code (e.g. `channel_not_found`)."""

    def __init__(self, method: str, code: str, status: int | None = None) -> None:
        super().__init__(f"slack {method} failed: {code}" + (f" (HTTP {status})" if status else ""))
        self.method = method
        self.code = code
        self.status = status


class BoundedRateLimitRetryHandler(RateLimitErrorRetryHandler):
    """Retries 429 after Retry-After seconds (plus jitter), but never waits longer than `max_wait`."""

    def __init__(
        self,
        max_retry_count: int = 2,
        *,
        max_wait: float = DEFAULT_MAX_RETRY_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.max_wait = max_wait
        self._sleep = sleep

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        # Give up at once when Slack asks for a wait beyond our bound (an ingress cannot sleep 30 s) or beyond what
        # is left of the invocation (gpufarm.adapters.time_budget).
        wait = _retry_after(response) if response is not None else 1.0
        return (
            bool(super()._can_retry(state=state, request=request, response=response, error=error))
            and (response is None or wait <= self.max_wait)
            and time_budget.allows(min(wait, self.max_wait))
        )

    def prepare_for_next_attempt(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        """Sleep for Retry-After (bounded) and count the attempt."""
        wait = _retry_after(response) if response is not None else 1.0
        state.next_attempt_requested = True
        self._sleep(min(wait, self.max_wait) + random.uniform(0, 0.1))  # noqa: S311 - jitter, not crypto
        state.increment_current_attempt()


class GatewayErrorRetryHandler(ServerErrorRetryHandler):
    """slack_sdk's server-error retry (500, 503) widened to the gateway statuses 502 and 504."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code not in (500, 502, 503, 504):
            return False
        # The backoff slack_sdk would sleep before the next attempt, if the invocation has that long left.
        return time_budget.allows(self.interval_calculator.calculate_sleep_duration(state.current_attempt))


def _retry_after(response: HttpResponse) -> float:
    for name, values in response.headers.items():
        if name.lower() == "retry-after" and values:
            try:
                return max(0.0, float(values[0]))
            except (TypeError, ValueError):
                return 1.0
    return 1.0


def retry_handlers(max_retries: int, max_wait: float) -> list[RetryHandler]:
    """Bounded retries: connection errors once, 429 and 5xx up to max_retries times."""
    return [
        ConnectionErrorRetryHandler(max_retry_count=1),
        BoundedRateLimitRetryHandler(max_retry_count=max_retries, max_wait=max_wait),
        GatewayErrorRetryHandler(max_retry_count=max_retries),
    ]


class SlackChat:
    """core.kernel.ports.Chat over slack_sdk; one instance per container, safe to share between threads."""

    def __init__(
        self,
        token: str,
        *,
        base_url: str = "https://slack.com/api/",
        timeout: float = 10.0,
        max_retries: int = 2,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT_S,
        usergroup_ttl: float = USERGROUP_TTL_S,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not token:
            raise ValueError("a Slack bot token is required")
        self.timeout = timeout
        self._max_retries = max_retries
        self._max_retry_wait = max_retry_wait
        self._sleep = sleep
        self._handlers = retry_handlers(max_retries, max_retry_wait)
        self.client = WebClient(
            token=token,
            base_url=base_url if base_url.endswith("/") else base_url + "/",
            timeout=max(1, round(timeout)),
            retry_handlers=self._handlers,
        )
        self._usergroup_ttl = usergroup_ttl
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._usergroups: dict[str, tuple[float, frozenset[str]]] = {}
        self._dms: dict[str, str] = {}

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT_S,
    ) -> SlackChat:
        """Build from gpufarm settings (token, API URL, timeout, retries); the ingress passes tighter bounds."""
        if settings.secrets_name:
            settings.require("slack_bot_token")  # ConfigurationMissing naming the secret, or the function not given it
        if settings.slack_bot_token is None:
            raise ValueError("SLACK_BOT_TOKEN (or the secret key slack_bot_token) is not set")
        return cls(
            settings.slack_bot_token.get_secret_value(),
            base_url=settings.slack_api_url,
            timeout=timeout if timeout is not None else settings.http_timeout,
            max_retries=max_retries if max_retries is not None else min(settings.max_retries, 3),
            max_retry_wait=max_retry_wait,
        )

    # -- calls -----------------------------------------------------------------------------------------------------

    def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        """One Web API call through slack_sdk's own method; failures become SlackError (the token never appears)."""
        # slack_sdk's method names: chat.postMessage -> chat_postMessage (it picks JSON or form bodies as Slack does).
        call = getattr(self.client, method.replace(".", "_"))
        return self._checked(method, lambda: call(**{k: v for k, v in kwargs.items() if v is not None}))[0]

    def _checked(self, method: str, call: Callable[[], Any]) -> tuple[dict[str, Any], Mapping[str, Any]]:
        """Run one slack_sdk call: its data and HTTP headers, or a SlackError with Slack's code."""
        try:
            response = call()
        except SlackApiError as exc:
            raw = exc.response.data
            code = str(raw.get("error") or "unknown_error") if isinstance(raw, dict) else "invalid_response"
            raise SlackError(method, code, exc.response.status_code) from None
        except (SlackClientError, urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise SlackError(method, f"connection_error: {type(exc).__name__}") from None
        data = response.data
        if not isinstance(data, dict):
            raise SlackError(method, "invalid_response")
        return data, response.headers or {}

    def auth_test(self) -> dict[str, Any]:
        """Who the token is (bot user and bot id); a cheap credentials check."""
        return self._call("auth.test")

    def token_scopes(self) -> frozenset[str] | None:
        """The scopes the bot token was granted, from auth.test's `x-oauth-scopes` header (Slack sends it on every
        Web API answer); None when the answer does not carry it."""
        _, headers = self._checked("auth.test", self.client.auth_test)
        for name, value in headers.items():
            if name.lower() == SCOPES_HEADER:
                text = ",".join(value) if isinstance(value, list) else str(value)
                return frozenset(scope.strip() for scope in text.split(",") if scope.strip())
        return None

    def is_member(self, channel: str) -> bool:
        """Whether the bot is in a channel (conversations.info's `is_member`; needs channels:read, and Slack asks
        groups:read for a private channel, which gpufarm's app does not hold: that answers `missing_scope`)."""
        data = self._call("conversations.info", channel=channel)
        info = data.get("channel")
        return isinstance(info, dict) and info.get("is_member") is True

    def post_message(
        self,
        channel: str,
        text: str,
        blocks: Sequence[Mapping[str, Any]] | None = None,
        *,
        thread_ts: str | None = None,
    ) -> str:
        """Post to a channel or DM; returns the message ts."""
        data = self._call("chat.postMessage", channel=channel, text=text, blocks=_blocks(blocks), thread_ts=thread_ts)
        return str(data["ts"])

    def update_message(
        self, channel: str, ts: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Rewrite a message the app posted."""
        self._call("chat.update", channel=channel, ts=ts, text=text, blocks=_blocks(blocks))

    def post_ephemeral(
        self, channel: str, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Show a message to one user in a channel."""
        self._call("chat.postEphemeral", channel=channel, user=user, text=text, blocks=_blocks(blocks))

    def open_view(self, trigger_id: str, view: Mapping[str, Any]) -> str:
        """Open a modal (within 3 s of the trigger); returns the view id."""
        data = self._call("views.open", trigger_id=trigger_id, view=dict(view))
        return str(data["view"]["id"])

    def update_view(self, view_id: str, view: Mapping[str, Any], *, hash: str | None = None) -> None:  # noqa: A002
        """Replace an open modal; pass the last hash to fail with `hash_conflict` instead of overwriting."""
        self._call("views.update", view_id=view_id, view=dict(view), hash=hash)

    def publish_home(self, user: str, view: Mapping[str, Any]) -> None:
        """Publish a user's App Home tab (views.publish: the whole view, replacing the last one)."""
        self._call("views.publish", user_id=user, view=dict(view))

    def open_dm(self, user: str) -> str:
        """The DM channel id with a user (stable, so remembered per container)."""
        with self._lock:
            cached = self._dms.get(user)
        if cached:
            return cached
        data = self._call("conversations.open", users=user)
        channel = str(data["channel"]["id"])
        with self._lock:
            self._dms[user] = channel
        return channel

    def user_name(self, user: str) -> str:
        """A user's display name, else real name, else handle; the id when Slack cannot say."""
        try:
            data = self._call("users.info", user=user)
        except SlackError as exc:
            log.warning("users.info for %s failed (%s); showing the id", user, exc.code)
            return user
        info = data.get("user") or {}
        profile = info.get("profile") or {}
        for candidate in (
            profile.get("display_name"),
            profile.get("real_name"),
            info.get("real_name"),
            info.get("name"),
        ):
            if isinstance(candidate, str) and candidate.strip():
                return candidate.strip()
        return user

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        """User ids in a user group, cached for a minute (the method is Tier 2); failures raise, never 'nobody'."""
        now = self._monotonic()
        with self._lock:
            cached = self._usergroups.get(usergroup)
        if cached and now - cached[0] < self._usergroup_ttl:
            return cached[1]
        data = self._call("usergroups.users.list", usergroup=usergroup)
        members = frozenset(str(u) for u in data.get("users") or [])
        with self._lock:
            self._usergroups[usergroup] = (now, members)
        return members

    def tell_user(self, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        """DM a user (conversations.open + chat.postMessage); returns the ts."""
        return self.post_message(self.open_dm(user), text, blocks)

    def upload_file(
        self, channel: str, filename: str, content: bytes, *, title: str, initial_comment: str | None = None
    ) -> str:
        """Share a file into a channel through slack_sdk's files_upload_v2; returns the file id.

        files_upload_v2 makes three requests: files.getUploadURLExternal, a POST of the bytes to the URL it answers,
        then files.completeUploadExternal. The two Web API calls are retried by the client's handlers; the POST
        goes through plain urllib without them, so a 429/5xx there restarts the upload with a fresh URL, at most
        `max_retries` times (the file reserved by the failed attempt is never completed, so never shown).
        """
        check_upload(channel, filename, content, title=title, initial_comment=initial_comment)
        for attempt in range(self._max_retries + 1):
            try:
                response = self.client.files_upload_v2(
                    channel=channel,
                    filename=filename,
                    content=content,
                    title=title,
                    initial_comment=initial_comment,
                )
            except SlackApiError as exc:
                raw = exc.response.data
                code = str(raw.get("error") or "unknown_error") if isinstance(raw, dict) else "invalid_response"
                raise SlackError("files.upload", code, exc.response.status_code) from None
            except urllib.error.HTTPError as exc:
                # The upload URL answered an error (slack_sdk's urlopen raises for any non-2xx status).
                if exc.code in UPLOAD_RETRY_STATUSES and attempt < self._max_retries:
                    wait = _header_seconds(exc.headers.get("Retry-After") if exc.headers else None)
                    if wait <= self._max_retry_wait:
                        log.warning("upload of %s answered HTTP %s; retrying", filename, exc.code)
                        self._sleep(wait + random.uniform(0, 0.1))  # noqa: S311 - jitter, not crypto
                        continue
                raise SlackError("files.upload", "upload_failed", exc.code) from None
            except (SlackRequestError, SlackClientError, urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                raise SlackError("files.upload", f"connection_error: {type(exc).__name__}") from None
            return _file_id(response.data)
        raise SlackError("files.upload", "upload_failed")  # pragma: no cover - the loop returns or raises

    # -- response_url ----------------------------------------------------------------------------------------------

    def respond(
        self,
        response_url: str,
        text: str,
        blocks: Sequence[Mapping[str, Any]] | None = None,
        *,
        replace_original: bool = False,
        in_channel: bool = False,
    ) -> None:
        """Answer through a response_url (at most 5 uses in 30 minutes); 429/5xx retried, other failures raise."""
        self._send(
            response_url,
            {
                "text": text,
                "blocks": _blocks(blocks),
                "response_type": "in_channel" if in_channel else None,
                "replace_original": True if replace_original else None,
            },
        )

    def delete_original(self, response_url: str) -> None:
        """Delete the message that carried the clicked button (`delete_original` must be the only attribute)."""
        self._send(response_url, {"delete_original": True})

    def _send(self, response_url: str, body: dict[str, Any]) -> None:
        from slack_sdk.webhook import WebhookClient

        parts = urlsplit(response_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SlackError("response_url", "invalid_response_url")
        client = WebhookClient(response_url, timeout=max(1, round(self.timeout)), retry_handlers=self._handlers)
        try:
            response: WebhookResponse = client.send_dict({k: v for k, v in body.items() if v is not None})
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise SlackError("response_url", f"connection_error: {type(exc).__name__}") from None
        if response.status_code != 200:
            # Slack answers webhook errors with a short text code (used_url, expired_url, invalid_blocks, ...).
            code = (response.body or "").strip()[:100] or "http_error"
            raise SlackError("response_url", code, response.status_code)


def check_upload(
    channel: str, filename: str, content: bytes, *, title: str, initial_comment: str | None = None
) -> None:
    """Refuse an upload gpufarm must not send (ValidationFailed names the argument); nothing is sent then."""
    _check_destination(channel, filename)
    _check_file(content, title, initial_comment)


def _check_destination(channel: str, filename: str) -> None:
    """The channel it is shared into and the file's name."""
    if not isinstance(channel, str) or not channel.strip() or len(channel) > 80:
        raise ValidationFailed("channel", "the channel to share the file into is missing or too long")
    if not isinstance(filename, str) or not UPLOAD_FILENAME_RE.match(filename) or ".." in filename:
        raise ValidationFailed(
            "filename", "a file name is letters, digits, '.', '_' or '-' (at most 130) with an extension, no path"
        )


def _check_file(content: bytes, title: str, initial_comment: str | None) -> None:
    """The bytes, the title and the comment shared with them."""
    if not isinstance(content, bytes | bytearray) or not content:
        raise ValidationFailed("content", "the file is empty")
    if len(content) > MAX_UPLOAD_BYTES:
        raise ValidationFailed("content", f"the file is {len(content)} bytes; at most {MAX_UPLOAD_BYTES} are shared")
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_UPLOAD_TITLE or not title.isprintable():
        raise ValidationFailed("title", f"a title is 1 to {MAX_UPLOAD_TITLE} printable characters")
    if initial_comment is not None and (
        not isinstance(initial_comment, str) or len(initial_comment) > MAX_UPLOAD_COMMENT
    ):
        raise ValidationFailed("initial_comment", f"the comment is at most {MAX_UPLOAD_COMMENT} characters")


def _header_seconds(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value is not None else 1.0
    except (TypeError, ValueError):
        return 1.0


def _file_id(data: Any) -> str:
    """The id of the one file completeUploadExternal answers (`files[0].id`)."""
    files = data.get("files") if isinstance(data, dict) else None
    first = files[0] if isinstance(files, list) and files else None
    file_id = first.get("id") if isinstance(first, dict) else None
    if not isinstance(file_id, str) or not file_id:
        raise SlackError("files.completeUploadExternal", "invalid_response")
    return file_id


def _blocks(blocks: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    return [dict(b) for b in blocks] if blocks else None
