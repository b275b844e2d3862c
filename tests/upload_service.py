"""The profile upload function on a loopback port, over in-memory Datadog fakes, with S3 as moto's server (presigned
URLs checked as S3 checks them, gpufarm_sandbox.localhost.s3_server): what a researcher's `gpufarm profile upload`
talks to, and what the tests look at (the lease's history, the bucket's objects, the function's log)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from gpufarm.core.config.farm import FarmConfig, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.upload_token import mint
from gpufarm.core.leases import profile_runs
from gpufarm.core.leases.upload_tokens import expiry
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import profile_upload
from gpufarm.handlers import runtime as rt
from gpufarm_sandbox.localhost.s3_server import CheckedMotoServer

ALICE, MATE, STRANGER = "U0000000001", "U0000000002", "U0000000009"
TOKEN_KEY = "upload-endpoint-test-key-0123456789"
BUCKET = "gpufarm-profiles-uploads"  # and a number: moto's backends outlive its servers in one process
ACCESS, SECRET = "AKIAUPLOADTESTS00001", "upload-tests-not-a-secret"
PAGES = "http://127.0.0.1:9/pages"
MEMBERS = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{users: [{ALICE}, {MATE}]}}\n    max_days: 30\n"
).replace("  vision:\n    max_days: 14\n", "  vision:\n    members: {users: [U0000000005]}\n    max_days: 14\n")


@dataclass
class UploadService:
    """The running function, its lease world and the bucket."""

    url: str
    s3_url: str
    svc: GpuFarm
    clock: FakeClock
    incidents: FakeIncidents
    metrics: FakeMetrics
    s3: Any
    bucket: str
    logs: list[str] = field(default_factory=list)

    def lease(self, requester: str = ALICE, team: str = "nlp") -> int:
        """A new open lease of `team` requested by `requester`; its IR."""
        values = {"gpu_count": "1", "gpu_model": "H100", "environment": "hpc", "team": team, "project": "llm"}
        request = build_request(values, self.svc.context.farm, requester=requester, channel=None, request_id=_id())
        alloc, _ = self.svc.create_request(request)
        return alloc.ir

    def token(self, ir: int, user: str = ALICE, expires: datetime | None = None) -> str:
        """The token `/gpu profile-token IR-n` would give `user`."""
        alloc = self.alloc(ir)
        return mint(ir, user, expires or expiry(alloc, self.clock.now()), TOKEN_KEY.encode())

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def runs(self, ir: int) -> list[profile_runs.Run]:
        return profile_runs.runs(self.alloc(ir).history)

    def objects(self, prefix: str = "") -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def with_farm(self, text: str) -> FarmConfig:
        """Run the function on another farm file from now on (a team's members changed)."""
        farm = parse_farm(text)
        rt.override(service=self.svc, farm=farm, clock=self.clock)
        return farm

    def env(self) -> dict[str, str]:
        """What the researcher's process needs besides its token."""
        return {"GPUFARM_API_URL": self.url}


_count = iter(range(1, 10**6))


def _id() -> str:
    return f"r-{next(_count):06d}"


class _Spec:
    logical_id = "ProfileUploadFunction"


def function_app(logs: list[str]) -> Any:
    """The upload function behind a WSGI app, as its Function URL serves it."""
    from gpufarm_sandbox.localhost.function_url import url_event, url_response

    @Request.application  # type: ignore[misc]
    def app(request: Request) -> Response:
        event = url_event(request, _Spec(), request.path, request.get_data(), 0.0)
        answer = profile_upload.handle(event)
        logs.append(f"{request.method} {request.path} -> {answer['statusCode']} {answer['body'][:300]}")
        return url_response(answer)

    return app


@contextmanager
def upload_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[UploadService]:
    """Start S3 (moto, checked), the function's HTTP front and the fakes; everything put back at the end."""
    moto = CheckedMotoServer({ACCESS: SECRET})
    moto.start()
    host, port = moto.get_host_and_port()
    s3_url = f"http://{host}:{port}"
    bucket = f"{BUCKET}-{next(_count)}"
    for key, value in {
        "AWS_ENDPOINT_URL_S3": s3_url,
        "AWS_ACCESS_KEY_ID": ACCESS,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUFARM_PROFILE_BUCKET": bucket,
        "GPUFARM_PROFILE_PAGES_URL": PAGES,
        "GPUFARM_PROFILE_LINK_SECRET": "upload-endpoint-link-secret",
        "GPUFARM_UPLOAD_TOKEN_SECRET": TOKEN_KEY,
    }.items():
        monkeypatch.setenv(key, value)
    for name in ("GPUFARM_SECRETS_NAME", "GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_IR", "GPUFARM_UPLOAD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from gpufarm.adapters.aws import forget_clients

    forget_clients()
    s3 = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET,
        config=Config(signature_version="s3v4"),
    )
    s3.create_bucket(Bucket=bucket)
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    metrics = FakeMetrics()
    farm = parse_farm(MEMBERS)
    svc = GpuFarm(
        incidents=incidents, hosts=FakeHosts(), chat=FakeChat(), clock=clock, farm=farm, metrics=metrics, queue=None
    )
    rt.override(service=svc, farm=farm, clock=clock)
    logs: list[str] = []
    server = make_server("127.0.0.1", 0, function_app(logs), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield UploadService(
            f"http://127.0.0.1:{server.server_port}", s3_url, svc, clock, incidents, metrics, s3, bucket, logs
        )
    finally:
        server.shutdown()
        thread.join(timeout=5)
        moto.stop()
        rt.reset()
        forget_clients()


def call(service: UploadService, path: str, body: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    """POST to the function as any HTTP client would; (status, JSON answer)."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(service.url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def put(url: str, data: bytes) -> int:
    """PUT bytes to a (presigned) URL; the HTTP status."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
