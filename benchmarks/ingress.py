"""Slack ingress latency: a cold process handling one signed command several ways, and command → IR end to end.

1. Cold start, each run a fresh Python process that imports a Lambda entry point and handles one freshly signed
   `/gpu request 8 H100 ...` (the body of events/slack_command_request_inline.json, signed with the current time
   so the real clock and signature check run), the modes alternating run by run:
   - local:     the gpufarm ingress with the signing secret and the farm file from the environment, the hand-off
     to the worker stubbed (what `gpufarm local` and the unit tests run);
   - lambda:    the gpufarm ingress as deployed without SnapStart: its environment as template.yaml sets it, its
     secret keys and the farm YAML read from SSM in one call (GPUFARM_SECRETS_NAME and GPUFARM_SECRET_KEYS through
     Parameter Store's Secrets Manager reference, GPUFARM_FARM_CONFIG_PARAMETER), the signature checked, the command
     parsed against the farm, the hand-off a Lambda `invoke(InvocationType="Event")`, all against moto in server
     mode on a loopback port (AWS_ENDPOINT_URL);
   - snapstart: the same, as SnapStart runs it: the process runs the init phase and the before-snapshot hooks (on
     Lambda: once, when a version is published), then the after-restore hooks and the first request, which are
     timed alone ("after restore"). Lambda's restore of the microVM itself cannot be measured here; its REPORT
     line shows it as Restore Duration;
   - bolt:      a Slack Bolt app with a lazy listener (benchmarks/bolt_lazy_app.py) whose lazy runner re-invokes
     the function through boto3 against the same moto; its secrets come from the environment, as Bolt's docs
     show, which spares it a secret read; bolt-sm: the same app reading them from the same Secrets Manager secret;
   - bolt-snapstart: the Bolt app restored from a snapshot (its init before it; timed: the first request, Bolt
     having no after-restore hook), and bolt-primed-snapstart: Bolt primed (benchmarks/bolt_primed_app.py, its
     handler and Lambda client built at init, as gpufarm builds its clients), restored the same way.
   moto answers an Event invoke without Docker the way Lambda does (HTTP 202) but runs nothing, so every request
   reaching moto is recorded here: each run must make exactly one Event invoke with the expected payload, and the
   AWS calls each mode made per cold request are printed. Reported: medians of spawn-to-answer (what Slack waits
   for; a Lambda container does not exit after its first request), of the whole process (teardown included), of
   the child's CPU time, and the like-with-like ratios, paired by round with their spread: lambda / bolt in CPU
   (cold with cold; target <= 1.0) and snapstart / bolt-primed-snapstart in CPU after the restore (restored with
   restored; target <= 1.0), with snapstart / bolt-snapstart beside it. `--source NAME=PATH` adds another
   checkout (mode@NAME), which is how the lever table of benchmarks/RESULTS.md was made: one checkout per lever
   taken away.
2. End to end under the local function host (`gpufarm local` in-process): the sandbox types a slash command as
   a Slack user; the clock runs until the IR number appears in the sandbox's Slack messages (the worker's
   answer through the response_url). Each request is released afterwards so quotas never run out.

Run: .venv/bin/python benchmarks/ingress.py [--runs 9] [--cold-only] [--modes ...] [--source ...] [--json]
(needs the `bench` extra: `pip install -e '.[dev,bench]'`, which `make bench` does).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
EVENT = ROOT / "events" / "slack_command_request_inline.json"
FARM = ROOT / "config" / "farm.example.yaml"
LOCAL_TARGET_MS = 300.0
REGION = "us-east-1"
ACCOUNT = "123456789012"
SIGNING_SECRET = "fakesigningsecret000000000000000"
BOT_TOKEN = "xoxb-0000000000-0000000000000-fakefakefakefakefakefake"
SECRET_NAME = "gpufarm/bench"
FARM_PARAMETER = "/gpufarm/bench-farm"
WORKER = "gpufarm-slack-worker"
INGRESS = "gpufarm-slack-ingress"
BOLT = "bolt-lazy-app"
MIN_RUNS = 9

# One child script for every mode: a prelude (what the mode imports and wires), then one request. It prints what
# it answered and how long the part inside the interpreter took (import + init + handle).
CHILD = r"""
import time
started = time.perf_counter()
import json, sys
event = json.load(open(sys.argv[1]))

class Context:
    function_name = sys.argv[2]
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:" + sys.argv[2]
    aws_request_id = "00000000-0000-4000-8000-000000000000"
    memory_limit_in_mb = 512
    log_group_name = "/aws/lambda/" + sys.argv[2]
    log_stream_name = "bench"
    def get_remaining_time_in_millis(self):
        return 10_000

{prelude}
# After a restore: from the start of the after-restore hooks (a SnapStart prelude sets both marks before running
# them); otherwise from here, the request alone.
restored = globals().get("restore_started") or time.perf_counter()
restored_cpu = globals().get("restore_cpu_started") or time.process_time()
answer = handler(event, Context())
done = time.perf_counter()
done_cpu = time.process_time()
answered_at = time.time()
print(json.dumps({{
    "answered_at": answered_at,
    "inside_ms": (done - started) * 1000,
    "restored_ms": (done - restored) * 1000,
    "restored_cpu_ms": (done_cpu - restored_cpu) * 1000,
    "status": answer["statusCode"],
    "body": answer.get("body") or "",
    "extra": extra() if "extra" in globals() else None,
}}))
"""

PRELUDES = {
    "local": r"""
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.handlers import runtime

class Stub:
    payloads = []
    def invoke(self, function, payload):
        self.payloads.append((function, payload))

stub = Stub()
runtime.override(invoker=stub)
handler = slack_ingress.handler
def extra():
    return [[f, p["kind"]] for f, p in stub.payloads]
""",
    "lambda": r"""
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
handler = slack_ingress.handler
""",
    "snapstart": r"""
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
handler = slack_ingress.handler
from gpufarm.handlers import snapstart
snapstart.run_before_snapshot()
restore_started, restore_cpu_started = time.perf_counter(), time.process_time()
snapstart.run_after_restore()
""",
    # Bolt as written, restored: its init (imports, the app and its auth.test) in the snapshot; Bolt registers no
    # after-restore hook, so the first request is all that runs after the restore.
    "bolt-snapstart": r"""
sys.path.insert(0, "benchmarks")
import bolt_lazy_app
handler = bolt_lazy_app.handler
""",
    # Bolt primed (benchmarks/bolt_primed_app.py): its request handler and the lazy runner's Lambda client built at
    # init too, as the gpufarm ingress builds its clients; restored the same way.
    "bolt-primed-snapstart": r"""
sys.path.insert(0, "benchmarks")
import bolt_primed_app
handler = bolt_primed_app.handler
""",
    "bolt": r"""
sys.path.insert(0, "benchmarks")
import bolt_lazy_app
handler = bolt_lazy_app.handler
""",
}
# The same Bolt app reading its token and signing secret from the Secrets Manager secret gpufarm reads.
PRELUDES["bolt-sm"] = PRELUDES["bolt"]
# Where each mode hands off to, and the payload's shape there.
BOLT_MODES = ("bolt", "bolt-sm", "bolt-snapstart", "bolt-primed-snapstart")
INVOKED = {"lambda": WORKER, "snapstart": WORKER} | dict.fromkeys(BOLT_MODES, BOLT)
FUNCTION_NAME = {"local": INGRESS, "lambda": INGRESS, "snapstart": INGRESS} | dict.fromkeys(BOLT_MODES, BOLT)
# Like with like: (gpufarm's mode, the Bolt mode it is held to, the resource compared, the target ratio).
PAIRS = (
    ("lambda", "bolt", "cpu", 1.0),  # cold, without SnapStart, in CPU
    ("snapstart", "bolt-primed-snapstart", "restored_cpu", 1.0),  # after a restore, hooks and first request
    ("snapstart", "bolt-snapstart", "restored_cpu", None),  # Bolt as written, restored: shown, no target
)


# -- moto in server mode, recording every request -------------------------------------------------------------


class Recorder:
    """The AWS operations moto served, in order (service:operation, plus the payload of Lambda invokes)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def take(self) -> list[dict[str, Any]]:
        """The calls since the last take."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls

    def middleware(self, app: Callable[..., Any]) -> Callable[..., Any]:
        """WSGI middleware noting each call before moto answers it."""

        def recorded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            path = environ.get("PATH_INFO", "")
            call: dict[str, Any] = {"op": environ.get("HTTP_X_AMZ_TARGET") or f"{environ['REQUEST_METHOD']} {path}"}
            if path.startswith("/2015-03-31/functions/") and path.endswith("/invocations"):
                call = {
                    "op": "lambda:Invoke",
                    # A name or an ARN (Bolt re-invokes its own ARN): the name is the last part of either.
                    "function": unquote(path.split("/")[3]).rsplit(":", 1)[-1],
                    "type": environ.get("HTTP_X_AMZ_INVOCATION_TYPE", "RequestResponse"),
                    "payload": json.loads(body or b"null"),
                }
            if not path.startswith("/moto-api"):
                with self._lock:
                    self.calls.append(call)
            return app(environ, start_response)

        return recorded


@contextmanager
def moto_server() -> Iterator[tuple[str, Recorder]]:
    """moto on a free loopback port, Lambda without Docker (invokes answer as Lambda does and run nothing)."""
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    recorder = Recorder()
    app = recorder.middleware(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        request = urllib.request.Request(
            f"{url}/moto-api/config", data=json.dumps({"lambda": {"use_docker": False}}).encode(), method="POST"
        )
        urllib.request.urlopen(request, timeout=10).close()
        yield url, recorder
    finally:
        server.shutdown()
        thread.join()


def aws_env(url: str) -> dict[str, str]:
    """What a Lambda container's environment says about AWS, pointed at moto."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "ASIAFAKEFAKEFAKEFAKE",
        "AWS_SECRET_ACCESS_KEY": "fakefakefakefakefakefakefakefakefakefake",
        "AWS_SESSION_TOKEN": "fake-session-token",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    }


def seed(url: str) -> None:
    """The secret, the farm parameter and the two functions a hand-off may name."""
    import boto3

    session = boto3.Session(**{k: v for k, v in _credentials().items() if v}, region_name=REGION)
    secret = {
        "datadog_api_key": "fake-dd-api-key",
        "datadog_app_key": "fake-dd-app-key",
        "slack_bot_token": BOT_TOKEN,
        "slack_signing_secret": SIGNING_SECRET,
        "webhook_secret": "fake-webhook-secret",
    }
    secrets = session.client("secretsmanager", endpoint_url=url)
    # Bolt's app reads one JSON secret; gpufarm one secret per key (`<prefix>/<key>`, as `gpufarm secrets put` writes).
    secrets.create_secret(Name=SECRET_NAME, SecretString=json.dumps(secret))
    for key, value in secret.items():
        secrets.create_secret(Name=f"{SECRET_NAME}/{key}", SecretString=value)
    session.client("ssm", endpoint_url=url).put_parameter(
        Name=FARM_PARAMETER, Value=FARM.read_text(), Type="SecureString"
    )
    role = session.client("iam", endpoint_url=url).create_role(
        RoleName="bench", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    lam = session.client("lambda", endpoint_url=url)
    for name in (WORKER, BOLT):
        lam.create_function(
            FunctionName=name, Runtime="python3.12", Role=role, Handler="x.handler", Code={"ZipFile": _zip()}
        )


def _credentials() -> dict[str, str]:
    env = aws_env("")
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": env["AWS_SESSION_TOKEN"],
    }


def _zip() -> bytes:
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("x.py", "def handler(event, context):\n    return None\n")
    return buffer.getvalue()


@contextmanager
def slack_stub() -> Iterator[tuple[str, list[str]]]:
    """A loopback Slack Web API answering auth.test at once (Bolt checks its token when the app is built)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            body = json.dumps(
                {
                    "ok": self.path.endswith("/auth.test"),
                    "url": "https://fake-workspace.slack.com/",
                    "team": "fake-workspace",
                    "user": "gpufarm",
                    "team_id": "T0000000001",
                    "user_id": "U0000000009",
                    "bot_id": "B0000000001",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api/", seen
    finally:
        server.shutdown()
        thread.join()


# Other checkouts of gpufarm to measure beside this one (--source NAME=PATH, then a mode such as lambda@NAME): how the
# lever table in benchmarks/RESULTS.md was made, one checkout per lever taken away.
SOURCES: dict[str, Path] = {}


def _base(mode: str) -> str:
    return mode.split("@", 1)[0]


# -- the cold runs --------------------------------------------------------------------------------------------


def mode_env(mode: str, url: str, slack_url: str) -> dict[str, str]:
    """The environment of a fresh process in one mode (nothing of the developer's GPUFARM_/AWS_/SLACK_ leaks in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env["PYTHONDONTWRITEBYTECODE"] = ""
    if mode == "local":
        env.update(
            {
                "GPUFARM_SLACK_SIGNING_SECRET": SIGNING_SECRET,
                "GPUFARM_WORKER_FUNCTION": WORKER,
                "GPUFARM_FARM_CONFIG": str(FARM),
            }
        )
        return env
    env.update(aws_env(url))
    env["AWS_LAMBDA_FUNCTION_NAME"] = FUNCTION_NAME[mode]
    if mode in ("bolt", "bolt-snapstart", "bolt-primed-snapstart"):
        env.update({"SLACK_SIGNING_SECRET": SIGNING_SECRET, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_API_URL": slack_url})
    elif mode == "bolt-sm":
        env.update({"BOLT_SECRETS_NAME": SECRET_NAME, "SLACK_API_URL": slack_url})
    else:
        env.update(
            {
                "GPUFARM_SECRETS_NAME": SECRET_NAME,
                # The ingress's keys, as template.yaml declares them.
                "GPUFARM_SECRET_KEYS": "slack_signing_secret,slack_bot_token",
                "GPUFARM_FARM_CONFIG_PARAMETER": FARM_PARAMETER,
                "GPUFARM_WORKER_FUNCTION": WORKER,
                # What template.yaml sets on the ingress besides.
                "POWERTOOLS_SERVICE_NAME": "gpufarm",
                "POWERTOOLS_LOG_LEVEL": "INFO",
                "PYDANTIC_DISABLE_PLUGINS": "__all__",
            }
        )
    return env


def signed_event(path: Path) -> None:
    """The command event, signed now with the signing secret, written to `path`."""
    event = json.loads(EVENT.read_text())
    timestamp = str(int(time.time()))
    base = f"v0:{timestamp}:{event['body']}".encode()
    signature = "v0=" + hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    event["headers"]["x-slack-request-timestamp"] = timestamp
    event["headers"]["x-slack-signature"] = signature
    path.write_text(json.dumps(event))


def one_run(mode: str, url: str, slack_url: str, event_path: Path) -> dict[str, Any]:
    """One fresh process handling one request; its wall time and what it answered."""
    signed_event(event_path)
    base = _base(mode)
    script = CHILD.format(prelude=PRELUDES[base])
    env = mode_env(base, url, slack_url)
    source = SOURCES[mode.split("@", 1)[1]] if "@" in mode else ROOT
    if source != ROOT:
        # That checkout's gpufarm ahead of the editable install of this one.
        env["PYTHONPATH"] = str(source / "layers" / "gpufarm")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned_at = time.time()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, str(event_path), FUNCTION_NAME[base]],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{done.stderr[-3000:]}")
    if os.environ.get("BENCH_DEBUG"):
        print(done.stderr[-3000:], file=sys.stderr)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_ms"] = wall
    # Spawn to answer: what Slack waits for. A Lambda container does not exit after its first request, so the
    # interpreter's teardown (longer the more modules it loaded) is in wall_ms but not here.
    result["answer_ms"] = (result["answered_at"] - spawned_at) * 1000
    # CPU time of that one child (runs are sequential): steadier than wall time on a shared machine.
    result["cpu_ms"] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return result


def check(mode: str, result: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """Each run answered Slack and made exactly the hand-off its mode makes."""
    mode = _base(mode)
    if result["status"] != 200 or "Requesting" not in result["body"]:
        raise RuntimeError(f"{mode} answered {result['status']}: {result['body'][:300]}")
    invokes = [c for c in calls if c["op"] == "lambda:Invoke"]
    if mode == "local":
        if calls or result["extra"] != [[WORKER, "request"]]:
            raise RuntimeError(f"local run reached AWS or did not hand off: {calls} {result['extra']}")
        return
    if len(invokes) != 1 or invokes[0]["function"] != INVOKED[mode] or invokes[0]["type"] != "Event":
        raise RuntimeError(f"{mode} run made {invokes} instead of one Event invoke of {INVOKED[mode]}")
    payload = invokes[0]["payload"]
    if mode.startswith("bolt"):
        ok = payload["headers"].get("x-slack-bolt-lazy-only") == "1" and "command=%2Fgpu" in payload["body"]
    else:
        ok = payload.get("kind") == "request" and payload["request"]["gpu_count"] == 8
    if not ok:
        raise RuntimeError(f"{mode} handed off an unexpected payload: {str(payload)[:300]}")


def cold_runs(runs: int, modes: list[str]) -> dict[str, Any]:
    """Alternating fresh-process runs of every mode against one moto server."""
    with (
        moto_server() as (url, recorder),
        slack_stub() as (slack_url, slack_calls),
        tempfile.TemporaryDirectory() as tmp,
    ):
        seed(url)
        recorder.take()
        event_path = Path(tmp) / "event.json"
        ops: dict[str, list[str]] = {}
        # One untimed run of each so .pyc files exist, as they do in a deployed layer.
        for mode in modes:
            result = one_run(mode, url, slack_url, event_path)
            calls = recorder.take()
            check(mode, result, calls)
            ops[mode] = [c["op"] for c in calls] + [f"slack:{p.rsplit('/', 1)[-1]}" for p in slack_calls]
            slack_calls.clear()
        wall: dict[str, list[float]] = {m: [] for m in modes}
        answer: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        inside: dict[str, list[float]] = {m: [] for m in modes}
        restored: dict[str, list[float]] = {m: [] for m in modes}
        restored_cpu: dict[str, list[float]] = {m: [] for m in modes}
        for n in range(runs):
            # Rotate the order so no mode always runs right after another.
            for mode in modes[n % len(modes) :] + modes[: n % len(modes)]:
                result = one_run(mode, url, slack_url, event_path)
                check(mode, result, recorder.take())
                wall[mode].append(result["wall_ms"])
                answer[mode].append(result["answer_ms"])
                cpu[mode].append(result["cpu_ms"])
                inside[mode].append(result["inside_ms"])
                restored[mode].append(result["restored_ms"])
                restored_cpu[mode].append(result["restored_cpu_ms"])
    return {
        mode: {
            "answer_median_ms": statistics.median(answer[mode]),
            "answer_max_ms": max(answer[mode]),
            "process_median_ms": statistics.median(wall[mode]),
            "process_max_ms": max(wall[mode]),
            "cpu_median_ms": statistics.median(cpu[mode]),
            "inside_median_ms": statistics.median(inside[mode]),
            "restored_median_ms": statistics.median(restored[mode]),
            # Per run, in run order: the ratios pair the runs of one round (made one after the other).
            "runs": {"cpu": cpu[mode], "restored_cpu": restored_cpu[mode], "answer": answer[mode]},
            "aws_calls": ops[mode],
        }
        for mode in modes
    }


# -- end to end -----------------------------------------------------------------------------------------------


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def end_to_end(runs: int) -> dict[str, Any]:
    """Slash command → IR number in the sandbox's Slack messages, under the local function host."""
    import re

    from gpufarm.config import Settings
    from gpufarm.core.config.farm import parse_farm
    from gpufarm_sandbox.demo.lifecycle_stage import ALICE, LocalFarm
    from gpufarm_sandbox.localhost import start_local

    with start_local(port=0) as env:
        farm = LocalFarm(env.url, env.host, Settings())
        farm.seed_workspace()
        farm.seed_hosts()
        farm.apply_setup(parse_farm(FARM.read_text()).valid_values())
        to_ir: list[float] = []
        acks: list[float] = []
        to_allocated: list[float] = []
        seen = 0
        for n in range(runs):
            started = time.perf_counter()
            sent = farm.slash(ALICE, f"request 8 H100 project=bench-{n} team=nlp env=onprem-hpc days=1")
            acks.append(float(sent["latency_ms"]))
            ir = None
            while ir is None and time.perf_counter() - started < 30:
                messages = _get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"]
                for message in messages[seen:]:
                    match = re.search(r"\bIR-(\d+)\b", message["text"])
                    if match:
                        ir = int(match.group(1))
                if ir is None:
                    time.sleep(0.002)
            if ir is None:
                raise RuntimeError("no IR number within 30 s")
            to_ir.append((time.perf_counter() - started) * 1000)
            seen = len(_get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"])
            while farm.allocation(ir).phase.value != "allocated" and time.perf_counter() - started < 30:
                time.sleep(0.005)
            to_allocated.append((time.perf_counter() - started) * 1000)
            farm.slash(ALICE, f"release IR-{ir}")
            farm.settle()
            seen = len(_get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"])
        farm.close()
    return {
        "runs": runs,
        "ack_median_ms": statistics.median(acks),
        "command_to_ir_median_ms": statistics.median(to_ir),
        "command_to_ir_max_ms": max(to_ir),
        "command_to_hosts_tagged_median_ms": statistics.median(to_allocated),
    }


# -- report ---------------------------------------------------------------------------------------------------


def report_cold(cold: dict[str, Any], runs: int) -> None:
    """The cold figures, their ratios and the verdicts (on the spawn-to-answer medians)."""
    print(f"cold ingress, fresh process per run, medians of {runs} alternating runs (ms):")
    print(f"  {'mode':<18} {'answer':>6} {'process':>7} {'CPU':>5} {'inside':>6}  AWS calls")
    for mode, figures in cold.items():
        calls = ", ".join(figures["aws_calls"]) or "none"
        print(
            f"  {mode:<18} {figures['answer_median_ms']:6.0f} {figures['process_median_ms']:7.0f} "
            f"{figures['cpu_median_ms']:5.0f} {figures['inside_median_ms']:6.0f}  {calls}"
        )
    print("  answer: spawn to answer; process: whole process incl. teardown; CPU: the child's; inside: import + handle")
    if "local" in cold:
        verdict = "meets" if cold["local"]["answer_median_ms"] <= LOCAL_TARGET_MS else "MISSES"
        print(f"  local mode {verdict} the {LOCAL_TARGET_MS:.0f} ms target")
    print("  like with like, paired by round (median, min-max over rounds):")
    for ours, theirs, key, target in PAIRS:
        if ours not in cold or theirs not in cold:
            continue
        mine, peer = cold[ours]["runs"][key], cold[theirs]["runs"][key]
        ratios = [a / b for a, b in zip(mine, peer, strict=True)]
        what = "CPU, whole cold process" if key == "cpu" else "CPU after the restore (hooks + first request)"
        verdict = ""
        if target is not None:
            verdict = f"   target <= {target:.1f}: " + ("meets" if statistics.median(ratios) <= target else "MISSES")
        print(
            f"    {ours} / {theirs}, {what}: {_spread(ratios)} x "
            f"({statistics.median(mine):.1f} ms against {statistics.median(peer):.1f} ms){verdict}"
        )


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, {min(values):.2f}-{max(values):.2f}"


def main() -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=MIN_RUNS)
    parser.add_argument("--cold-only", action="store_true", help="skip the end-to-end measurement")
    parser.add_argument(
        "--modes",
        default="",
        help="comma-separated: local,lambda,snapstart,bolt,bolt-sm,bolt-snapstart,bolt-primed-snapstart,mode@NAME",
    )
    parser.add_argument("--json", action="store_true", help="print the cold figures as JSON too")
    parser.add_argument(
        "--source", action="append", default=[], metavar="NAME=PATH", help="another gpufarm checkout (mode@NAME)"
    )
    args = parser.parse_args()
    if args.runs < MIN_RUNS:
        parser.error(f"--runs must be at least {MIN_RUNS}")
    modes = [m for m in args.modes.split(",") if m] or [
        "local",
        "lambda",
        "snapstart",
        "bolt",
        "bolt-snapstart",
        "bolt-primed-snapstart",
    ]
    for item in args.source:
        name, _, path = item.partition("=")
        SOURCES[name] = Path(path).resolve()
    unknown = {m for m in modes if _base(m) not in PRELUDES or ("@" in m and m.split("@", 1)[1] not in SOURCES)}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    cold = cold_runs(args.runs, modes)
    report_cold(cold, args.runs)
    if args.json:
        print(json.dumps(cold))
    if args.cold_only:
        return
    e2e = end_to_end(args.runs)
    print(
        f"slash command -> IR number in Slack (local host), median of {e2e['runs']}: "
        f"{e2e['command_to_ir_median_ms']:.0f} ms (max {e2e['command_to_ir_max_ms']:.0f} ms); "
        f"ack {e2e['ack_median_ms']:.0f} ms; hosts tagged after {e2e['command_to_hosts_tagged_median_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
