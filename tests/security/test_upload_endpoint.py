"""The profile upload function (docs/security.md, "Threat model", "Profiler uploads").

Researchers hold only a lease's upload token: the function verifies it on every call, re-reads the lease, signs
PUT URLs for the lease's own incoming keys, and analyses, stores and records what was uploaded itself. One test per
bad case; each checks the status, the short reason, that nothing was stored or recorded, and that the token is
never echoed. The function runs on a loopback port over in-memory Datadog fakes, S3 is moto's server with
presigned URLs checked as S3 checks them (tests/upload_service.py).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from upload_service import ALICE, MATE, MEMBERS, UploadService, call, put, upload_service

from gpufarm.profiling import analysis

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"
TRACE = (FIXTURES / "cpu_mlp.json.gz").read_bytes()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Iterator[UploadService]:
    caplog.set_level(logging.DEBUG)
    with upload_service(monkeypatch) as running:
        yield running


def _begin(service: UploadService, ir: int, token: str | None, size: int = len(TRACE), **extra: Any) -> Any:
    body = {"ir": ir, "batch_size": 32, "runs": [{"name": "run-1", "bytes": size, "file": "trace.json.gz"}], **extra}
    return call(service, "/begin", body, token)


def _begun(service: UploadService, ir: int, token: str, data: bytes = TRACE) -> dict[str, Any]:
    status, answer = _begin(service, ir, token, len(data))
    assert status == 200, answer
    assert put(answer["runs"][0]["url"], data) == 200
    return dict(answer)


def _nothing_kept(service: UploadService, ir: int, token: str, caplog: pytest.LogCaptureFixture) -> None:
    assert service.runs(ir) == [] and service.objects() == []
    assert token not in caplog.text and all(token not in line for line in service.logs)


# -- the token ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "forged", "expired", "malformed"])
def test_a_token_that_is_not_good_is_refused_401_and_nothing_is_stored(
    service: UploadService, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    ir = service.lease()
    good = service.token(ir)
    token = {
        "missing": None,
        "forged": good[:-6] + ("AAAAAA" if not good.endswith("AAAAAA") else "BBBBBB"),
        "expired": service.token(ir, expires=service.clock.now() - timedelta(seconds=1)),
        "malformed": "gfu1." + "x" * 400,
    }[case]
    status, answer = _begin(service, ir, token)
    reason = {
        "missing": "an upload token is required",
        "forged": "not gpufarm's",
        "expired": "expired",
        "malformed": "malformed",
    }[case]
    assert status == 401 and reason in answer["error"], answer
    # complete is held to the same check.
    status, answer = call(service, "/complete", {"upload": "gft1.x.y"}, token)
    assert status == 401
    _nothing_kept(service, ir, token or good, caplog)


def test_another_leases_token_is_refused_403(service: UploadService, caplog: pytest.LogCaptureFixture) -> None:
    ir, other = service.lease(), service.lease()
    token = service.token(other)
    status, answer = _begin(service, ir, token)
    assert (status, answer["error"]) == (403, f"the upload token is not for IR-{ir}")
    _nothing_kept(service, ir, token, caplog)


def test_a_user_who_left_the_team_is_refused_403(service: UploadService, caplog: pytest.LogCaptureFixture) -> None:
    ir = service.lease()
    token = service.token(ir, MATE)
    assert _begin(service, ir, token)[0] == 200  # a team member may upload...
    service.with_farm(MEMBERS.replace(f"[{ALICE}, {MATE}]", f"[{ALICE}]"))
    status, answer = _begin(service, ir, token)  # ...until they leave the team
    assert status == 403 and "members of team nlp can upload" in answer["error"]
    _nothing_kept(service, ir, token, caplog)


def test_an_ended_lease_is_refused_409_and_nothing_is_stored(
    service: UploadService, caplog: pytest.LogCaptureFixture
) -> None:
    ir = service.lease()
    token = service.token(ir)
    service.svc.release(ir, ALICE)
    status, answer = _begin(service, ir, token)
    assert status == 409 and f"IR-{ir} has ended" in answer["error"]
    _nothing_kept(service, ir, token, caplog)


# -- the upload --------------------------------------------------------------------------------------------------


def test_a_good_upload_is_analysed_stored_recorded_and_its_upload_deleted(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token)
    (url,) = [run["url"] for run in begun["runs"]]
    assert f"/incoming/ir-{ir}/" in url and "X-Amz-Signature=" in url and "X-Amz-Expires=900" in url
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 200, answer
    (run,) = answer["runs"]
    assert (run["name"], run["steps"], run["recorded"]) == ("run-1", 5, True)
    assert [r.run for r in service.runs(ir)] == ["run-1"]
    assert service.objects("incoming/") == [] and len(service.objects("profiles/")) == 3


def test_the_lease_ending_before_complete_refuses_it_and_deletes_the_upload(
    service: UploadService, caplog: pytest.LogCaptureFixture
) -> None:
    ir = service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token)
    assert len(service.objects("incoming/")) == 1
    service.svc.release(ir, ALICE)
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 409 and "has ended" in answer["error"]
    _nothing_kept(service, ir, token, caplog)


def test_the_lease_ending_during_the_analysis_is_refused_at_recording_and_nothing_is_kept(
    service: UploadService, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token)
    real = analysis.analyse

    def analyse_then_end(*args: Any, **kwargs: Any) -> Any:
        figures = real(*args, **kwargs)
        service.svc.release(ir, ALICE)  # the lease ends while the function works
        return figures

    monkeypatch.setattr("gpufarm.profiling.upload.analyse", analyse_then_end)
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 409 and "ended during the upload" in answer["error"], answer
    assert service.runs(ir) == []
    # The run stored before the check and the upload itself are gone; only the team's newest-run summary remains.
    assert [k for k in service.objects() if not k.startswith("profiles/latest/")] == []


def test_a_replayed_completed_ticket_is_refused_and_the_run_recorded_once(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token)
    assert call(service, "/complete", {"upload": begun["upload"]}, token)[0] == 200
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 409 and "completed already" in answer["error"]
    # Even the same bytes PUT again (the URL still lives) make the same command, which is recorded once.
    assert put(begun["runs"][0]["url"], TRACE) == 200
    assert call(service, "/complete", {"upload": begun["upload"]}, token)[0] == 200
    assert [r.run for r in service.runs(ir)] == ["run-1"]


def test_a_presigned_url_used_for_another_key_is_refused_by_s3(service: UploadService) -> None:
    ir, other = service.lease(), service.lease()
    begun = _begun(service, ir, service.token(ir))
    url = begun["runs"][0]["url"]
    for target in (url.replace(f"/incoming/ir-{ir}/", f"/incoming/ir-{other}/"), url.replace("/0-run-1?", "/0-run-2?")):
        assert put(target, TRACE) == 403
        assert put(target.replace("/incoming/", "/profiles/"), TRACE) == 403
    # A PUT with no signature at all is refused as a private bucket refuses it.
    assert put(url.split("?")[0], TRACE) == 403
    assert service.objects("incoming/") == [begun["runs"][0]["url"].split(service.bucket + "/")[1].split("?")[0]]


def test_a_ticket_edited_or_used_with_another_token_is_refused(service: UploadService) -> None:
    ir, other = service.lease(), service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token)
    version, payload, signature = begun["upload"].split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["ir"] = other
    edited = ".".join((version, base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode(), signature))
    assert call(service, "/complete", {"upload": edited}, service.token(other))[0] == 401
    # A team mate's own token, on the same lease: the upload is Alice's.
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, service.token(ir, MATE))
    assert status == 403 and "another upload token" in answer["error"]
    assert service.runs(ir) == []


def test_an_oversize_trace_declared_or_uploaded_is_refused(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    status, answer = _begin(service, ir, token, size=2 * 10**9)
    assert status == 413 and "under 2 GB" in answer["error"]
    assert _begin(service, ir, token, size=0)[0] == 400
    # Declared small, sent large: refused at complete, the upload deleted.
    status, begun = _begin(service, ir, token, size=100)
    assert status == 200 and put(begun["runs"][0]["url"], TRACE) == 200
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 413 and "declared" in answer["error"]
    assert service.runs(ir) == [] and service.objects() == []


def test_a_bad_trace_is_refused_400_and_its_upload_deleted(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    begun = _begun(service, ir, token, data=b'{"hello": "world"}')
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, token)
    assert status == 400 and "no traceEvents" in answer["error"]
    assert service.runs(ir) == [] and service.objects() == []


def test_bad_requests_are_refused_with_a_reason(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    assert call(service, "/begin", b"not json", token)[0] == 400
    assert call(service, "/begin", {"ir": ir, "runs": []}, token)[0] == 400
    assert _begin(service, ir, token, runs=[{"name": "Bad Name!", "bytes": 10}])[0] == 400
    two = [{"name": "a", "bytes": 10}, {"name": "a", "bytes": 10}]
    assert _begin(service, ir, token, runs=two)[0] == 400
    assert _begin(service, ir, token, runs=[{"name": f"r{i}", "bytes": 10} for i in range(17)])[0] == 400
    assert call(service, "/nowhere", {}, token)[0] == 404
    assert service.objects() == []


# -- the researcher's process ------------------------------------------------------------------------------------


def test_the_upload_cli_succeeds_with_only_the_token_and_the_url(service: UploadService) -> None:
    ir = service.lease()
    token = service.token(ir)
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    env.update(GPUFARM_UPLOAD_TOKEN=token, GPUFARM_API_URL=service.url)
    assert not [n for n in env if n.startswith(("DD_", "AWS_", "SLACK_")) or "SECRET" in n]
    args = [sys.executable, "-m", "gpufarm", "profile", "upload", str(FIXTURES / "cpu_mlp.json.gz"), "--ir", f"IR-{ir}"]
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert f"IR-{ir} cpu_mlp: 5 steps" in done.stdout and token not in done.stdout + done.stderr
    assert [r.run for r in service.runs(ir)] == ["cpu_mlp"]


def test_a_ticket_never_outlives_its_token(service: UploadService) -> None:
    ir = service.lease()
    ends = service.clock.now() + timedelta(minutes=5)
    token = service.token(ir, expires=ends)
    begun = _begun(service, ir, token)
    assert begun["expires"] == int(ends.timestamp())
    service.clock.advance(minutes=6)
    status, answer = call(service, "/complete", {"upload": begun["upload"]}, service.token(ir))
    assert status == 401 and "ticket has expired" in answer["error"]
    assert service.runs(ir) == []
