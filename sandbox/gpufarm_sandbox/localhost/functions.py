"""A function of the template as the local host runs it: its handler module loaded on first use (a cold start),
the `context` object Lambda's Python runtime passes, and the errors an invocation can end in."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from gpufarm_sandbox.localhost.env import ACCOUNT_ID, REGION, Urls
from gpufarm_sandbox.localhost.template import FunctionSpec

log = logging.getLogger("gpufarm_sandbox.localhost")


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
