"""`gpufarm doctor` against the local environment with `gpufarm datadog apply` done: every line confirmed (or
skipped); under every Datadog quirk the sandbox can play, the lines that fell back name the behaviour and nothing is
broken; a wrong key or site is one line that writes nothing; a failure or an interrupt mid-run leaves no scratch
object behind."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpufarm.cli import cli
from gpufarm.setup.doctor import roundtrip, tags
from gpufarm_sandbox.localhost import LocalEnv, start_local

pytestmark = pytest.mark.integration

HOST = "hpc-a-01"
# Short bounds: the sandbox delivers a webhook in well under a second.
WAIT = "5"
CHECKS = {
    "datadog keys",
    "incident type",
    "webhook round trip",
    "host tags",
    "monitors",
    "slack scopes",
    "operators' channel",
    "url slack ingress",
    "url incident webhook",
    "url idle webhook",
    "url profile pages",
    "url profile upload",
}


def _seed_host(env: LocalEnv) -> None:
    body = {"hosts": [{"name": HOST, "tags": ["gpufarm:managed", "environment:onprem-hpc", "gpu_model:h100"]}]}
    request = urllib.request.Request(
        f"{env.url}/_sandbox/hosts", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEnv]:
    """The local environment with apply done and one host to tag."""
    with start_local(port=0, setup=True) as env:
        _seed_host(env)
        yield env


def doctor(*args: str, env: Mapping[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["doctor", "--webhook-wait", WAIT, *args], env=dict(env or {}))


def lines_of(result: Result) -> list[dict[str, str]]:
    lines: list[dict[str, str]] = json.loads(result.output)
    return lines


def leftovers(env: LocalEnv) -> dict[str, Any]:
    """What doctor may have left: probe incidents and doctor tags on any host."""
    state = env.sandbox.incidents.dump()
    probes = [i["id"] for i in state["incidents"] if str(i["fields"].get("request_id") or "").startswith("doctor-")]
    hosts = env.sandbox.hosts.dump()["hosts"].values()
    doctor_tags = [
        t for h in hosts for by in h["tags_by_source"].values() for t in by if t.startswith(f"{tags.TAG_KEY}:")
    ]
    return {"probes": probes, "tags": doctor_tags, "incidents": len(state["incidents"])}


def test_on_the_local_environment_every_check_is_confirmed(local: LocalEnv) -> None:
    result = doctor("--json", "--host", HOST)
    lines = lines_of(result)
    assert {line["check"] for line in lines} >= CHECKS
    assert any(line["check"].startswith("search ") for line in lines)
    assert {line["status"] for line in lines} <= {"confirmed", "skipped"}, result.output
    # Only the profiler runs' functions are skipped: the local environment runs without their S3.
    assert [line["check"] for line in lines if line["status"] == "skipped"] == [
        "url profile pages",
        "url profile upload",
    ]
    assert result.exit_code == 0
    assert leftovers(local)["probes"] == [] and leftovers(local)["tags"] == []


def test_the_table_is_one_aligned_row_per_check_and_a_count(local: LocalEnv) -> None:
    result = doctor("--host", HOST)
    rows = result.output.strip().splitlines()
    assert result.exit_code == 0
    assert rows[-1].endswith("2 skipped") and "confirmed" in rows[-1]
    checked = [row for row in rows[:-1] if "  confirmed  " in row or "  skipped  " in row]
    assert len({row.index("  confirmed  ") for row in checked if "  confirmed  " in row}) == 1


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DD_API_KEY": "not-the-key"}, "bad API key"),
        ({"DD_APP_KEY": "not-the-key"}, "bad application key"),
        ({"GPUFARM_DATADOG_HOST": "http://127.0.0.1:9", "GPUFARM_MAX_RETRIES": "0"}, "cannot reach site"),
    ],
)
def test_a_wrong_key_or_site_is_one_line_and_writes_nothing(local: LocalEnv, env: dict[str, str], says: str) -> None:
    before = leftovers(local)
    result = doctor("--host", HOST, env=env)
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("datadog keys") and "broken" in line and says in line
    assert "not-the-key" not in result.output
    assert leftovers(local) == before


def _raise(exc: BaseException) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


def test_a_failure_mid_run_leaves_nothing_behind(local: LocalEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each fails after its scratch object is made: the probe once created, the tag once written.
    monkeypatch.setattr(roundtrip, "_probe", _raise(RuntimeError("injected after the probe was made")))
    monkeypatch.setattr(tags, "_await_listed", _raise(RuntimeError("injected after the tag was written")))
    result = doctor("--json", "--host", HOST)
    lines = {line["check"]: line for line in lines_of(result)}
    assert result.exit_code == 1
    assert lines["webhook round trip"]["status"] == "broken" and "injected" in lines["webhook round trip"]["detail"]
    assert lines["host tags"]["status"] == "broken" and "injected" in lines["host tags"]["detail"]
    # The checks after them still ran, and nothing is left behind.
    assert lines["monitors"]["status"] == "confirmed"
    assert leftovers(local)["probes"] == [] and leftovers(local)["tags"] == []


@pytest.mark.parametrize(("module", "step"), [(roundtrip, "_await"), (tags, "_await_listed")])
def test_an_interrupt_mid_run_leaves_nothing_behind(
    local: LocalEnv, monkeypatch: pytest.MonkeyPatch, module: Any, step: str
) -> None:
    monkeypatch.setattr(module, step, _raise(KeyboardInterrupt()))
    result = doctor("--host", HOST)
    assert result.exit_code == 130
    assert leftovers(local)["probes"] == [] and leftovers(local)["tags"] == []


def test_under_every_quirk_the_lines_that_fell_back_name_the_behaviour() -> None:
    with start_local(port=0, setup=True, quirks="all") as env:
        _seed_host(env)
        result = doctor("--json", "--host", HOST)
        lines = lines_of(result)
        left = leftovers(env)
    fell_back = {line["check"]: line["detail"] for line in lines if line["status"] == "fell back"}
    assert [line for line in lines if line["status"] == "broken"] == [], result.output
    assert result.exit_code == 3
    round_trip = fell_back["webhook round trip"]
    assert "state change" in round_trip and "payload" in round_trip and "string" in round_trip
    assert any(check.startswith("search ") for check in fell_back)
    assert "'User'" in fell_back["host tags"]
    assert left["probes"] == [] and left["tags"] == []
