"""The local seams the sandbox injects into the runtime: the host's invoker and queue, the sandbox clock."""

from __future__ import annotations

import io
import json
import urllib.request
from email.message import Message
from typing import Any

import pytest

from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed
from gpufarm.handlers import runtime
from gpufarm_sandbox.localhost import seams


def test_seams_apply_only_to_environments_of_the_local_host() -> None:
    env = {
        "GPUFARM_LOCAL_INVOKE_URL": "http://127.0.0.1:8320/_local/invoke",
        "GPUFARM_ALLOCATION_QUEUE_URL": "http://127.0.0.1:8320/_local/queues/Alloc",
        "GPUFARM_SANDBOX_URL": "http://127.0.0.1:8320",
    }
    parts = seams.local_seams(Settings(), env)
    assert isinstance(parts["invoker"], seams.HostInvoker)
    assert parts["invoker"].base_url == "http://127.0.0.1:8320/_local/invoke"
    assert isinstance(parts["queue"], seams.HostQueue)
    assert isinstance(parts["clock"], seams.SandboxClock)
    assert parts["clock"].url == "http://127.0.0.1:8320/_local/../_sandbox/clock".replace("/_local/..", "")
    assert seams.local_seams(Settings(), {}) == {}


def test_the_runtime_uses_production_collaborators_without_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_seam_providers", [])
    for name in ("GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_ALLOCATION_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)
    rt = runtime.Runtime(Settings(), {"GPUFARM_LOCAL_INVOKE_URL": "http://127.0.0.1:1/_local/invoke"})
    from gpufarm.adapters.aws import LambdaInvoker

    assert isinstance(rt.invoker(), LambdaInvoker)
    assert isinstance(rt.clock(), runtime.SystemClock)


def test_installed_seams_reach_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_seam_providers", [])
    seams.install()
    seams.install()
    assert runtime._seam_providers == [seams.local_seams]
    rt = runtime.Runtime(Settings(), {"GPUFARM_LOCAL_INVOKE_URL": "http://127.0.0.1:1/_local/invoke"})
    assert isinstance(rt.invoker(), seams.HostInvoker)
    assert isinstance(rt.clock(), seams.SandboxClock)
    assert rt.settings.farm_config and rt.settings.farm_config.endswith("farm.example.yaml")


# -- local variants (an in-process urllib handler plays the local function host: unit tests have no sockets) ------


class _Receiver(urllib.request.BaseHandler):
    """Answers http(s) requests in-process and records them."""

    handler_order = 100  # ahead of urllib's own HTTPHandler

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []

    def http_open(self, req: urllib.request.Request) -> Any:
        body = req.data if isinstance(req.data, bytes) else b""
        self.requests.append((req.get_method(), req.full_url, dict(req.header_items()), json.loads(body)))
        response = urllib.request.addinfourl(io.BytesIO(b""), Message(), req.full_url, self.status)  # type: ignore[attr-defined]
        response.msg = "OK"
        return response


def _opener(status: int) -> tuple[urllib.request.OpenerDirector, _Receiver]:
    receiver = _Receiver(status)
    return urllib.request.build_opener(receiver), receiver


def test_local_invoker_posts_the_payload_to_the_function_url() -> None:
    opener, receiver = _opener(202)
    invoker = seams.HostInvoker("http://127.0.0.1:8320/_local/invoke/", opener=opener)
    invoker.invoke("SlackWorkerFunction", {"user": "U1", "n": 8})
    method, url, headers, body = receiver.requests[0]
    assert (method, url) == ("POST", "http://127.0.0.1:8320/_local/invoke/SlackWorkerFunction")
    assert headers["Content-type"] == "application/json"
    assert body == {"n": 8, "user": "U1"}


def test_local_queue_posts_body_group_and_dedup_id() -> None:
    opener, receiver = _opener(200)
    queue = seams.HostQueue("http://127.0.0.1:8320/_local/queues/AllocationQueue", opener=opener)
    queue.send({"incident_id": "x"}, group="pool:cloud", dedup_id="x-1")
    method, url, _, body = receiver.requests[0]
    assert (method, url) == ("POST", "http://127.0.0.1:8320/_local/queues/AllocationQueue/messages")
    assert body == {"body": {"incident_id": "x"}, "group": "pool:cloud", "dedup_id": "x-1"}


def test_local_variants_report_wrong_statuses_and_bad_urls() -> None:
    opener, _ = _opener(500)
    with pytest.raises(UpstreamError, match="answered 500, expected 202"):
        seams.HostInvoker("http://127.0.0.1:1/_local/invoke", opener=opener).invoke("Fn", {})
    opener, _ = _opener(404)
    with pytest.raises(UpstreamError, match="answered 404, expected 200"):
        seams.HostQueue("http://127.0.0.1:1/_local/queues/Q", opener=opener).send({}, group="g", dedup_id="d")
    with pytest.raises(ValidationFailed, match="http"):
        seams.HostInvoker("file:///etc").invoke("Fn", {})
