"""Webhook payload templating and redaction (pure functions of the sandbox's webhooks module)."""

from __future__ import annotations

import json

import pytest

from gpufarm_sandbox.emulator.webhook_delivery import DEFAULT_PAYLOAD, REDACTED, redact, render_template


def test_values_inside_strings_are_json_escaped() -> None:
    out = render_template('{"title": "$TITLE"}', {"TITLE": 'say "hi"\\ now\nplease'})
    assert json.loads(out) == {"title": 'say "hi"\\ now\nplease'}


def test_values_outside_strings_are_inserted_raw() -> None:
    fields = json.dumps({"state": "active", "hosts": ["gpu-node-01"]})
    out = render_template('{"fields": $INCIDENT_FIELDS, "n": $COUNT}', {"INCIDENT_FIELDS": fields, "COUNT": "3"})
    assert json.loads(out) == {"fields": {"state": "active", "hosts": ["gpu-node-01"]}, "n": 3}


def test_longest_names_win() -> None:
    variables = {"ID": "short", "INCIDENT_ID": "long", "INCIDENT": "mid"}
    assert render_template("$INCIDENT_ID/$INCIDENT/$ID", variables) == "long/mid/short"


def test_unknown_variables_and_escaped_quotes_are_left_alone() -> None:
    # An escaped quote does not end the string; the raw insertion outside it is the template author's choice.
    template = '{"a": "\\"$X\\" and $UNKNOWN", "b": $X}'
    out = render_template(template, {"X": 'q"'})
    assert out == '{"a": "\\"q\\"\\" and $UNKNOWN", "b": q"}'


def test_the_default_payload_renders_to_json() -> None:
    variables = {
        "EVENT_MSG": "line 1\nline 2",
        "LAST_UPDATED": "1700000000000",
        "EVENT_TYPE": "incident_created",
        "EVENT_TITLE": 'IR-1: "GPU" request',
        "DATE": "1700000000000",
        "ORG_ID": "1",
        "ORG_NAME": "gpufarm sandbox",
        "ID": "7",
    }
    out = json.loads(render_template(DEFAULT_PAYLOAD, variables))
    assert out["body"] == "line 1\nline 2"
    assert out["title"] == 'IR-1: "GPU" request'
    assert out["org"] == {"id": "1", "name": "gpufarm sandbox"}


@pytest.mark.parametrize("template", ["", "no variables here", "$"])
def test_templates_without_matches_are_unchanged(template: str) -> None:
    assert render_template(template, {"X": "y"}) == template
    assert render_template(template, {}) == template


def test_redact_hides_every_secret_longest_first() -> None:
    text = "token=abcdef; again abcdef; prefix abc"
    assert redact(text, ("abc", "abcdef")) == f"token={REDACTED}; again {REDACTED}; prefix {REDACTED}"
    assert redact(text, ("",)) == text
