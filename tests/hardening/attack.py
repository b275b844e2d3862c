"""Forged, fuzzed and secret-hunting traffic against gpufarm's Function URLs on the local host.

Shared by tests/hardening (CI counts) and benchmarks/hardening.py (counts x 10). Requests go through the local
host's Function URL route (`/fn/<dir>/`: the payload format 2.0 event, the handler, the URL response) in-process
with werkzeug's test client, the same code path as over loopback HTTP without the socket; what the handlers
hand on (async invokes, queue messages, Datadog and Slack calls) travels over loopback to the host and the
sandbox as it does in `gpufarm local`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from gpufarm.core.kernel.search import IncidentQuery
from gpufarm_sandbox.demo.lifecycle_stage import INGRESS_PATH, LocalFarm
from gpufarm_sandbox.example_farm import ALICE, RESEARCH_CHANNEL
from gpufarm_sandbox.localhost import LocalEnv
from gpufarm_sandbox.localhost.env import LOCAL_WEBHOOK_SECRET

INCIDENT_PATH = "/fn/incident_webhook/"
IDLE_PATH = "/fn/idle_alert/"
URL_PATHS = (INGRESS_PATH, INCIDENT_PATH, IDLE_PATH)
TOKEN_HEADER = "X-Gpufarm-Token"
FORM = "application/x-www-form-urlencoded"


def ready_farm(local: LocalEnv) -> LocalFarm:
    """A reset sandbox with the workspace, the hosts and `gpufarm datadog apply` done, as `gpufarm local` has."""
    return LocalFarm.ready(local)


@dataclass
class Answer:
    """One Function URL answer."""

    status: int
    body: str
    headers: dict[str, str]


@dataclass
class Tally:
    """What a run saw: answers by status, 5xx and traceback bodies, secrets found, and the worst examples."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0
    tracebacks: int = 0
    secrets_found: int = 0
    accepted: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, what: str, answer: Answer, secrets: Iterable[str]) -> None:
        """Count one answer; keep a few bad ones to show."""
        self.sent += 1
        self.statuses[answer.status] += 1
        bad = []
        if answer.status >= 500:
            self.server_errors += 1
            bad.append("5xx")
        if "Traceback" in answer.body:
            self.tracebacks += 1
            bad.append("traceback")
        if any(s in answer.body or any(s in v for v in answer.headers.values()) for s in secrets):
            self.secrets_found += 1
            bad.append("secret")
        if bad and len(self.examples) < 5:
            self.examples.append(f"{','.join(bad)} {answer.status} for {what[:200]!r}: {answer.body[:200]!r}")


class Target:
    """The local host's Function URLs, called in-process, plus what the run has changed so far."""

    def __init__(self, local: LocalEnv, farm: LocalFarm) -> None:
        self.local = local
        self.farm = farm
        self.client = Client(local.sandbox)
        self.signing_secret = local.sandbox.slack_signing_secret
        self.webhook_secret = local.env.get("GPUFARM_WEBHOOK_SECRET", LOCAL_WEBHOOK_SECRET)
        self.secrets = secret_values(local)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """POST to a Function URL; the answer as the URL gives it."""
        response = self.client.post(path, data=body, headers=headers)
        text = response.get_data(as_text=False).decode("utf-8", "replace")
        return Answer(response.status_code, text, dict(response.headers.items()))

    def invoke_url_event(self, event: dict[str, Any]) -> Answer:
        """Hand the ingress a Function URL event the URL itself would never build (e.g. broken base64)."""
        result = self.local.host.invoke("SlackIngressFunction", event)
        return Answer(int(result["statusCode"]), str(result.get("body") or ""), dict(result.get("headers") or {}))

    def now(self) -> int:
        """The sandbox clock (the ingress's signature check reads it), in whole seconds."""
        return int(self.local.sandbox.clock.now())

    def signed_headers(self, body: bytes, *, timestamp: int | None = None, secret: str | None = None) -> dict[str, str]:
        """Headers Slack would send with `body`."""
        ts = str(self.now() if timestamp is None else timestamp)
        return {
            "Content-Type": FORM,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": signature(secret or self.signing_secret, ts, body),
        }

    def effects(self) -> dict[str, int]:
        """Incidents, Slack messages, modals and invocations the handlers caused (async, queue, schedule) so far."""
        self.local.host.drain(timeout=30)
        state = self.local.host.state()
        return {
            "incidents": len(self.farm.incidents()),
            "messages": len(self.farm.messages()),
            "views": len(self.farm.views()),
            "invocations": sum(1 for i in state["invocations"] if i["trigger"] not in ("url", "direct")),
        }

    def failures(self) -> dict[str, int]:
        """Invocations that raised (a traceback in the host's log) and work dead-lettered, after draining."""
        self.local.host.drain(timeout=60)
        state = self.local.host.state()
        return {
            "errors": sum(1 for i in state["invocations"] if i["status"] != "ok"),
            "dead_letters": len(state["dead_letters"]),
        }

    def half_written(self) -> list[str]:
        """Incidents missing what every allocation carries (phase, requester, team, pool, GPUs, request id)."""
        return [
            a.ir_label
            for a in self.farm.incidents()
            if not (a.requester and a.team and a.environment and a.gpu_count > 0 and a.request_id)
        ]

    def secrets_at_rest(self) -> list[str]:
        """Secret values found in any Slack message or incident field of the run (where each was found)."""
        found = []
        for message in self.farm.messages():
            text = json.dumps(message)
            found += [f"message {message.get('ts')}" for s in self.secrets if s in text]
        for record in self.farm.gateway.search(IncidentQuery()):
            text = json.dumps({"title": record.title, "fields": record.fields}, default=str)
            found += [f"incident IR-{record.public_id}" for s in self.secrets if s in text]
        return found


def secret_values(local: LocalEnv) -> list[str]:
    """Every secret of the run: the signing secret, bot token, Datadog keys and webhook secret."""
    names = ("SECRET", "TOKEN", "API_KEY", "APP_KEY")
    values = {v for k, v in local.env.items() if any(n in k.upper() for n in names) and len(v) >= 8}
    values |= {local.sandbox.slack_signing_secret, LOCAL_WEBHOOK_SECRET}
    return sorted(values)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature of a body."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


# -- forged requests ------------------------------------------------------------------------------------------------


def _genuine_bodies() -> list[bytes]:
    form = {
        "command": "/gpu",
        "user_id": ALICE.id,
        "channel_id": RESEARCH_CHANNEL,
        "response_url": "https://hooks.slack.com/commands/T0/1/x",
        "team_id": "T0000000001",
    }
    payload = {
        "type": "block_actions",
        "user": {"id": ALICE.id},
        "actions": [{"action_id": "gpu_release", "value": "IR-1"}],
        "response_url": "https://hooks.slack.com/actions/T0/1/x",
    }
    return [
        urlencode(
            {**form, "text": "request 8 H100 project=llm-ko team=nlp env=onprem-hpc", "trigger_id": "t1"}
        ).encode(),
        urlencode({**form, "text": "request", "trigger_id": "t2"}).encode(),
        urlencode({**form, "text": "release IR-1", "trigger_id": "t3"}).encode(),
        urlencode({"payload": json.dumps(payload)}).encode(),
    ]


FORGERIES = (
    "wrong-secret",
    "altered-body",
    "stale",
    "future",
    "no-signature",
    "no-timestamp",
    "no-headers",
    "v1-scheme",
    "bare-hex",
    "short-hex",
    "base64-signature",
    "garbled-timestamp",
    "unicode-timestamp",
    "huge-timestamp",
    "other-body-signature",
    "base64-body-altered",
    "broken-base64-event",
)


def forged_request(target: Target, rng: random.Random, kind: str) -> tuple[str, Answer]:
    """One forged delivery of a genuine-looking body; what was forged and the answer."""
    body = rng.choice(_genuine_bodies())
    now = target.now()
    headers = target.signed_headers(body)
    if kind == "wrong-secret":
        other = "".join(rng.choice("abcdef0123456789") for _ in range(32))
        headers = target.signed_headers(body, secret=other)
    elif kind == "altered-body":
        i = rng.randrange(len(body))
        body = body[:i] + bytes([(body[i] + rng.randrange(1, 255)) % 256]) + body[i + 1 :]
    elif kind in ("stale", "future"):
        skew = rng.randrange(301, 10**6)
        headers = target.signed_headers(body, timestamp=now - skew if kind == "stale" else now + skew)
    elif kind == "no-signature":
        headers.pop("X-Slack-Signature")
    elif kind == "no-timestamp":
        headers.pop("X-Slack-Request-Timestamp")
    elif kind == "no-headers":
        headers = {"Content-Type": FORM}
    elif kind == "v1-scheme":
        headers["X-Slack-Signature"] = "v1=" + headers["X-Slack-Signature"][3:]
    elif kind == "bare-hex":
        headers["X-Slack-Signature"] = headers["X-Slack-Signature"][3:]
    elif kind == "short-hex":
        headers["X-Slack-Signature"] = headers["X-Slack-Signature"][: rng.randrange(3, 60)]
    elif kind == "base64-signature":
        digest = bytes.fromhex(headers["X-Slack-Signature"][3:])
        headers["X-Slack-Signature"] = "v0=" + base64.b64encode(digest).decode()
    elif kind == "garbled-timestamp":
        headers["X-Slack-Request-Timestamp"] = rng.choice(["", "abc", "1e9", f"{now}.5", f" {now}x", "-1"])
    elif kind == "unicode-timestamp":
        headers["X-Slack-Request-Timestamp"] = str(now).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    elif kind == "huge-timestamp":
        headers["X-Slack-Request-Timestamp"] = "9" * rng.randrange(20, 5000)
    elif kind == "other-body-signature":
        headers = target.signed_headers(rng.choice(_genuine_bodies()) + b"&x=1")
    elif kind == "base64-body-altered":
        # A binary content type makes the URL deliver the body base64-encoded; the signature is of another body.
        headers["Content-Type"] = "application/octet-stream"
        body += b" "
    elif kind == "broken-base64-event":
        event = {
            "version": "2.0",
            "requestContext": {"http": {"method": "POST", "path": "/"}},
            "headers": {k.lower(): v for k, v in headers.items()},
            "body": base64.b64encode(body).decode()[:-3] + rng.choice(["*", "!!", "="]),
            "isBase64Encoded": True,
        }
        return kind, target.invoke_url_event(event)
    else:
        raise ValueError(kind)
    return kind, target.post(INGRESS_PATH, body, headers)


def run_forgeries(target: Target, count: int, seed: int = 8) -> dict[str, Any]:
    """`count` forged requests, every kind in turn; figures: accepted, side effects, statuses."""
    rng = random.Random(seed)
    before = target.effects()
    tally = Tally()
    started = time.perf_counter()
    for n in range(count):
        kind, answer = forged_request(target, rng, FORGERIES[n % len(FORGERIES)])
        tally.note(kind, answer, target.secrets)
        if answer.status < 400:
            tally.accepted += 1
            if len(tally.examples) < 5:
                tally.examples.append(f"accepted {kind}: {answer.status} {answer.body[:120]!r}")
    after = target.effects()
    return {
        "forged": tally.sent,
        "accepted": tally.accepted,
        "side_effects": {k: after[k] - before[k] for k in before},
        "statuses": dict(sorted(tally.statuses.items())),
        "server_errors": tally.server_errors,
        "secrets_in_answers": tally.secrets_found,
        "examples": tally.examples,
        "seconds": round(time.perf_counter() - started, 1),
    }


# -- fuzzing --------------------------------------------------------------------------------------------------------

_DIGITS = st.sampled_from(["0", "1", "8", "-3", "²", "⁵", "١٢", "\uff18", "9" * 20, "9" * 5000, "1e3", "0x1", " 7 "])
_WORDS = st.one_of(
    _DIGITS,
    st.sampled_from(["IR-1", "IR-²", "ir:ir-3", "#4", "H100", "A100", "nlp", "onprem-hpc", '"', "“", "=", "x=y"]),
    st.text(max_size=30),
)
_VERBS = st.sampled_from(
    ["request", "status", "list", "release", "extend", "quota", "approve", "reject", "reclaim", "help", "bogus", ""]
)
_KEYS = st.sampled_from(["count", "model", "project", "team", "env", "days", "purpose", "n", "colour", ""])
_COMMAND_TEXT = st.one_of(
    st.builds(lambda v, ws: " ".join([v, *ws]), _VERBS, st.lists(_WORDS, max_size=6)),
    st.builds(
        lambda ws, kvs: " ".join(["request", *ws, *(f"{k}={v}" for k, v in kvs)]),
        st.lists(_DIGITS | st.sampled_from(["H100", "A100"]), max_size=2),
        st.lists(st.tuples(_KEYS, _WORDS), max_size=6),
    ),
    st.text(max_size=200),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def _deep(depth: int, opener: str) -> str:
    if opener == "[":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


_DEEP = st.builds(_deep, st.sampled_from([40, 999, 1001, 3000, 20_000]), st.sampled_from(["[", "{"]))
_USER = st.one_of(st.just(ALICE.id), st.sampled_from(["U0", "bob", "", "W" + "A" * 30]), st.text(max_size=12))


def _slash_form(text: str, user: str, command: str, extra: dict[str, str]) -> bytes:
    form = {
        "command": command,
        "text": text,
        "user_id": user,
        "channel_id": RESEARCH_CHANNEL,
        "response_url": "https://hooks.slack.com/commands/T0/1/x",
        "trigger_id": "fuzz",
        **extra,
    }
    return urlencode(form).encode()


def _interaction(kind: str, user: str, value: Any, deep: str | None) -> bytes:
    payload: dict[str, Any] = {"type": kind, "user": {"id": user}}
    if kind == "block_actions":
        payload["actions"] = [{"action_id": "gpu_release", "value": value if isinstance(value, str) else "IR-1"}]
    else:
        state = {"gpu_count": {"gpu_count": {"value": value}}, "duration_days": {"duration_days": {"value": value}}}
        payload["view"] = {"id": "VFUZZ", "callback_id": "gpu_request", "state": {"values": state}}
    text = json.dumps(payload)
    if deep is not None:
        text = text[:-1] + ',"extra":' + deep + "}"
    return urlencode({"payload": text}).encode()


SLACK_BODIES = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda d: urlencode(d).encode(), st.dictionaries(st.text(max_size=12), st.text(max_size=80), max_size=8)),
    st.builds(
        _slash_form,
        _COMMAND_TEXT,
        _USER,
        st.sampled_from(["/gpu", "/gpu", "/other", ""]),
        st.dictionaries(st.sampled_from(["team_id", "trigger_id", "response_url", "ssl_check"]), st.text(max_size=20)),
    ),
    st.builds(
        _interaction,
        st.sampled_from(["block_actions", "view_submission", "view_closed", "shortcut"]),
        _USER,
        _JSON | _DIGITS,
        st.none() | _DEEP,
    ),
    st.builds(lambda t: urlencode({"payload": t}).encode(), _DEEP | st.text(max_size=100)),
)

_UUID = st.one_of(st.uuids().map(str), st.text(max_size=40))
WEBHOOK_BODIES = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda v: json.dumps(v).encode(), _JSON),
    st.builds(lambda d: d.encode(), _DEEP),
    st.builds(
        lambda u, status, fields, ir: json.dumps(
            {
                "incident_uuid": u,
                "incident_public_id": ir,
                "incident_status": status,
                "event_type": "incident_updated",
                "incident_fields": fields,
            }
        ).encode(),
        _UUID,
        st.text(max_size=20),
        _JSON,
        _JSON,
    ),
    st.builds(
        lambda transition, scope, alert_id: json.dumps(
            {"alert_transition": transition, "alert_scope": scope, "alert_id": alert_id, "date": "1"}
        ).encode(),
        st.sampled_from(["Triggered", "Recovered", "Re-Triggered", "No Data", ""]) | st.text(max_size=20),
        st.builds(lambda w: f"ir:ir-{w},host:x", _DIGITS) | st.text(max_size=60),
        _JSON,
    ),
)


def fuzz(target: Target, path: str, count: int, *, signed: bool, derandomize: bool = True) -> dict[str, Any]:
    """`count` hypothesis-generated bodies into one Function URL, signed (valid signature / token) or not.

    Derandomized by default (CI sees the same bodies every run); the benchmark draws new ones each time.
    """
    tally = Tally()
    slack = path == INGRESS_PATH

    def headers_for(body: bytes, content_type: str) -> dict[str, str]:
        if slack:
            headers = target.signed_headers(body) if signed else {}
        else:
            headers = {TOKEN_HEADER: target.webhook_secret} if signed else {}
        headers["Content-Type"] = content_type
        return headers

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=SLACK_BODIES if slack else WEBHOOK_BODIES, content_type=st.sampled_from([FORM, "application/json"]))
    def one(body: bytes, content_type: str) -> None:
        answer = target.post(path, body, headers_for(body, content_type))
        tally.note(body[:200].decode("utf-8", "replace"), answer, target.secrets)

    started = time.perf_counter()
    one()
    return {
        "path": path,
        "signed": signed,
        "sent": tally.sent,
        "server_errors": tally.server_errors,
        "tracebacks": tally.tracebacks,
        "secrets_in_answers": tally.secrets_found,
        "statuses": dict(sorted(tally.statuses.items())),
        "examples": tally.examples,
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_fuzz(target: Target, total: int, *, derandomize: bool = True) -> dict[str, Any]:
    """`total` fuzzed bodies split over every Function URL, signed and unsigned; then the run's aftermath."""
    runs = []
    share = {INGRESS_PATH: 0.5, INCIDENT_PATH: 0.25, IDLE_PATH: 0.25}
    for path in URL_PATHS:
        for signed in (True, False):
            count = max(1, int(total * share[path] / 2))
            runs.append(fuzz(target, path, count, signed=signed, derandomize=derandomize))
    failures = target.failures()
    return {
        "sent": sum(r["sent"] for r in runs),
        "server_errors": sum(r["server_errors"] for r in runs),
        "tracebacks": sum(r["tracebacks"] for r in runs) + failures["errors"],
        "dead_letters": failures["dead_letters"],
        "half_written": target.half_written(),
        "secrets_in_answers": sum(r["secrets_in_answers"] for r in runs),
        "secrets_at_rest": target.secrets_at_rest(),
        "runs": runs,
    }
