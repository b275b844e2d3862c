"""The local function host: every function of template.yaml run in-process the way Lambda would run it.

Function URLs become `http://HOST:PORT/fn/<folder>/...` (payload format 2.0 events), async invokes and SQS FIFO
queues run on a thread pool, and schedules tick on the sandbox clock. The handlers are the real ones, loaded from
functions/<folder>/<module>.py, with an environment that points every client at the sandbox.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.web import Auth, Route
from gpufarm_sandbox.localhost.env import ACCOUNT_ID, DROPPED_LOCALLY, REGION, Resolver, Urls, build_environment
from gpufarm_sandbox.localhost.env import local_parameters as _local_parameters
from gpufarm_sandbox.localhost.schedule import Expression, ScheduleError
from gpufarm_sandbox.localhost.template import FunctionSpec, QueueSpec, ScheduleSpec, Template, load_template

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox
    from gpufarm_sandbox.emulator.server import ServerThread

log = logging.getLogger("gpufarm_sandbox.localhost")

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
MAX_SYNC_PAYLOAD = 6 * 1024 * 1024  # Lambda's request/response limit for synchronous invokes and Function URLs
MAX_ASYNC_PAYLOAD = 256 * 1024  # async invoke and SQS message limits
DEDUP_WINDOW_S = 300.0  # SQS FIFO deduplication interval
TICK_S = 2.0  # schedules are also checked this often in real time (the sandbox clock moves with real time)
LOG_SIZE = 1000
TEXT_TYPES = ("application/json", "application/x-www-form-urlencoded", "application/xml", "application/javascript")
SQS_SENDER_ID = "AIDAIENQZJOLO23YVJ4VO"


class FunctionLoadError(RuntimeError):
    """The handler module is missing or failed to import (an init error in Lambda terms)."""


class FunctionTimeout(RuntimeError):
    """The handler ran past its configured Timeout; Lambda would have stopped it and discarded the result."""


class LambdaContext:
    """The `context` object handlers receive, with the attributes Lambda's Python runtime provides."""

    def __init__(self, spec: FunctionSpec, request_id: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.function_name = spec.logical_id
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{spec.logical_id}"
        self.memory_limit_in_mb = spec.memory
        self.aws_request_id = request_id
        self.log_group_name = f"/aws/lambda/{spec.logical_id}"
        self.log_stream_name = f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"
        self.identity = None
        self.client_context = None
        self._monotonic = monotonic
        self._deadline = monotonic() + spec.timeout

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the function's Timeout."""
        return max(0, int((self._deadline - self._monotonic()) * 1000))


class LocalFunction:
    """One function: its spec, and its handler module loaded on first use (a cold start)."""

    def __init__(self, spec: FunctionSpec, root: Path) -> None:
        self.spec = spec
        self.folder = (root / spec.code_uri).resolve()
        self.path = self.folder.joinpath(*spec.module.split(".")).with_suffix(".py")
        self.module: ModuleType | None = None
        self.load_error: str | None = None
        self.invocations = 0
        self._lock = threading.Lock()

    def handler(self) -> Callable[[Any, Any], Any]:
        """The handler callable, importing the module once (errors are kept and re-raised on every call)."""
        with self._lock:
            if self.module is None and self.load_error is None:
                self._load()
            if self.module is None:
                raise FunctionLoadError(self.load_error or "not loaded")
            handler = getattr(self.module, self.spec.function, None)
            if not callable(handler):
                raise FunctionLoadError(f"{self.spec.handler}: {self.path.name} has no callable {self.spec.function}")
            return handler  # type: ignore[no-any-return]

    def _load(self) -> None:
        if not self.path.is_file():
            self.load_error = f"{self.spec.handler}: {self.path} does not exist"
            return
        # Lambda puts the function's folder on sys.path (/var/task), so sibling modules import as in production.
        if str(self.folder) not in sys.path:
            sys.path.append(str(self.folder))
        name = f"_gpufarm_fn_{self.spec.logical_id}"
        spec = importlib.util.spec_from_file_location(name, self.path)
        if spec is None or spec.loader is None:
            self.load_error = f"{self.path} cannot be imported"
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # an init error must not take the host down
            sys.modules.pop(name, None)
            self.load_error = f"{self.spec.handler}: import failed: {type(exc).__name__}: {exc}"
            log.exception("init of %s failed", self.spec.logical_id)
            return
        self.module = module

    def describe(self, urls: Urls) -> dict[str, Any]:
        """The function in `/_local/state`."""
        spec = self.spec
        triggers = (["url"] if spec.url else []) + [f"schedule:{s.expression}" for s in spec.schedules]
        triggers += [f"sqs:{q.queue}" for q in spec.queues]
        return {
            "name": spec.logical_id,
            "dir": spec.dir_name,
            "handler": spec.handler,
            "url": urls.function(spec.dir_name) if spec.url else None,
            "timeout": spec.timeout,
            "memory": spec.memory,
            "triggers": triggers,
            "present": self.path.is_file(),
            "loaded": self.module is not None,
            "load_error": self.load_error,
            "invocations": self.invocations,
        }


@dataclass
class QueuedMessage:
    """One SQS message as the local queue holds it."""

    message_id: str
    body: str
    group: str
    dedup_id: str | None
    sent_ms: int
    sequence: str
    receive_count: int = 0
    first_receive_ms: int | None = None


@dataclass
class LocalQueue:
    """An SQS queue: FIFO groups delivered one batch at a time, in order, with bounded redelivery."""

    spec: QueueSpec
    url: str
    name: str
    consumer: LocalFunction | None = None
    batch_size: int = 1
    report_failures: bool = False
    groups: dict[str, deque[QueuedMessage]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    dedup: dict[str, tuple[float, str]] = field(default_factory=dict)
    sequence: int = 0
    sent: int = 0
    delivered: int = 0

    @property
    def arn(self) -> str:
        """The queue ARN an SQS event names."""
        return f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{self.name}"

    def depth(self) -> int:
        """Messages waiting or in flight."""
        return sum(len(q) for q in self.groups.values())


@dataclass
class ScheduledTrigger:
    """A schedule of one function and when it fires next on the sandbox clock."""

    function: LocalFunction
    spec: ScheduleSpec
    expression: Expression | None
    start: float
    next_due: float | None
    last_fired: float | None = None
    fired: int = 0
    error: str | None = None


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _lambda_error(status: int, kind: str, message: str) -> Response:
    """The Lambda API's error shape."""
    response = Response(
        json.dumps({"Type": "User", "message": message}), status=status, content_type="application/json"
    )
    response.headers["x-amzn-ErrorType"] = kind
    return response


def _sqs_error(status: int, kind: str, message: str) -> Response:
    """SQS's JSON-protocol error shape."""
    body = {"__type": f"com.amazonaws.sqs#{kind}", "message": message}
    return Response(json.dumps(body), status=status, content_type="application/x-amz-json-1.0")


def _url_error(status: int, message: str) -> Response:
    """What a Function URL answers when the function cannot (502 for errors, as Lambda does)."""
    return Response(json.dumps({"Message": message}), status=status, content_type="application/json")


def _is_text(content_type: str, encoding: str) -> bool:
    if encoding and encoding.lower() not in ("identity", ""):
        return False
    ctype = content_type.split(";", 1)[0].strip().lower()
    return ctype.startswith("text/") or ctype in TEXT_TYPES or ctype.endswith(("+json", "+xml"))


def _join_multi(pairs: Iterator[tuple[str, str]] | list[tuple[str, str]], *, lower: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs:
        name = key.lower() if lower else key
        out[name] = f"{out[name]},{value}" if name in out else value
    return out


class LocalHost:
    """Serves a SAM template's functions on a Sandbox (routes mounted with `sandbox.add_routes`)."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        template: Path | None = None,
        root: Path | None = None,
        parameters: Mapping[str, str] | None = None,
        max_workers: int = 8,
    ) -> None:
        _install_seams()
        self.sb = sandbox
        path = template or find_template(root)
        self.root = (root or path.parent).resolve()
        self.template: Template = load_template(path)
        self.urls = Urls(sandbox.base_url.rstrip("/"))
        self.env: dict[str, str] = build_environment(self.template, sandbox, self.urls, self.root, parameters)
        self.functions = {fid: LocalFunction(spec, self.root) for fid, spec in self.template.functions.items()}
        self._resolver = Resolver(self.template, self.urls, _local_parameters(self.template, parameters))
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._closed = False
        # While paused, schedules do not fire (tests that move the clock past a tick and must see only their own
        # trigger act); due ticks fire at the first check after resuming.
        self.schedules_paused = False
        self.invocations: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self.dead_letters: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self.queues = self._build_queues()
        self.schedules = self._build_schedules()
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gpufarm-fn")
        self._stop = threading.Event()
        sandbox.add_routes(self.routes())
        # Registered as a sandbox module too, so `POST /_sandbox/reset` restarts the timetable and the
        # sandbox's state dump shows the host.
        sandbox.modules.append(_SandboxModule(self))
        sandbox.clock.subscribe(self._on_clock)
        self._ticker = threading.Thread(target=self._tick_loop, name="gpufarm-schedules", daemon=True)
        self._ticker.start()

    # -- setup -----------------------------------------------------------------------------------------------------

    def _build_queues(self) -> dict[str, LocalQueue]:
        queues = {
            qid: LocalQueue(spec, self.urls.queue(qid), self._resolver.queue_name(qid))
            for qid, spec in self.template.queues.items()
        }
        for fn in self.functions.values():
            for event in fn.spec.queues:
                queue = queues[event.queue]
                if queue.consumer is not None:
                    log.warning("queue %s has two consumers; %s is used", event.queue, queue.consumer.spec.logical_id)
                    continue
                queue.consumer, queue.batch_size, queue.report_failures = fn, event.batch_size, event.report_failures
        return queues

    def _build_schedules(self) -> list[ScheduledTrigger]:
        now = self.sb.clock.now()
        out = []
        for fn in self.functions.values():
            for spec in fn.spec.schedules:
                try:
                    expression: Expression | None = Expression.parse(spec.expression, spec.timezone)
                except ScheduleError as exc:
                    log.warning("%s.%s is not scheduled locally: %s", fn.spec.logical_id, spec.name, exc)
                    out.append(ScheduledTrigger(fn, spec, None, now, None, error=str(exc)))
                    continue
                assert expression is not None
                due = expression.next_after(now, start=now) if spec.enabled else None
                out.append(ScheduledTrigger(fn, spec, expression, now, due))
        return out

    def routes(self) -> list[Route]:
        """Function URLs, async invokes, queues and the state endpoint."""
        return [
            Route("/fn/<dir_name>/", HTTP_METHODS, self._function_url, Auth.NONE),
            Route("/fn/<dir_name>/<path:rest>", HTTP_METHODS, self._function_url, Auth.NONE),
            Route("/_local/invoke/<name>", ("POST",), self._invoke_async, Auth.NONE),
            Route("/_local/queues/<queue_id>/messages", ("POST",), self._queue_send, Auth.NONE),
            Route("/_local/state", ("GET",), self._state, Auth.NONE),
        ]

    # -- public API ----------------------------------------------------------------------------------------------------

    def function(self, name: str) -> LocalFunction:
        """A function by logical id, folder name or Lambda ARN; KeyError if unknown."""
        if ":function:" in name:
            name = name.split(":function:", 1)[1].split(":", 1)[0]
        if name in self.functions:
            return self.functions[name]
        for fn in self.functions.values():
            if fn.spec.dir_name == name:
                return fn
        raise KeyError(f"no function {name!r} in {self.template.path.name}")

    def module(self, name: str) -> ModuleType:
        """A function's loaded handler module (loading it if needed), e.g. for a test to inspect."""
        fn = self.function(name)
        fn.handler()
        assert fn.module is not None
        return fn.module

    def invoke(self, function: str, event: dict[str, Any]) -> Any:
        """Run a function synchronously in this thread; its exception (or FunctionTimeout) propagates."""
        fn = self.function(function)
        ok, result = self._run(fn, event, "direct")
        if not ok:
            assert isinstance(result, BaseException)
            raise result
        return result

    def submit(self, function: str, event: Any, *, trigger: str = "async") -> None:
        """Queue an asynchronous invoke (retried MaximumRetryAttempts times, then dead-lettered)."""
        fn = self.function(function)
        self._start(self._run_async, fn, event, trigger)

    def send(self, queue_id: str, body: Any, *, group: str | None = None, dedup_id: str | None = None) -> str:
        """Enqueue a message as SendMessage would; returns the MessageId (the original one for a duplicate)."""
        queue = self.queues[queue_id]
        text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
        problem = self._check_message(queue, text, group, dedup_id)
        if problem:
            raise ValueError(problem[2])
        return self._enqueue(queue, text, group, dedup_id)

    def reset(self, *, now: float | None = None) -> None:
        """Forget logs, dead letters and deduplication ids, and restart schedules from now (queued work stays)."""
        start = self.sb.clock.now() if now is None else now
        with self._lock:
            self.invocations.clear()
            self.dead_letters.clear()
            for queue in self.queues.values():
                queue.dedup.clear()
            self._rebase(start)

    def drain(self, timeout: float = 15.0) -> bool:
        """Wait until invokes, queues with a consumer, and the sandbox's webhook deliveries are idle."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline:
            with self._idle:
                busy = self._active > 0 or any(q.consumer and q.depth() for q in self.queues.values())
                if busy:
                    quiet = 0
                    self._idle.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
            if self.sb.webhooks.pending:
                quiet = 0
                self.sb.webhooks.drain(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                continue
            quiet += 1
            if quiet >= 2:  # idle twice in a row: nothing was handed over between the two checks
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Stop schedules, let running work finish briefly, and stop accepting invocations."""
        if self._closed:
            return
        self.drain(timeout=5.0)
        with self._lock:
            self._closed = True
        self._stop.set()
        self._ticker.join(timeout=5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- running functions -----------------------------------------------------------------------------------------

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the local host is closed")
            self._active += 1
        try:
            self._executor.submit(self._guarded, target, *args)
        except RuntimeError:
            self._done()
            raise

    def _guarded(self, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except Exception:
            log.exception("local host task failed")
        finally:
            self._done()

    def _done(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    def _run(self, fn: LocalFunction, event: Any, trigger: str) -> tuple[bool, Any]:
        """One invocation: (True, result) or (False, exception); always logged."""
        request_id = str(uuid.uuid4())
        started_at = self.sb.clock.now()
        started = time.perf_counter()
        entry: dict[str, Any] = {
            "id": request_id,
            "function": fn.spec.logical_id,
            "trigger": trigger,
            "started": _iso(started_at),
        }
        ok, outcome = True, None
        try:
            handler = fn.handler()
            with self._lock:
                fn.invocations += 1
            outcome = handler(event, LambdaContext(fn.spec, request_id))
        except Exception as exc:  # a handler error is an invocation result, as in Lambda
            ok, outcome = False, exc
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
            if not isinstance(exc, FunctionLoadError):
                # Lambda logs the traceback to CloudWatch; locally it goes to the host's log.
                log.exception("%s (%s) failed", fn.spec.logical_id, trigger)
        duration = time.perf_counter() - started
        if ok and duration > fn.spec.timeout:
            ok, outcome = (
                False,
                FunctionTimeout(f"{fn.spec.logical_id} ran {duration:.1f}s > Timeout {fn.spec.timeout}s"),
            )
            entry["error"] = str(outcome)
            log.warning("%s: Lambda would have stopped this invocation", outcome)
        entry["duration_ms"] = round(duration * 1000, 1)
        entry["status"] = "ok" if ok else ("timeout" if isinstance(outcome, FunctionTimeout) else "error")
        with self._lock:
            self.invocations.append(entry)
        return ok, outcome

    def _run_async(self, fn: LocalFunction, event: Any, trigger: str) -> None:
        attempts = 1 + max(0, fn.spec.max_retries) if trigger == "async" else 1
        for _ in range(attempts):
            ok, outcome = self._run(fn, event, trigger)
            if ok:
                return
        self._dead_letter(trigger, fn.spec.logical_id, str(outcome), event)

    def _dead_letter(self, source: str, target: str, error: str, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        with self._lock:
            self.dead_letters.append(
                {
                    "source": source,
                    "target": target,
                    "error": error[:500],
                    "at": _iso(self.sb.clock.now()),
                    "payload": text[:4000],
                }
            )

    # -- Function URLs -------------------------------------------------------------------------------------------------

    def _function_url(self, request: Request, dir_name: str, rest: str = "") -> Response:
        spec = self.template.function_for_dir(dir_name)
        if spec is None or not spec.url:
            return _url_error(403, "Forbidden")
        if self._closed:
            return _url_error(503, "Service Unavailable")
        body = request.get_data(cache=True)
        if len(body) > MAX_SYNC_PAYLOAD:
            return _url_error(413, f"Request must be smaller than {MAX_SYNC_PAYLOAD} bytes for the InvokeFunction")
        event = self._url_event(request, spec, "/" + rest, body)
        ok, result = self._run(self.functions[spec.logical_id], event, "url")
        if not ok:
            return _url_error(502, "Internal Server Error")
        try:
            return self._url_response(result)
        except (TypeError, ValueError):
            log.exception("%s returned a response a Function URL cannot send", spec.logical_id)
            return _url_error(502, "Internal Server Error")

    def _url_event(self, request: Request, spec: FunctionSpec, raw_path: str, body: bytes) -> dict[str, Any]:
        """The Lambda Function URL event (payload format 2.0)."""
        headers = _join_multi(list(request.headers.items()), lower=True)
        cookie_header = headers.pop("cookie", "")
        query = request.query_string.decode("utf-8", "replace")
        url_id = hashlib.sha256(spec.logical_id.encode()).hexdigest()[:32]
        now = self.sb.clock.now()
        event: dict[str, Any] = {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": raw_path,
            "rawQueryString": query,
        }
        cookies = [c.strip() for c in cookie_header.split(";") if c.strip()]
        if cookies:
            event["cookies"] = cookies
        event["headers"] = headers
        params = _join_multi(parse_qsl(query, keep_blank_values=True), lower=False)
        if params:
            event["queryStringParameters"] = params
        event["requestContext"] = {
            "accountId": "anonymous",
            "apiId": url_id,
            "domainName": headers.get("host", "localhost"),
            "domainPrefix": url_id,
            "http": {
                "method": request.method,
                "path": raw_path,
                "protocol": request.environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
                "sourceIp": request.remote_addr or "127.0.0.1",
                "userAgent": headers.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": datetime.fromtimestamp(now, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now * 1000),
        }
        if body:
            text = None
            if _is_text(headers.get("content-type", ""), headers.get("content-encoding", "")):
                with contextlib.suppress(UnicodeDecodeError):
                    text = body.decode("utf-8")
            event["body"] = text if text is not None else base64.b64encode(body).decode()
            event["isBase64Encoded"] = text is None
        else:
            event["isBase64Encoded"] = False
        return event

    @staticmethod
    def _url_response(result: Any) -> Response:
        """Map a handler's result to HTTP as Function URLs do (a dict with statusCode, or any JSON as a 200)."""
        if isinstance(result, dict) and "statusCode" in result:
            status = result["statusCode"]
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise ValueError(f"statusCode {status!r} is not an HTTP status")
            headers = result.get("headers") or {}
            if not isinstance(headers, dict):
                raise TypeError("headers must be an object")
            body = result.get("body")
            if body is None:
                data = b""
            elif isinstance(body, str):
                data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
            else:
                data = json.dumps(body).encode()
            response = Response(data, status=status)
            response.headers["Content-Type"] = "application/json"
            for name, value in headers.items():
                response.headers[str(name)] = str(value)
            for cookie in result.get("cookies") or []:
                response.headers.add("Set-Cookie", str(cookie))
            return response
        data = result.encode() if isinstance(result, str) else json.dumps(result).encode()
        return Response(data, status=200, content_type="application/json")

    # -- async invokes ---------------------------------------------------------------------------------------------

    def _invoke_async(self, request: Request, name: str) -> Response:
        try:
            fn = self.function(name)
        except KeyError:
            return _lambda_error(404, "ResourceNotFoundException", f"Function not found: {name}")
        data = request.get_data(cache=True)
        if len(data) > MAX_ASYNC_PAYLOAD:
            return _lambda_error(413, "RequestTooLargeException", "Request must be smaller than 262144 bytes")
        try:
            event = json.loads(data) if data.strip() else {}
        except (ValueError, UnicodeDecodeError):
            return _lambda_error(400, "InvalidRequestContentException", "Could not parse request body into json")
        try:
            self._start(self._run_async, fn, event, "async")
        except RuntimeError:
            return _lambda_error(503, "ServiceException", "the local host is closed")
        return Response(b"", status=202)

    # -- queues ----------------------------------------------------------------------------------------------------

    def _queue_send(self, request: Request, queue_id: str) -> Response:
        queue = self.queues.get(queue_id)
        if queue is None:
            return _sqs_error(400, "QueueDoesNotExist", "The specified queue does not exist.")
        try:
            body = json.loads(request.get_data(cache=True) or b"null")
        except (ValueError, UnicodeDecodeError):
            return _sqs_error(400, "InvalidParameterValue", "The request body is not valid JSON.")
        if not isinstance(body, dict) or "body" not in body:
            return _sqs_error(400, "MissingParameter", 'Expected {"body": ..., "group": ..., "dedup_id": ...}.')
        raw = body["body"]
        text = raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
        group, dedup_id = body.get("group"), body.get("dedup_id")
        if (group is not None and not isinstance(group, str)) or (
            dedup_id is not None and not isinstance(dedup_id, str)
        ):
            return _sqs_error(400, "InvalidParameterValue", "group and dedup_id must be strings.")
        problem = self._check_message(queue, text, group, dedup_id)
        if problem:
            return _sqs_error(*problem)
        if self._closed:
            return _sqs_error(503, "ServiceUnavailable", "the local host is closed")
        message_id = self._enqueue(queue, text, group, dedup_id)
        answer = {"MessageId": message_id, "MD5OfMessageBody": hashlib.md5(text.encode()).hexdigest()}  # noqa: S324
        return Response(json.dumps(answer), status=200, content_type="application/json")

    @staticmethod
    def _check_message(
        queue: LocalQueue, text: str, group: str | None, dedup_id: str | None
    ) -> tuple[int, str, str] | None:
        """SendMessage's validation: size, FIFO group and deduplication id rules."""
        if not text or len(text.encode()) > MAX_ASYNC_PAYLOAD:
            return 400, "InvalidParameterValue", "Message must be between 1 and 262144 bytes long."
        for label, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup_id)):
            if value is not None and (not 1 <= len(value) <= 128 or not value.isprintable() or " " in value):
                return 400, "InvalidParameterValue", f"{label} must be 1-128 printable characters without spaces."
        if queue.spec.fifo:
            if not group:
                return 400, "MissingParameter", "The request must contain the parameter MessageGroupId."
            if not dedup_id and not queue.spec.content_dedup:
                return (
                    400,
                    "InvalidParameterValue",
                    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
                    "provided explicitly",
                )
        return None

    def _enqueue(self, queue: LocalQueue, text: str, group: str | None, dedup_id: str | None) -> str:
        now = self.sb.clock.now()
        with self._lock:
            if queue.spec.fifo:
                dedup = dedup_id or hashlib.sha256(text.encode()).hexdigest()
                for key, (seen, _) in list(queue.dedup.items()):
                    # Expired, or recorded "in the future" because the sandbox clock was reset since.
                    if now - seen >= DEDUP_WINDOW_S or seen > now + 1:
                        del queue.dedup[key]
                if dedup in queue.dedup:
                    # SQS FIFO accepts the duplicate and drops it within the 5-minute window.
                    return queue.dedup[dedup][1]
            else:
                dedup = None
            queue.sequence += 1
            queue.sent += 1
            message = QueuedMessage(
                message_id=str(uuid.uuid4()),
                body=text,
                group=(group or "") if queue.spec.fifo else "",
                dedup_id=dedup,
                sent_ms=int(now * 1000),
                sequence=f"{18_000_000_000_000_000_000 + queue.sequence}",
            )
            if dedup is not None:
                queue.dedup[dedup] = (now, message.message_id)
            queue.groups.setdefault(message.group, deque()).append(message)
            self._pump(queue)
            return message.message_id

    def _pump(self, queue: LocalQueue) -> None:
        """Hand each idle group's next batch to the consumer (lock held); FIFO: one batch per group at a time."""
        if queue.consumer is None or self._closed:
            return
        for group, pending in queue.groups.items():
            if not pending or group in queue.busy:
                continue
            if not queue.spec.fifo and queue.busy:
                # A standard queue here delivers one batch at a time too; ordering is not promised, just kept.
                return
            batch = list(pending)[: max(1, queue.batch_size)]
            queue.busy.add(group)
            self._active += 1
            try:
                self._executor.submit(self._guarded_delivery, queue, group, batch)
            except RuntimeError:
                queue.busy.discard(group)
                self._active -= 1
                return

    def _guarded_delivery(self, queue: LocalQueue, group: str, batch: list[QueuedMessage]) -> None:
        try:
            self._deliver(queue, group, batch)
        except Exception:
            log.exception("delivery from %s failed", queue.spec.logical_id)
            with self._lock:
                queue.busy.discard(group)
        finally:
            self._done()

    def _deliver(self, queue: LocalQueue, group: str, batch: list[QueuedMessage]) -> None:
        now_ms = int(self.sb.clock.now() * 1000)
        with self._lock:
            for message in batch:
                message.receive_count += 1
                message.first_receive_ms = message.first_receive_ms or now_ms
        event = {"Records": [self._record(queue, m) for m in batch]}
        assert queue.consumer is not None
        ok, result = self._run(queue.consumer, event, f"sqs:{queue.spec.logical_id}")
        failed = {m.message_id for m in batch}
        if ok:
            failed = self._failed_items(queue, batch, result)
        with self._lock:
            pending = queue.groups.get(group, deque())
            done = {m.message_id for m in batch}
            kept = [m for m in pending if m.message_id not in done]
            retry: list[QueuedMessage] = []
            for message in batch:
                if message.message_id not in failed:
                    queue.delivered += 1
                elif message.receive_count >= queue.spec.max_receives:
                    reason = "handler error" if not ok else "reported in batchItemFailures"
                    self._dead_letter(
                        f"sqs:{queue.spec.logical_id}",
                        queue.spec.dead_letter_queue or queue.spec.logical_id,
                        f"{reason} after {message.receive_count} receives",
                        message.body,
                    )
                else:
                    retry.append(message)
            queue.groups[group] = deque(retry + kept)
            queue.busy.discard(group)
            self._pump(queue)

    @staticmethod
    def _failed_items(queue: LocalQueue, batch: list[QueuedMessage], result: Any) -> set[str]:
        """Partial batch response: ids listed in batchItemFailures fail (only with ReportBatchItemFailures)."""
        if not queue.report_failures or not isinstance(result, dict):
            return set()
        items = result.get("batchItemFailures")
        if not items:
            return set()
        ids = {m.message_id for m in batch}
        failed = {str(i.get("itemIdentifier")) for i in items if isinstance(i, dict)}
        # An unknown or empty identifier fails the whole batch, as Lambda does.
        return ids if not failed <= ids else failed

    def _record(self, queue: LocalQueue, message: QueuedMessage) -> dict[str, Any]:
        attributes = {
            "ApproximateReceiveCount": str(message.receive_count),
            "SentTimestamp": str(message.sent_ms),
            "SenderId": SQS_SENDER_ID,
            "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
        }
        if queue.spec.fifo:
            attributes["SequenceNumber"] = message.sequence
            attributes["MessageGroupId"] = message.group
            if message.dedup_id:
                attributes["MessageDeduplicationId"] = message.dedup_id
        return {
            "messageId": message.message_id,
            "receiptHandle": base64.b64encode(f"{message.message_id}:{message.receive_count}".encode()).decode(),
            "body": message.body,
            "attributes": attributes,
            "messageAttributes": {},
            "md5OfBody": hashlib.md5(message.body.encode()).hexdigest(),  # noqa: S324 - SQS's checksum, not security
            "eventSource": "aws:sqs",
            "eventSourceARN": queue.arn,
            "awsRegion": REGION,
        }

    # -- schedules -------------------------------------------------------------------------------------------------

    def _on_clock(self, now: float) -> None:
        if not self._closed:
            self._tick(now)

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self._tick(self.sb.clock.now())

    def _tick(self, now: float) -> None:
        """Fire every due schedule once; a jump over several periods fires once, not once per missed period."""
        due: list[ScheduledTrigger] = []
        with self._lock:
            if self._closed or self.schedules_paused:
                return
            for trigger in self.schedules:
                if trigger.expression is None or trigger.next_due is None or trigger.next_due > now:
                    continue
                trigger.last_fired = now
                trigger.fired += 1
                trigger.next_due = trigger.expression.next_after(now, start=trigger.start)
                due.append(trigger)
        for trigger in due:
            try:
                self._start(self._run_async, trigger.function, self._schedule_event(trigger, now), "schedule")
            except RuntimeError:
                return

    def _rebase(self, start: float) -> None:
        for trigger in self.schedules:
            trigger.start = start
            if trigger.expression is not None and trigger.spec.enabled:
                trigger.next_due = trigger.expression.next_after(start, start=start)

    def _schedule_event(self, trigger: ScheduledTrigger, now: float) -> Any:
        """ScheduleV2 passes its Input as-is ({} without one); a classic Schedule wraps it in a Scheduled Event."""
        spec = trigger.spec
        if spec.input is not None:
            try:
                return json.loads(spec.input)
            except ValueError:
                return spec.input
        if spec.kind == "ScheduleV2":
            return {}
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": ACCOUNT_ID,
            "time": _iso(now),
            "region": REGION,
            "resources": [f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{trigger.function.spec.logical_id}-{spec.name}"],
            "detail": {},
        }

    # -- state -----------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Functions, recent invocations, queue depths, dead letters and next schedule ticks (no secrets)."""
        with self._lock:
            return {
                "url": self.urls.base,
                "template": str(self.template.path),
                "functions": [fn.describe(self.urls) for fn in self.functions.values()],
                "invocations": list(self.invocations),
                "queues": {
                    qid: {
                        "url": q.url,
                        "name": q.name,
                        "fifo": q.spec.fifo,
                        "consumer": q.consumer.spec.logical_id if q.consumer else None,
                        "depth": q.depth(),
                        "in_flight_groups": sorted(q.busy),
                        "sent": q.sent,
                        "delivered": q.delivered,
                    }
                    for qid, q in self.queues.items()
                },
                "dead_letters": list(self.dead_letters),
                "schedules": [
                    {
                        "function": t.function.spec.logical_id,
                        "name": t.spec.name,
                        "kind": t.spec.kind,
                        "expression": t.spec.expression,
                        "enabled": t.spec.enabled and t.expression is not None,
                        "next_tick": _iso(t.next_due),
                        "last_tick": _iso(t.last_fired),
                        "fired": t.fired,
                        "error": t.error,
                    }
                    for t in self.schedules
                ],
                "active": self._active,
                "closed": self._closed,
            }

    def _state(self, request: Request) -> Response:
        return Response(json.dumps(self.state()), status=200, content_type="application/json")


class _SandboxModule:
    """The host as one of the sandbox's modules (name "local"): reset with it, dumped with it."""

    name = "local"

    def __init__(self, host: LocalHost) -> None:
        self._host = host

    def routes(self) -> list[Route]:
        """None here: the host mounts its routes with add_routes."""
        return []

    def reset(self) -> None:
        """Sandbox.reset() resets the clock to real time right after its modules, so restart from real now."""
        self._host.reset(now=time.time())

    def dump(self) -> dict[str, Any]:
        """The host's state (no secrets)."""
        return self._host.state()


def find_template(root: Path | None = None) -> Path:
    """template.yaml under root, else in the current directory, else in this source checkout."""
    candidates = [root / "template.yaml"] if root else []
    candidates += [Path.cwd() / "template.yaml", Path(__file__).resolve().parents[4] / "template.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("template.yaml not found (pass template= or run from the repository root)")


@dataclass
class LocalEnv:
    """A running local environment: the sandbox, the function host, the base URL and the variables set."""

    sandbox: Sandbox
    host: LocalHost
    url: str
    env: dict[str, str]
    server: ServerThread


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):  # noqa: S104 - a comparison: clients of a wildcard bind use loopback
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _clear_process_caches() -> None:
    # A new local host is a new container: settings cached by a previous run must not leak into this one.
    from gpufarm.config import cached_settings

    cached_settings.cache_clear()


def _install_seams() -> None:
    from gpufarm_sandbox.localhost import seams

    seams.install()


@contextlib.contextmanager
def start_local(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    template: Path | None = None,
    root: Path | None = None,
    parameters: Mapping[str, str] | None = None,
) -> Iterator[LocalEnv]:
    """Sandbox + LocalHost + HTTP server; sets sb.base_url and os.environ for the functions (restored on exit)."""
    from gpufarm_sandbox.emulator.app import Sandbox
    from gpufarm_sandbox.emulator.server import ServerThread

    sandbox = Sandbox()
    # Started before the host mounts its routes (stop() needs a running server); nobody knows the URL yet.
    server = ServerThread(sandbox, host, port).start()
    url = f"http://{_connect_host(host)}:{server.port}"
    sandbox.base_url = url
    try:
        local = LocalHost(sandbox, template=template, root=root, parameters=parameters)
    except BaseException:
        server.stop()
        raise
    names = set(local.env) | DROPPED_LOCALLY
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(local.env)
    for name in DROPPED_LOCALLY:
        os.environ.pop(name, None)
    _clear_process_caches()
    try:
        yield LocalEnv(sandbox=sandbox, host=local, url=url, env=dict(local.env), server=server)
    finally:
        local.close()
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _clear_process_caches()
