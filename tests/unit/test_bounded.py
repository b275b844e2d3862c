"""Bounded decoding: JSON refused by size or depth before json.loads recurses, whole numbers in ASCII digits only."""

from __future__ import annotations

import json

import pytest

from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.kernel import bounded
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.ir import parse_ir


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_is_refused_without_recursing(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    deep = opener * 100_000 + "1" + closer * 100_000
    with pytest.raises(bounded.BadJson, match="nested deeper than 32"):
        bounded.loads(deep, max_bytes=10**7)
    ok = opener * 32 + "1" + closer * 32
    assert json.dumps(bounded.loads(ok, max_bytes=10**7)).count(opener[0]) == 32


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 5000 + '\\"{' * 100, "t": ['"]]]"']})
    assert bounded.loads(text, max_bytes=10**6)["t"] == ['"]]]"']


def test_unterminated_strings_cannot_hide_depth() -> None:
    with pytest.raises(bounded.BadJson):
        bounded.loads('"' + "[" * 5000, max_bytes=10**6)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{}" + b" " * 100, "longer than 64 bytes"),
        ("é" * 40, "longer than 64 bytes"),
        (b"\xff{}", "not UTF-8"),
        ("{", "not valid JSON"),
        ("[" + "9" * 5000 + "]", "longer than"),
    ],
)
def test_size_encoding_and_syntax_are_bad_json(data: str | bytes, reason: str) -> None:
    with pytest.raises(bounded.BadJson, match=reason):
        bounded.loads(data, max_bytes=64)


def test_a_huge_integer_literal_is_bad_json_not_a_crash() -> None:
    with pytest.raises(bounded.BadJson, match="not valid JSON"):
        bounded.loads("[" + "9" * 5000 + "]", max_bytes=10**6)


@pytest.mark.parametrize(
    "text", ["²", "⁵", "\u0661\u0662", "\uff18", "1²", "", " ", "+", "-", "1.0", "1e3", "0x10", "1_000"]
)
def test_only_ascii_digits_are_numbers(text: str) -> None:
    with pytest.raises(ValidationFailed, match="whole number"):
        bounded.whole_number(text, "days", "days")


def test_long_digit_strings_are_refused_by_length() -> None:
    with pytest.raises(ValidationFailed, match="more than 9 digits"):
        bounded.whole_number("9" * 5000, "gpu_count", "the GPU count")


def test_signs_and_ranges() -> None:
    assert bounded.whole_number(" +7 ", "n", "n", maximum=7) == 7
    with pytest.raises(ValidationFailed, match="at least 1"):
        bounded.whole_number("-3", "n", "n")
    with pytest.raises(ValidationFailed, match="at most 7"):
        bounded.whole_number("8", "n", "n", maximum=7)


@pytest.mark.parametrize(
    "text", ["extend IR-1 ²", "extend IR-1 ⁵", "extend IR-\u0661 2", "status IR-²", "extend 1 " + "9" * 5000]
)
def test_commands_refuse_unicode_and_endless_digits(text: str) -> None:
    with pytest.raises(ValidationFailed):
        parse_command(text)


def test_a_unicode_digit_is_a_model_not_a_count() -> None:
    assert parse_command("request ² project=x").args == {"gpu_model": "²", "project": "x"}
    with pytest.raises(ValidationFailed):
        parse_ir("IR-" + "1" * 10)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8", 8), ("0", 0), ("123456789", 123456789), ("²", None), ("٣", None), ("", None), ("-1", None), (" 8", None)],
)
def test_digits_read_back_are_ascii_and_bounded(text: str, expected: int | None) -> None:
    assert bounded.ascii_digits(text) == expected
    assert bounded.ascii_digits("9" * 10) is None
    assert bounded.ascii_digits("9" * 18, max_digits=18) == int("9" * 18)


def test_a_host_tag_or_field_with_unicode_or_endless_digits_is_skipped_not_a_crash() -> None:
    from gpufarm.core.kernel.hosts import GpuHost
    from gpufarm.core.kernel.model import decode_host_gpus
    from gpufarm.core.kernel.tags import ir_numbers

    tags = ["gpufarm:managed", "gpu_model:h100", "environment:hpc"]
    assert GpuHost.from_tags("a", [*tags, "gpu_count:²"]) is None
    assert GpuHost.from_tags("a", [*tags, "gpu_count:" + "9" * 5000]) is None
    host = GpuHost.from_tags("a", [*tags, "gpu_count:8"])
    assert host is not None and host.gpu_count == 8
    assert decode_host_gpus(["h1=²", "h2=4", "h3=" + "1" * 5000]) == {"h2": 4}
    assert ir_numbers(["ir-²", "ir-12", "ir-" + "1" * 5000]) == [12]
