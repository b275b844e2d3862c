"""The local function host: every function of template.yaml run in-process the way Lambda would run it.

Function URLs become `http://HOST:PORT/fn/<folder>/...` (payload format 2.0 events, `function_url`), async invokes
run on a thread pool with the function's retries, SQS FIFO queues deliver in order (`queues`), and schedules tick on
the sandbox clock (`scheduler`). The handlers are the real ones, loaded from functions/<folder>/<module>.py
(`functions`), with an environment that points every client at the sandbox.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.clock import Clock
from gpufarm_sandbox.emulator.web import Auth, Route
from gpufarm_sandbox.localhost.env import PRICE_CACHE_ENV, Resolver, Urls, build_environment
from gpufarm_sandbox.localhost.env import local_parameters as _local_parameters
from gpufarm_sandbox.localhost.function_host import Lane
from gpufarm_sandbox.localhost.function_url import MAX_SYNC_PAYLOAD, url_error, url_event, url_response
from gpufarm_sandbox.localhost.functions import FunctionLoadError, FunctionTimeout, LambdaContext, LocalFunction
from gpufarm_sandbox.localhost.queues import MAX_ASYNC_PAYLOAD, LocalQueue, QueueRunner
from gpufarm_sandbox.localhost.scheduler import ScheduledTrigger, Scheduler, iso_utc
from gpufarm_sandbox.localhost.template import Template, load_template

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox

__all__ = ["FunctionLoadError", "FunctionTimeout", "LocalHost", "find_template"]

log = logging.getLogger("gpufarm_sandbox.localhost")

# Called after each invocation with its log entry and its event (LocalHost.listen).
Listener = Callable[[dict[str, Any], Any], None]

# Event invokes (and schedules) and SQS deliveries run on two pools of their own, apart from each other and from
# the HTTP server's threads that answer Function URLs, so a backlog of worker invocations never holds up the
# allocation queue, or the reverse. Eight concurrent event invokes keep the races real (two writers, a burst of
# requests) while bounding how many CPU-bound workers share this interpreter's GIL with the acks (Lambda scales the
# worker out instead; here the rest wait their turn). Four deliveries: one per FIFO group of the example farm
# (three pools and the unassigned group), each group one batch at a time as SQS delivers.
ASYNC_WORKERS = 8
QUEUE_WORKERS = 4

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
LOG_SIZE = 1000


def _lambda_error(status: int, kind: str, message: str) -> Response:
    """The Lambda API's error shape."""
    response = Response(
        json.dumps({"Type": "User", "message": message}), status=status, content_type="application/json"
    )
    response.headers["x-amzn-ErrorType"] = kind
    return response


class LocalHost:
    """Serves a SAM template's functions on a Sandbox (routes mounted with `sandbox.add_routes`)."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        template: Path | None = None,
        root: Path | None = None,
        parameters: Mapping[str, str] | None = None,
        async_workers: int | None = None,
        queue_workers: int | None = None,
        held: bool = False,
    ) -> None:
        _install_seams()
        self.sb = sandbox
        # While held, Function URLs answer 503 (start_local holds them until the Datadog setup is applied).
        self.held = held
        path = template or find_template(root)
        self.root = (root or path.parent).resolve()
        self.template: Template = load_template(path)
        self.urls = Urls(sandbox.base_url.rstrip("/"))
        self.env: dict[str, str] = build_environment(self.template, sandbox, self.urls, self.root, parameters)
        # The cached list prices: a file of this host's own in place of the profile bucket's object (the sync
        # refreshes it from the simulated price lists: gpufarm_sandbox.pricelists), gone when the host closes.
        self._prices = tempfile.TemporaryDirectory(prefix="gpufarm-local-prices-")
        self.env[PRICE_CACHE_ENV] = str(Path(self._prices.name) / "prices.json")
        self.functions = {fid: LocalFunction(spec, self.root) for fid, spec in self.template.functions.items()}
        self.resolver = Resolver(self.template, self.urls, _local_parameters(self.template, parameters))
        self.lock = threading.RLock()
        self._idle = threading.Condition(self.lock)
        self._active = 0
        self.closed = False
        self.invocations: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self.dead_letters: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self._listeners: list[Listener] = []
        self._queues = QueueRunner(self)
        self.queues: dict[str, LocalQueue] = self._queues.queues
        self._scheduler = Scheduler(self)
        self.schedules: list[ScheduledTrigger] = self._scheduler.schedules
        self._pools = {
            "async": ThreadPoolExecutor(async_workers or ASYNC_WORKERS, thread_name_prefix="gpufarm-async"),
            "queue": ThreadPoolExecutor(queue_workers or QUEUE_WORKERS, thread_name_prefix="gpufarm-queue"),
        }
        sandbox.add_routes(self.routes())
        # The Slack app of the sandbox's workspace is gpufarm's: its Request URL is the ingress (slack/manifest.yaml).
        sandbox.slack.app.install(self.urls.function("slack_ingress"))
        # Registered as a sandbox module too, so `POST /_sandbox/reset` restarts the timetable and the
        # sandbox's state dump shows the host.
        sandbox.modules.append(_SandboxModule(self))
        self._scheduler.start()
        _seams().serve_in_process(self)

    @property
    def clock(self) -> Clock:
        """The sandbox clock the functions run on."""
        return self.sb.clock

    @property
    def schedules_paused(self) -> bool:
        """While True, schedules do not fire; due ticks fire at the first check after resuming."""
        return self._scheduler.paused

    @schedules_paused.setter
    def schedules_paused(self, paused: bool) -> None:
        self._scheduler.paused = paused

    def routes(self) -> list[Route]:
        """Function URLs, async invokes, queues and the state endpoint."""
        return [
            Route("/fn/<dir_name>/", HTTP_METHODS, self._function_url, Auth.NONE),
            Route("/fn/<dir_name>/<path:rest>", HTTP_METHODS, self._function_url, Auth.NONE),
            Route("/_local/invoke/<name>", ("POST",), self._invoke_async, Auth.NONE),
            Route("/_local/queues/<queue_id>/messages", ("POST",), self._queues.send_request, Auth.NONE),
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
        ok, result = self.execute(fn, event, "direct")
        if not ok:
            assert isinstance(result, BaseException)
            raise result
        return result

    def submit(self, function: str, event: Any, *, trigger: str = "async") -> None:
        """Queue an asynchronous invoke (retried MaximumRetryAttempts times, then dead-lettered)."""
        fn = self.function(function)
        self.start_task(self.run_async, fn, event, trigger)

    def send(self, queue_id: str, body: Any, *, group: str | None = None, dedup_id: str | None = None) -> str:
        """Enqueue a message as SendMessage would; returns the MessageId (the original one for a duplicate)."""
        return self._queues.send(queue_id, body, group=group, dedup_id=dedup_id)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call listener(entry, event) after every invocation (its log entry and the event it ran on), e.g. to
        time one function's work under load; returns the function that removes it."""
        with self.lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self.lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def reset(self, *, now: float | None = None) -> None:
        """Forget logs, dead letters and deduplication ids, and restart schedules from now (queued work stays)."""
        start = self.sb.clock.now() if now is None else now
        with self.lock:
            self.invocations.clear()
            self.dead_letters.clear()
            self._queues.forget_duplicates()
            self._scheduler.rebase(start)

    def drain(self, timeout: float = 15.0) -> bool:
        """Wait until invokes, queues with a consumer, and the sandbox's webhook deliveries are idle."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline:
            with self._idle:
                busy = self._active > 0 or self._queues.pending()
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
        if self.closed:
            return
        self.drain(timeout=5.0)
        with self.lock:
            self.closed = True
        _seams().stop_in_process(self)
        self._scheduler.stop()
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self._prices.cleanup()

    # -- running functions -----------------------------------------------------------------------------------------

    def start_task(self, target: Callable[..., None], *args: Any, lane: Lane = "async") -> None:
        """Run target(*args) on the lane's pool ("async": event invokes and schedules, "queue": SQS deliveries),
        counted until it ends (drain waits for it); RuntimeError once closed."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the local host is closed")
            self._active += 1
        try:
            self._pools[lane].submit(self._guarded, target, *args)
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

    def execute(self, fn: LocalFunction, event: Any, trigger: str) -> tuple[bool, Any]:
        """One invocation: (True, result) or (False, exception); always logged."""
        request_id = str(uuid.uuid4())
        started_at = self.sb.clock.now()
        started = time.perf_counter()
        entry: dict[str, Any] = {
            "id": request_id,
            "function": fn.spec.logical_id,
            "trigger": trigger,
            "started": iso_utc(started_at),
        }
        ok, outcome = True, None
        try:
            handler = fn.handler()
            with self.lock:
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
        with self.lock:
            self.invocations.append(entry)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(entry, event)
            except Exception:  # a listener's bug must not turn into the invocation's result
                log.exception("invocation listener failed")
        return ok, outcome

    def run_async(self, fn: LocalFunction, event: Any, trigger: str) -> None:
        """An event invoke: retried MaximumRetryAttempts times (async only), then dead-lettered."""
        attempts = 1 + max(0, fn.spec.max_retries) if trigger == "async" else 1
        for _ in range(attempts):
            ok, outcome = self.execute(fn, event, trigger)
            if ok:
                return
        self.dead_letter(trigger, fn.spec.logical_id, str(outcome), event)

    def dead_letter(self, source: str, target: str, error: str, payload: Any) -> None:
        """Record work that failed for good: where it came from, where it was going, why, and its payload."""
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        with self.lock:
            self.dead_letters.append(
                {
                    "source": source,
                    "target": target,
                    "error": error[:500],
                    "at": iso_utc(self.sb.clock.now()),
                    "payload": text[:4000],
                }
            )

    # -- Function URLs -------------------------------------------------------------------------------------------------

    def _function_url(self, request: Request, dir_name: str, rest: str = "") -> Response:
        spec = self.template.function_for_dir(dir_name)
        if spec is None or not spec.url:
            return url_error(403, "Forbidden")
        if self.closed or self.held:
            return url_error(503, "Service Unavailable")
        body = request.get_data(cache=True)
        if len(body) > MAX_SYNC_PAYLOAD:
            return url_error(413, f"Request must be smaller than {MAX_SYNC_PAYLOAD} bytes for the InvokeFunction")
        event = url_event(request, spec, "/" + rest, body, self.sb.clock.now())
        ok, result = self.execute(self.functions[spec.logical_id], event, "url")
        if not ok:
            return url_error(502, "Internal Server Error")
        try:
            return url_response(result)
        except (TypeError, ValueError):
            log.exception("%s returned a response a Function URL cannot send", spec.logical_id)
            return url_error(502, "Internal Server Error")

    # -- async invokes ---------------------------------------------------------------------------------------------

    def _invoke_async(self, request: Request, name: str) -> Response:
        refused = self.accept_invoke(name, request.get_data(cache=True))
        if refused is not None:
            return _lambda_error(*refused)
        return Response(b"", status=202)

    def accept_invoke(self, name: str, data: bytes) -> tuple[int, str, str] | None:
        """An async invoke as Lambda's Invoke API takes it (`InvocationType=Event`): None once queued, else the
        refusal (status, error type, message). The HTTP route and the in-process hand-off (`seams`) share it."""
        try:
            fn = self.function(name)
        except KeyError:
            return 404, "ResourceNotFoundException", f"Function not found: {name}"
        if len(data) > MAX_ASYNC_PAYLOAD:
            return 413, "RequestTooLargeException", "Request must be smaller than 262144 bytes"
        try:
            event = json.loads(data) if data.strip() else {}
        except (ValueError, UnicodeDecodeError):
            return 400, "InvalidRequestContentException", "Could not parse request body into json"
        try:
            self.start_task(self.run_async, fn, event, "async")
        except RuntimeError:
            return 503, "ServiceException", "the local host is closed"
        return None

    def accept_queue_message(self, queue_id: str, message: Any) -> tuple[int, dict[str, Any]]:
        """SendMessage of `{"body", "group", "dedup_id"}` to a queue: (200, answer) or (status, SQS's error)."""
        return self._queues.accept(queue_id, message)

    # -- state -----------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Functions, recent invocations, queue depths, dead letters and next schedule ticks (no secrets)."""
        with self.lock:
            return {
                "url": self.urls.base,
                "template": str(self.template.path),
                "functions": [fn.describe(self.urls) for fn in self.functions.values()],
                "invocations": list(self.invocations),
                "queues": self._queues.state(),
                "dead_letters": list(self.dead_letters),
                "schedules": self._scheduler.state(),
                "active": self._active,
                "held": self.held,
                "closed": self.closed,
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


def _seams() -> ModuleType:
    # Imported when a host starts: the seams import the gpufarm runtime, which this module otherwise never needs.
    from gpufarm_sandbox.localhost import seams

    return seams


def _install_seams() -> None:
    _seams().install()
