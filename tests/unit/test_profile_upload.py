"""Uploading real profiler traces to a lease: checked, analysed, stored whole, recorded once through the one writer.

The traces are tests/fixtures/profiler's (real torch.profiler output); the store is S3 under moto, or one that
fails to show that a failed upload leaves the incident as it was.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics
from moto import mock_aws

from gpufarm.adapters.profile_store import PREFIX, SUMMARY, TRACE, S3ProfileStore
from gpufarm.config import Settings
from gpufarm.core.chat.escape import inert
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import Conflict, NotAllowed, NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.leases import profile_runs
from gpufarm.core.service import GpuFarm
from gpufarm.profiling import summary
from gpufarm.profiling.links import LinkSigner
from gpufarm.profiling.page import render_summary
from gpufarm.profiling.upload import RECORDED, upload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiler"
ALICE, MATE, STRANGER = "U0000000001", "U0000000002", "U0000000009"
PAGES = "https://pages.example.test"
SIGNER = LinkSigner(b"test-link-secret")
BUCKET = "gpufarm-profiles-test"
YAML = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{users: [{ALICE}, {MATE}]}}\n    max_days: 30\n"
).replace("  vision:\n    max_days: 14\n", "  vision:\n    members: {users: [U0000000005]}\n    max_days: 14\n")


class FailingStore:
    """A store whose S3 is down: the summary never lands (the adapter deletes the trace it stored first)."""

    def put_run(self, key: str, trace_gz: Path, summary: bytes, latest: str | None = None) -> None:
        raise UpstreamError("S3 did not store the run's summary after 3 attempts (ServiceUnavailable)")


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    metrics: FakeMetrics
    store: S3ProfileStore
    s3: object
    ir: int

    def alloc(self) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(self.ir))

    def stored(self) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=BUCKET)  # type: ignore[attr-defined]
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def up(self, *paths: Path, actor: str = ALICE, store: object = None, **kw: object) -> list[object]:
        return list(
            upload(
                self.svc.context,
                store or self.store,  # type: ignore[arg-type]
                kw.pop("signer", SIGNER),  # type: ignore[arg-type]
                pages_url=kw.pop("pages_url", PAGES),  # type: ignore[arg-type]
                retention_days=kw.pop("retention_days", 30),  # type: ignore[arg-type]
                ir=kw.pop("ir", self.ir),  # type: ignore[arg-type]
                actor=actor,
                paths=list(paths),
                **kw,  # type: ignore[arg-type]
            )
        )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    metrics = FakeMetrics()
    farm = parse_farm(YAML)
    svc = GpuFarm(
        incidents=incidents, hosts=FakeHosts(), chat=FakeChat(), clock=clock, farm=farm, metrics=metrics, queue=None
    )
    values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm"}
    request = build_request(values, farm, requester=ALICE, channel=None, request_id="r-000001")
    alloc, _ = svc.create_request(request)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        store = S3ProfileStore(Settings(max_retries=1), BUCKET, client=s3)
        yield World(svc, incidents, metrics, store, s3, alloc.ir)


def test_an_upload_stores_trace_and_summary_records_the_link_and_publishes_metrics(world: World) -> None:
    (done,) = world.up(FIXTURES / "cpu_mlp.json", name="run-7", batch_size=32)
    folder = PREFIX + done.key + "/"  # type: ignore[attr-defined]
    assert world.stored() == [folder + SUMMARY, folder + TRACE, PREFIX + "latest/nlp/" + SUMMARY]
    stored = world.s3.get_object(Bucket=BUCKET, Key=folder + SUMMARY)["Body"].read()  # type: ignore[attr-defined]
    data = summary.parse(stored, done.key)  # type: ignore[attr-defined]
    assert (data.ir, data.run, data.trace_name) == (world.ir, "run-7", "cpu_mlp.json")
    assert data.figures() == done.figures  # type: ignore[attr-defined]
    assert world.store.summary(done.key) == stored  # type: ignore[attr-defined]
    page = render_summary(data)
    assert "IR-" in page and "run-7" in page and "<svg" in page
    (run,) = profile_runs.runs(world.alloc().history)
    assert run.run == "run-7" and run.actor == ALICE and run.link == done.link  # type: ignore[attr-defined]
    assert run.details.startswith("5 steps, ")
    key, query = run.link.removeprefix(PAGES + "/profiles/").split("?")
    args = dict(part.split("=") for part in query.split("&"))
    SIGNER.check(key, args["expires"], args["sig"], now=world.svc.context.clock.now().timestamp())
    tags = (f"ir:ir-{world.ir}", "run:run-7", "project:llm", "team:nlp")
    assert world.metrics.value("gpufarm.profile.steps", *tags) == 5
    assert (world.metrics.value("gpufarm.profile.throughput", *tags) or 0) > 0


@pytest.mark.parametrize(("retention_days", "bound_days", "lives_days"), [(30, 7, 7), (3, 30, 3), (30, 30, 30)])
def test_a_run_link_lives_as_long_as_the_run_is_kept_but_never_past_the_bound(
    world: World, retention_days: int, bound_days: int, lives_days: int
) -> None:
    signer = LinkSigner(b"test-link-secret", max_age_s=bound_days * 86_400)
    (done,) = world.up(FIXTURES / "cpu_mlp.json", signer=signer, retention_days=retention_days)
    expires = int(done.link.split("expires=")[1].split("&")[0])  # type: ignore[attr-defined]
    now = world.svc.context.clock.now().timestamp()
    assert expires == int(now) + lives_days * 86_400


def test_a_team_member_may_upload_and_a_gzipped_trace_is_stored_as_it_came(world: World) -> None:
    (done,) = world.up(FIXTURES / "cpu_mlp.json.gz", actor=MATE)
    stored = world.s3.get_object(Bucket=BUCKET, Key=PREFIX + done.key + "/" + TRACE)  # type: ignore[attr-defined]
    assert stored["Body"].read() == (FIXTURES / "cpu_mlp.json.gz").read_bytes()
    assert done.run == "cpu_mlp"  # type: ignore[attr-defined]


def test_someone_not_on_the_lease_is_refused_and_nothing_is_stored(world: World) -> None:
    with pytest.raises(NotAllowed, match="requester or members of team nlp"):
        world.up(FIXTURES / "cpu_mlp.json", actor=STRANGER)
    assert world.stored() == [] and profile_runs.runs(world.alloc().history) == [] and world.metrics.series == []


def test_an_unknown_or_resolved_ir_is_refused(world: World) -> None:
    with pytest.raises(NotFound):
        world.up(FIXTURES / "cpu_mlp.json", ir=world.ir + 100)
    world.svc.release(world.ir, ALICE)
    with pytest.raises(Conflict, match="has ended"):
        world.up(FIXTURES / "cpu_mlp.json")
    assert world.stored() == []


def test_one_bad_trace_refuses_the_whole_upload(world: World, tmp_path: Path) -> None:
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((FIXTURES / "cpu_mlp.json.gz").read_bytes()[:9000])
    with pytest.raises(ValidationFailed, match="truncated or corrupt gzip"):
        world.up(FIXTURES / "cpu_mlp.json", cut)
    assert world.stored() == [] and profile_runs.runs(world.alloc().history) == []


def test_bad_names_and_batch_sizes_are_refused(world: World) -> None:
    with pytest.raises(ValidationFailed, match="run name"):
        world.up(FIXTURES / "cpu_mlp.json", name="Run 7")
    with pytest.raises(ValidationFailed, match="batch size"):
        world.up(FIXTURES / "cpu_mlp.json", batch_size=0)
    assert world.stored() == []


def test_s3_failing_leaves_the_incident_as_it_was(world: World) -> None:
    before = world.alloc().history
    with pytest.raises(UpstreamError, match="after 3 attempts"):
        world.up(FIXTURES / "cpu_mlp.json", store=FailingStore())
    assert world.alloc().history == before and world.metrics.series == []


@pytest.mark.parametrize(("failing", "what"), [(2, "the run's summary"), (3, "the team's newest-run summary")])
def test_the_store_leaves_nothing_of_a_run_it_could_not_store_whole(
    world: World, tmp_path: Path, failing: int, what: str
) -> None:
    calls = {"n": 0}
    real_put = world.s3.put_object  # type: ignore[attr-defined]

    def put(**kw: object) -> object:
        calls["n"] += 1
        if calls["n"] == failing:
            raise world.s3.exceptions.ClientError(  # type: ignore[attr-defined]
                {"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, "PutObject"
            )
        return real_put(**kw)

    world.s3.put_object = put  # type: ignore[attr-defined]
    gz = tmp_path / "t.json.gz"
    shutil.copy(FIXTURES / "cpu_mlp.json.gz", gz)
    with pytest.raises(UpstreamError, match=rf"{what} after 2 attempts \(ServiceUnavailable\)"):
        world.store.put_run("ir-1/run-1-20261201t150000z", gz, b"{}", latest="latest/nlp")
    assert world.stored() == []


def test_a_redelivered_profile_command_appends_nothing(world: World) -> None:
    (done,) = world.up(FIXTURES / "cpu_mlp.json", name="run-1")
    (run,) = profile_runs.runs(world.alloc().history)
    from gpufarm.core.kernel.serial import ProfileScope

    scope = ProfileScope(run="run-1", summary=run.details, link=run.link)
    again = IncidentCommand(op=Op.PROFILE, ir=world.ir, actor=ALICE, reply_to=ALICE, origin=done.key, profile=scope)  # type: ignore[attr-defined]
    executor.execute(world.svc.context, again)
    assert len(profile_runs.runs(world.alloc().history)) == 1


def test_gpu_status_lists_the_run_with_its_link(world: World) -> None:
    (done,) = world.up(FIXTURES / "cpu_mlp.json", name="run-3")
    text = world.svc.status(world.ir, ALICE).text
    # Slack text: the link's `&` is sent as `&amp;` (Slack reads it back as `&`).
    assert "profiled: run run-3; 5 steps" in text and inert(done.link) in text  # type: ignore[attr-defined]


def test_a_run_whose_link_would_not_fit_the_history_is_refused_before_anything_is_stored(world: World) -> None:
    lambda_url = "https://abcdefghijklmnopqrstuvwxyz012345.lambda-url.eu-central-1.on.aws/"
    with pytest.raises(ValidationFailed, match="shorter --name"):
        world.up(FIXTURES / "cpu_mlp.json", name="r" * 63, pages_url=lambda_url + "x" * 60)
    assert world.stored() == [] and profile_runs.runs(world.alloc().history) == []
    (done,) = world.up(FIXTURES / "cpu_mlp.json", name="r" * 63, pages_url=lambda_url)
    (run,) = profile_runs.runs(world.alloc().history)
    assert run.link == done.link and run.run == "r" * 63  # type: ignore[attr-defined]


class WriterQueue:
    """The pool's FIFO with its consumer: `send` runs the command as the one writer would, after `before` (the
    lease's own earlier commands in the same group), or holds it when `hold` (a consumer that has not run yet)."""

    def __init__(self, *, before: Callable[[], object] | None = None, hold: bool = False) -> None:
        self.before, self.hold = before, hold
        self.svc: GpuFarm | None = None
        self.sent: list[dict[str, object]] = []

    def send(self, body: Mapping[str, object], *, group: str, dedup_id: str) -> None:
        self.sent.append(dict(body))
        if self.hold:
            return
        if self.before is not None:
            self.before()
        assert self.svc is not None
        command = IncidentCommand.model_validate(body["command"])
        # A refused record (Conflict) is told to the uploader by DM; the incident is unchanged.
        with contextlib.suppress(Conflict):
            executor.execute(self.svc.context, command, redelivered_on_failure=False)


def _queued(world: World, queue: WriterQueue) -> World:
    """The same lease and store, its commands going through `queue` (the Lambda path)."""
    old = world.svc.context
    svc = GpuFarm(
        incidents=world.incidents,
        hosts=old.hosts,
        chat=old.chat,
        clock=old.clock,
        farm=old.farm,
        metrics=world.metrics,
        queue=queue,
    )
    queue.svc = svc
    return World(svc, world.incidents, world.metrics, world.store, world.s3, world.ir)


def test_a_queued_run_is_answered_recorded_once_the_pools_writer_has_recorded_it(world: World) -> None:
    queued = _queued(world, WriterQueue())
    (done,) = queued.up(FIXTURES / "cpu_mlp.json", name="run-q", record_wait_s=5)
    assert done.recorded == RECORDED  # type: ignore[attr-defined]
    assert [run.run for run in profile_runs.runs(world.alloc().history)] == ["run-q"]
    assert world.metrics.value("gpufarm.profile.steps", f"ir:ir-{world.ir}", "run:run-q") == 5


def test_a_lease_ending_before_the_writer_records_the_run_refuses_it_and_deletes_what_was_stored(
    world: World,
) -> None:
    queued = _queued(world, WriterQueue(before=lambda: world.svc.release(world.ir, ALICE)))
    with pytest.raises(Conflict, match="ended during the upload"):
        queued.up(FIXTURES / "cpu_mlp.json", name="run-late", record_wait_s=5)
    assert profile_runs.runs(world.alloc().history) == []
    assert [key for key in world.stored() if "/ir-" in key] == []
    assert world.metrics.value("gpufarm.profile.steps", f"ir:ir-{world.ir}", "run:run-late") is None


def test_a_writer_slower_than_the_wait_leaves_the_run_stored_and_answered_queued(world: World) -> None:
    queue = WriterQueue(hold=True)
    queued = _queued(world, queue)
    (done,) = queued.up(FIXTURES / "cpu_mlp.json", name="run-slow", record_wait_s=0.2)
    assert done.recorded is None  # type: ignore[attr-defined]
    assert len(queue.sent) == 1 and IncidentCommand.model_validate(queue.sent[0]["command"]).op is Op.PROFILE
    assert any(done.key in key for key in world.stored())  # type: ignore[attr-defined]
