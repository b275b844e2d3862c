"""The local seams: what the local function host puts in place of AWS and wall time inside the runtime.

In Lambda the runtime builds a boto3 invoker and queue and reads wall time. Under `gpufarm local` the same
handlers run in-process against the sandbox, so this module installs a seam provider
(`gpufarm.handlers.runtime.install_seams`) that, for environments the local host made (they carry
GPUFARM_LOCAL_INVOKE_URL), hands the runtime:
- the sandbox's virtual clock (Slack signatures from the sandbox carry sandbox time, and expiries are judged
  on it even after a demo or test moved it forward);
- invokes and queue messages handed to the local host;
- the example farm file when no farm configuration is set;
- the farm file's AWS and Azure inventory sources on simulated clouds (gpufarm_sandbox.clouds: moto for EC2, a
  stubbed Azure transport);
- the clouds' price lists, simulated (gpufarm_sandbox.pricelists).
The production wiring knows none of these names.

The clock, invokes and queue messages travel over HTTP to whatever host the URLs name, except when the host
serving that URL runs in this very process (it always does under `gpufarm local`): then they are handed to it
directly, through the same checks its HTTP routes make. Every function shares one interpreter here, so an HTTP
round trip to ourselves costs the ack path two socket hops, a server thread and a share of the GIL behind busy
workers (under load the two hops were ~90 % of the ingress's time); Lambda's own Invoke call is one quick
request.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpufarm.adapters.aws import _checked_function, _checked_sqs_id, _payload_bytes
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed
from gpufarm.handlers import runtime

if TYPE_CHECKING:
    from gpufarm_sandbox.localhost.function_host import FunctionHost

log = logging.getLogger(__name__)

LOCAL_INVOKE_ENV = "GPUFARM_LOCAL_INVOKE_URL"
SANDBOX_URL_ENV = "GPUFARM_SANDBOX_URL"
QUEUE_URL_ENV = runtime.QUEUE_URL_ENV
LOCAL_TIMEOUT_S = 5.0
EXAMPLE_FARM = Path("config") / "farm.example.yaml"


CLOCK_PATH = "/_sandbox/clock"
INVOKE_PATH = "/_local/invoke"
QUEUES_PATH = "/_local/queues/"

# Local hosts running in this process, by base URL (LocalHost registers itself while it serves).
_in_process: dict[str, FunctionHost] = {}
_in_process_lock = threading.Lock()


def serve_in_process(host: FunctionHost) -> None:
    """Hand this process's clock reads, invokes and queue messages for host's URLs to host directly."""
    with _in_process_lock:
        _in_process[host.urls.base] = host


def stop_in_process(host: FunctionHost) -> None:
    """Stop handing work to host directly (it is closing); a later host on the same URL keeps its entry."""
    with _in_process_lock:
        if _in_process.get(host.urls.base) is host:
            del _in_process[host.urls.base]


def in_process(url: str, path: str) -> tuple[FunctionHost, str] | None:
    """The live local host of this process whose base URL + path is url or a prefix of it, and the rest."""
    with _in_process_lock:
        hosts = list(_in_process.items())
    for base, host in hosts:
        prefix = base + path
        if url == prefix.rstrip("/") or url.startswith(prefix):
            return host, url[len(prefix) :].strip("/")
    return None


class SandboxClock:
    """The sandbox's virtual clock: under `gpufarm local` time is what the sandbox says (read directly when the
    sandbox runs in this process, else over HTTP)."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.url = url
        self.timeout = timeout

    def epoch(self) -> float:
        """Sandbox epoch seconds; wall time if the sandbox cannot be asked."""
        local = in_process(self.url, CLOCK_PATH)
        if local is not None:
            return local[0].clock.now()
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as response:  # noqa: S310 - local sandbox URL
                value = json.loads(response.read()).get("now")
            return float(value)
        except (OSError, ValueError, TypeError, AttributeError):
            log.warning("sandbox clock unreachable at %s; using wall time", self.url)
            return datetime.now(UTC).timestamp()

    def now(self) -> datetime:
        """Timezone-aware sandbox now."""
        return datetime.fromtimestamp(self.epoch(), UTC)


def _post_json(
    url: str,
    body: Mapping[str, Any],
    expected: int,
    what: str,
    *,
    timeout: float,
    opener: urllib.request.OpenerDirector | None,
) -> None:
    if not url.startswith(("http://", "https://")):
        raise ValidationFailed("url", f"{what}: {url[:80]!r} is not an http(s) URL")
    data = _payload_bytes(body, what)
    request = urllib.request.Request(  # noqa: S310 - the URL comes from our settings and is http(s), checked above
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        open_url = opener.open if opener is not None else urllib.request.urlopen
        with open_url(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UpstreamError(f"{what} to the local function host failed: {reason}") from None
    _check_status(status, expected, what)


def _check_status(status: int, expected: int, what: str) -> None:
    if status != expected:
        raise UpstreamError(f"{what} to the local function host answered {status}, expected {expected}")


class HostInvoker:
    """Async invokes handed to the local function host: POST {base}/{function} → 202 (or, for a host in this
    process, its `accept_invoke` directly)."""

    def __init__(
        self, base_url: str, *, timeout: float = LOCAL_TIMEOUT_S, opener: urllib.request.OpenerDirector | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._opener = opener

    def invoke(self, function: str, payload: Mapping[str, Any]) -> None:
        """Queue an invocation on the local host."""
        name = _checked_function(function)
        url = f"{self.base_url}/{quote(name, safe='')}"
        local = in_process(self.base_url, INVOKE_PATH) if self._opener is None else None
        if local is not None:
            # The event the function gets is decoded from the bytes, as from the Invoke API: never our dict.
            refused = local[0].accept_invoke(name, _payload_bytes(payload, f"invoke of {name}"))
            _check_status(202 if refused is None else refused[0], 202, f"invoke of {name}")
            return
        _post_json(url, payload, 202, f"invoke of {name}", timeout=self.timeout, opener=self._opener)


class HostQueue:
    """A queue of the local function host: POST {queue_url}/messages {"body", "group", "dedup_id"} → 200 (or, for
    a host in this process, its queues' `accept` directly)."""

    def __init__(
        self, queue_url: str, *, timeout: float = LOCAL_TIMEOUT_S, opener: urllib.request.OpenerDirector | None = None
    ) -> None:
        self.queue_url = queue_url.rstrip("/")
        self.timeout = timeout
        self._opener = opener

    def send(self, body: Mapping[str, Any], *, group: str, dedup_id: str) -> None:
        """Enqueue one message on the local host."""
        message = {
            "body": dict(body),
            "group": _checked_sqs_id("group", group),
            "dedup_id": _checked_sqs_id("dedup_id", dedup_id),
        }
        local = in_process(self.queue_url, QUEUES_PATH) if self._opener is None else None
        if local is not None:
            host, queue_id = local
            # Through JSON, as over HTTP: the consumer gets the message body's own copy.
            status, _ = host.accept_queue_message(queue_id, json.loads(_payload_bytes(message, "queue message")))
            _check_status(status, 200, "queue message")
            return
        _post_json(
            f"{self.queue_url}/messages", message, 200, "queue message", timeout=self.timeout, opener=self._opener
        )


def local_invoke_url(env: Mapping[str, str]) -> str | None:
    """The local function host's invoke URL when the environment is one the local host made, else None."""
    value = env.get(LOCAL_INVOKE_ENV, "").strip()
    return value or None


def local_seams(settings: Settings, env: Mapping[str, str]) -> dict[str, Any]:
    """The seam provider: local collaborators for environments of the local host, nothing for any other."""
    invoke_url = local_invoke_url(env)
    if invoke_url is None:
        return {}
    base = env.get(SANDBOX_URL_ENV) or settings.datadog_base_url()
    parts: dict[str, Any] = {
        "clock": SandboxClock(f"{base.rstrip('/')}{CLOCK_PATH}"),
        "invoker": HostInvoker(invoke_url),
    }
    queue_url = env.get(QUEUE_URL_ENV, "").strip()
    if queue_url:
        parts["queue"] = HostQueue(queue_url)
    # The farm file's AWS and Azure inventory sources read simulated clouds (moto, a stubbed Azure) locally; imported
    # here, so that loading the seams (every `gpufarm report` in a development install) does not import moto.
    from gpufarm_sandbox.clouds import clouds_for

    parts["inventory_sources"] = clouds_for(base).sources
    # The clouds' price lists, simulated in this process (the farm's cloud pools priced without a cloud).
    from gpufarm_sandbox.pricelists import SimulatedPriceLists

    parts["price_lists"] = SimulatedPriceLists().lists()
    if not settings.farm_config and not settings.farm_config_parameter:
        example = find_example_farm()
        if example is not None:
            parts["farm_config"] = str(example)
    return parts


def find_example_farm() -> Path | None:
    """config/farm.example.yaml of the working directory or of the checkout this package runs from."""
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = base / EXAMPLE_FARM
        if candidate.is_file():
            return candidate
    return None


def install() -> None:
    """Put the local seams into the runtime (idempotent)."""
    runtime.install_seams(local_seams)
