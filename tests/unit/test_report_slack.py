"""`/gpu report [team | project]` (issue 13 point 3): operators see any team, researchers their own (else an
ephemeral refusal, nothing uploaded); the summary is Block Kit, the CSV goes to the asker's DM through
upload_file, and a refused upload still leaves the summary."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat.command_text import Command, Verb, parse_command
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.service import GpuFarm
from gpufarm.reporting.slack import report_answer

pytestmark = pytest.mark.unit

ALICE, BOB, OPS = "U0000000001", "U0000000003", "U0000000OPS"
NLP_GROUP, VISION_GROUP = "S0000000011", "S0000000012"
NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
MEMBERS_YAML = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{usergroup: {NLP_GROUP}}}\n    max_days: 30\n"
).replace("  vision:\n    max_days: 14\n", f"  vision:\n    members: {{usergroup: {VISION_GROUP}}}\n    max_days: 14\n")
MEMBERS_YAML += "rates:\n  currency: USD\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.00}}\n"


class TeamChat(FakeChat):
    def __init__(self) -> None:
        super().__init__(operators=frozenset({OPS}))
        self.groups = {NLP_GROUP: frozenset({ALICE}), VISION_GROUP: frozenset({BOB})}
        self.refuse_uploads = False

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        return self.groups.get(usergroup) or super().usergroup_members(usergroup)

    def upload_file(
        self, channel: str, filename: str, content: bytes, *, title: str, initial_comment: str | None = None
    ) -> str:
        if self.refuse_uploads:
            raise UpstreamError("slack files.getUploadURLExternal failed: ratelimited")
        return super().upload_file(channel, filename, content, title=title, initial_comment=initial_comment)


def _lease(incidents: FakeIncidents, team: str, project: str, hours: float) -> None:
    incidents.create(
        f"GPU request: {team}/{project}",
        {
            f.STATE: "resolved",
            f.PHASE: "reclaimed",
            f.TEAM: team,
            f.PROJECT: project,
            f.ENVIRONMENT: "hpc",
            f.GPU_MODEL: "H100",
            f.GPU_COUNT: "8",
            f.HOST_GPUS: ["node-1=8"],
            f.HOSTS: ["node-1"],
            f.ALLOCATED_AT: isoformat(datetime(2026, 12, 2, tzinfo=UTC)),
            f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 12, 3, tzinfo=UTC)),
            f.GPU_HOURS_HELD: f"{hours:.3f}",
            f.GPU_HOURS_BUSY: f"{hours / 2:.3f}",
            f.GPU_HOURS_IDLE: f"{hours / 2:.3f}",
            f.GPU_HOURS_BY_MONTH: [f"2026-12={hours:.3f}"],
            f.GPU_HOURS_MONTHS: ["2026-12"],
            f.RECLAIM_REASON: "released",
        },
    )


@pytest.fixture
def world() -> tuple[GpuFarm, TeamChat]:
    clock = FakeClock(NOW)
    incidents = FakeIncidents(clock)
    _lease(incidents, "nlp", "llm", 192)
    _lease(incidents, "vision", "seg", 96)
    _lease(incidents, "vision", "llm", 48)
    chat = TeamChat()
    svc = GpuFarm(incidents=incidents, hosts=FakeHosts(), chat=chat, clock=clock, farm=parse_farm(MEMBERS_YAML))
    return svc, chat


def _text(message: object) -> str:
    blocks = getattr(message, "blocks", [])
    return "\n".join(
        b.get("text", {}).get("text", "") if b["type"] == "section" else b["elements"][0]["text"] for b in blocks
    )


def test_the_verb_parses_with_one_optional_word() -> None:
    assert parse_command("report") == Command(Verb.REPORT)
    assert parse_command("report NLP") == Command(Verb.REPORT, team="nlp")
    with pytest.raises(ValidationFailed, match=r"/gpu report \[team \| project\]"):
        parse_command("report nlp vision")


def test_a_researcher_gets_their_teams_summary_and_the_csv_by_dm(world: tuple[GpuFarm, TeamChat]) -> None:
    svc, chat = world
    message = report_answer(svc.context, ALICE, None)
    text = _text(message)
    assert "GPU report: last 30d" in text and "by project (team nlp)" in text
    assert (
        "*llm*: 192.0 GPU-h held (384.00 USD) · 96.0 busy (192.00 USD) · 96.0 idle (192.00 USD) · "
        "0.0 idle-held (0.00 USD) · 0.0 unmeasured (0.00 USD) · util 50% · 1 lease(s)"
    ) in text
    assert "sent to you in a direct message" in text
    [(filename, content)] = chat.files.values()
    assert filename == "gpufarm-report-nlp-2026-12-10.csv"
    [upload] = chat.to("D" + ALICE[1:], "file")
    rows = list(csv.DictReader(io.StringIO(content.decode())))
    assert [(r["project"], r["gpu_hours_held"]) for r in rows] == [("llm", "192.0"), ("total", "192.0")]
    assert "GPU report" in upload.text


def test_a_researcher_is_refused_another_team_and_nothing_is_uploaded(world: tuple[GpuFarm, TeamChat]) -> None:
    svc, chat = world
    with pytest.raises(NotAllowed, match="only members of team vision or GPU operators"):
        report_answer(svc.context, ALICE, "vision")
    # A project that holds another team's GPUs is refused too.
    with pytest.raises(NotAllowed, match="project llm holds GPUs of team vision"):
        report_answer(svc.context, ALICE, "llm")
    assert chat.files == {}


def test_an_operator_sees_any_team_or_the_whole_farm(world: tuple[GpuFarm, TeamChat]) -> None:
    svc, chat = world
    assert "*seg*: 96.0 GPU-h held" in _text(report_answer(svc.context, OPS, "vision"))
    farm = _text(report_answer(svc.context, OPS, None))
    assert "*nlp*: 192.0" in farm and "*vision*: 144.0" in farm and "336.0 GPU-hours held" in farm
    project = _text(report_answer(svc.context, OPS, "llm"))
    assert "(project llm)" in project and "*vision*: 48.0" in project
    assert len(chat.files) == 3


def test_an_unknown_project_is_a_clear_answer(world: tuple[GpuFarm, TeamChat]) -> None:
    svc, chat = world
    with pytest.raises(ValidationFailed, match="unknown project 'ghost'"):
        report_answer(svc.context, OPS, "ghost")
    with pytest.raises(ValidationFailed, match="lowercase"):
        report_answer(svc.context, OPS, "<script>")
    assert chat.files == {}


def test_a_refused_upload_still_answers_with_the_summary(world: tuple[GpuFarm, TeamChat]) -> None:
    svc, chat = world
    chat.refuse_uploads = True
    text = _text(report_answer(svc.context, ALICE, "nlp"))
    assert "*llm*: 192.0" in text and "the CSV could not be attached" in text


def test_the_worker_answers_the_command_with_the_summary(world: tuple[GpuFarm, TeamChat]) -> None:
    from gpufarm.handlers.slack_events import Job
    from gpufarm.handlers.slack_worker import dispatch

    svc, chat = world
    job = Job(kind="command", user=ALICE, command=parse_command("report").to_payload())
    message = dispatch(svc, job)
    assert message is not None and message.text.startswith("GPU report: last 30d")
    assert len(chat.files) == 1
