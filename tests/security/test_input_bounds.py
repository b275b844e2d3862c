"""Every input bounded (docs/security.md, "Threat model", "Every input bounded").

A farm file's numbers, a profiler trace's shape and a slash command's length each have a bound, and input past
it gets the same clear refusal as any other bad input: exit 2 from the command line, an ephemeral answer in Slack,
and nothing changed. The traces here are small on disk and hit one bound each; benchmarks/profile.py measures
the full-size hostile traces (refused in at most 5 s).
"""

from __future__ import annotations

import gzip
import os
import sys
import time
import types
import typing
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from gpufarm.cli import cli
from gpufarm.core.chat.command_text import MAX_TEXT
from gpufarm.core.config.farm import MAX_NUMBER_CHARS, FarmConfig, FarmConfigError, parse_farm
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.handlers import runtime
from gpufarm.profiling import reader
from gpufarm.profiling.analysis import analyse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "functions" / "slack_ingress"))
import slack_ingress  # noqa: E402 - the Lambda entry point, imported as Lambda does
from test_ingress_events import TEST_SIGNING_SECRET, TEST_TIMESTAMP, command_body, slack_event  # noqa: E402

FARM = "gpu_models: {H100: {}}\nenvironments: {hpc: {gpu_models: [H100]}}\n"
HUGE = "9" * 5000
HUGE_FARM = FARM + f"teams: {{nlp: {{quotas: {{hpc: {{H100: {{gpus: {HUGE}}}}}}}}}}}\n"
SAYS = "line 3, column 43: a number of 5,000 characters is too long"

# -- farm YAML numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["report"],
        ["datadog", "apply", "--dry-run"],
        ["doctor"],
        ["slack", "check"],
    ],
)
def test_a_huge_integer_in_the_farm_file_is_exit_2_in_each_command(command: list[str], tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(HUGE_FARM)
    # Keys and a Datadog host that answers nothing: the farm file is refused before any of them is used.
    env = {"DD_API_KEY": "k" * 32, "DD_APP_KEY": "a" * 40, "GPUFARM_DATADOG_HOST": "http://127.0.0.1:9"}
    try:
        result = CliRunner().invoke(cli, [*command, "--farm-config", str(farm)], env=env)
    finally:
        runtime.reset()
    assert result.exit_code == 2, result.output
    assert "farm configuration is invalid" in result.output and SAYS in result.output
    assert "Traceback" not in result.output and HUGE[:40] not in result.output


def test_a_huge_integer_is_refused_before_int_reads_it() -> None:
    # Python's int() takes 4,300 digits at most; the loader refuses a number long before, with where it is.
    for number in (HUGE, "9" * (MAX_NUMBER_CHARS + 1), "0x" + "f" * 40, "1" * 40 + ".5"):
        with pytest.raises(FarmConfigError) as refused:
            parse_farm(FARM + f"profiles: {{retention_days: {number}}}\n")
        assert "line 3" in str(refused.value) and "is too long" in str(refused.value)
    # A long number as a quoted string is the model's to refuse (pydantic parses it bounded).
    with pytest.raises(FarmConfigError, match=r"profiles\.retention_days"):
        parse_farm(FARM + f"profiles: {{retention_days: '{HUGE}'}}\n")
    assert parse_farm(FARM + "profiles: {retention_days: 400}\n").profiles.retention_days == 400


def _numeric_fields(model: type[BaseModel], path: str, seen: set[type]) -> Iterator[tuple[str, list[Any]]]:
    """(path, constraints) of every int or float field reachable from `model`, through containers and optionals:
    the field's own constraints and those an element type carries (`tuple[Annotated[int, Field(ge=1)], ...]`)."""
    if model in seen:
        return
    seen.add(model)
    for name, info in model.model_fields.items():
        for kind, inner in _leaf_types(info.annotation, []):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _numeric_fields(kind, f"{path}.{name}", seen)
            elif kind in (int, float):
                yield f"{path}.{name}", [*info.metadata, *inner]


def _leaf_types(annotation: Any, carried: list[Any]) -> Iterator[tuple[Any, list[Any]]]:
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        constraints = [m for item in extra for m in getattr(item, "metadata", [item])]
        yield from _leaf_types(base, [*carried, *constraints])
        return
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, dict, tuple, list) and args:
        for arg in args:
            yield from _leaf_types(arg, carried)
        return
    yield annotation, carried


# An idle kind's window is one of Datadog's monitor windows (a validator checks membership, not a range).
CHECKED_BY_MEMBERSHIP = {"window_minutes"}


def test_every_numeric_farm_key_has_a_range() -> None:
    unbounded = []
    fields = list(_numeric_fields(FarmConfig, "farm", set()))
    assert len(fields) > 30  # the walk reaches every section
    for path, constraints in fields:
        if path.rsplit(".", 1)[-1] in CHECKED_BY_MEMBERSHIP:
            continue
        bounds = {type(m).__name__ for m in constraints}
        if not ({"Ge", "Gt"} & bounds and {"Le", "Lt"} & bounds):
            unbounded.append(path)
    assert unbounded == []


# -- profiler traces --------------------------------------------------------------------------------------------


def _trace(tmp_path: Path, text: bytes, *, zipped: bool = False) -> Path:
    path = tmp_path / ("trace.json.gz" if zipped else "trace.json")
    path.write_bytes(gzip.compress(text) if zipped else text)
    return path


def _refusal(path: Path) -> tuple[str, float]:
    started = time.perf_counter()
    with pytest.raises(ValidationFailed) as refused:
        analyse(reader.events(path))
    return refused.value.message, time.perf_counter() - started


def test_a_trace_nested_200000_deep_is_refused_at_once(tmp_path: Path) -> None:
    path = _trace(tmp_path, b'{"traceEvents": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}")
    message, seconds = _refusal(path)
    assert f"nested deeper than {reader.MAX_DEPTH} levels" in message and seconds < 5
    # Brackets inside strings are text, not nesting.
    text = b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "' + b"[" * 1000 + b'"}]}'
    assert analyse(reader.events(_trace(tmp_path, text))).events == 1


@pytest.mark.parametrize("piece", [b"a", b'\\"', b"\\\\"])
def test_one_huge_string_in_a_small_gzip_is_refused_at_once(tmp_path: Path, piece: bytes) -> None:
    # Plain text, or escapes only (escaped quotes once made the scan quadratic in a string past its piece).
    text = b'{"traceEvents": [{"name": "' + piece * (3 * reader.MAX_STRING_BYTES // len(piece)) + b'"}]}'
    path = _trace(tmp_path, text, zipped=True)
    assert path.stat().st_size < 20_000
    message, seconds = _refusal(path)
    assert f"a string longer than {reader.MAX_STRING_BYTES:,} bytes" in message and seconds < 5
    assert "aaaa" not in message  # the content is never repeated


def test_a_string_with_escapes_across_pieces_is_one_string(tmp_path: Path) -> None:
    # Escaped quotes and backslashes at every offset: the scan must end the string where JSON does.
    name = '\\"x\\\\' * 100_000  # escaped quotes and backslashes; five strings of 400 kB run across pieces
    event = f'{{"ph": "X", "ts": 1, "dur": 2, "cat": "cpu_op", "name": "{name[:400_000]}"}}'
    text = ('{"traceEvents": [' + ", ".join([event] * 5) + "]}").encode()
    assert analyse(reader.events(_trace(tmp_path, text))).events == 5


def test_too_many_events_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_EVENTS", 1000)
    path = _trace(tmp_path, b'{"traceEvents": [' + b"{}, " * 1000 + b"{}]}", zipped=True)
    message, _ = _refusal(path)
    assert "more than 1,000 events" in message
    assert analyse(reader.events(_trace(tmp_path, b'{"traceEvents": [' + b"{}, " * 999 + b"{}]}"))).events == 1000


def test_too_many_values_beside_the_events_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser skips what is not under traceEvents without building it, but still reads it: bounded too.
    monkeypatch.setattr(reader, "MAX_VALUES", 10_000)
    path = _trace(tmp_path, b'{"other": [' + b"0," * 20_000 + b'0], "traceEvents": [{}]}', zipped=True)
    message, _ = _refusal(path)
    assert "more than 10,000 values" in message


def test_one_huge_event_is_refused(tmp_path: Path) -> None:
    count = reader.MAX_EVENT_BYTES // 2 + reader.MAX_STRING_BYTES  # "0," each: one event past its bound
    path = _trace(tmp_path, b'{"traceEvents": [{"args": [' + b"0," * count + b"0]}]}", zipped=True)
    message, seconds = _refusal(path)
    assert f"an event longer than {reader.MAX_EVENT_BYTES:,} bytes" in message and seconds < 5
    # Many ordinary events add up to far more than one event's bound.
    events = b", ".join([b'{"ph": "X", "ts": 1, "dur": 2, "args": {"a": [1, 2, 3]}}'] * 150_000)
    assert analyse(reader.events(_trace(tmp_path, b'{"traceEvents": [' + events + b"]}"))).events == 150_000


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    return _trace(tmp_path, b'{"traceEvents": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}")


def test_gpufarm_profile_upload_refuses_a_hostile_trace_with_exit_2(
    hostile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent to the upload function, refused while it reads (400: exit 2), nothing stored, the upload deleted.
    from upload_service import upload_service

    with upload_service(monkeypatch) as service:
        ir = service.lease()
        monkeypatch.setenv("GPUFARM_API_URL", service.url)
        args = ["profile", "upload", str(hostile), "--ir", f"IR-{ir}", "--token", service.token(ir)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "nested deeper than" in result.output and "nothing was stored" in result.output
        assert service.runs(ir) == [] and service.objects() == []


# -- the Slack ingress ------------------------------------------------------------------------------------------


class _Invoker:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def invoke(self, function: str, payload: dict[str, Any]) -> None:
        self.calls.append((function, payload))


class _Clock:
    def epoch(self) -> float:
        return float(TEST_TIMESTAMP)

    def now(self) -> datetime:
        return datetime.fromtimestamp(TEST_TIMESTAMP, UTC)


@pytest.fixture
def ingress(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Invoker]:
    for name in list(os.environ):
        if name.startswith(("GPUFARM_", "DD_", "SLACK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUFARM_SLACK_SIGNING_SECRET", TEST_SIGNING_SECRET)
    monkeypatch.setenv("GPUFARM_SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("GPUFARM_WORKER_FUNCTION", "SlackWorkerFunction")
    monkeypatch.setenv("GPUFARM_FARM_CONFIG", str(ROOT / "config" / "farm.example.yaml"))
    invoker = _Invoker()
    runtime.reset()
    runtime.override(invoker=invoker, clock=_Clock())
    yield invoker
    runtime.reset()


@pytest.mark.parametrize("length", [MAX_TEXT + 1, 4_001, 20_000, 100_000])
def test_a_slash_command_past_its_bound_is_the_same_ephemeral_answer(ingress: _Invoker, length: int) -> None:
    answer = slack_ingress.handler(slack_event(command_body("status " + "x" * (length - 7))), None)
    assert answer["statusCode"] == 200, answer["body"]
    body = answer["body"]
    assert '"response_type":"ephemeral"' in body and f"the command is longer than {MAX_TEXT} characters" in body
    assert len(body) < 500  # the answer never repeats the text
    assert ingress.calls == []


def test_a_slash_command_body_past_the_ingress_bound_is_refused_unread(ingress: _Invoker) -> None:
    # Past the ingress's body bound (128 kB; Slack sends far less) nothing is decoded or verified: 413.
    answer = slack_ingress.handler(slack_event(command_body("status " + "x" * 200_000)), None)
    assert answer["statusCode"] == 413
    assert ingress.calls == []


def test_a_function_reading_a_farm_file_with_a_huge_integer_answers_a_configuration_error(
    ingress: _Invoker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(HUGE_FARM)
    monkeypatch.setenv("GPUFARM_FARM_CONFIG", str(farm))
    answer = slack_ingress.handler(slack_event(command_body("request 2 H100 project=llm team=nlp env=hpc")), None)
    assert answer["statusCode"] == 200
    assert "the farm configuration is invalid" in answer["body"] and HUGE[:40] not in answer["body"]
    assert ingress.calls == []
