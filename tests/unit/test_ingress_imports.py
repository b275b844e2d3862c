"""The Slack ingress path never imports Datadog's aggregate model package (nor the client, nor boto3).

Checked in a fresh interpreter: import the Lambda entry point, handle one signed slash command with the
hand-off stubbed, then look at sys.modules. A parent test process has imported everything already, so only a
subprocess can tell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.handlers import runtime

class Clock:
    def now(self):
        from datetime import datetime, UTC
        return datetime.fromtimestamp(1700000000, UTC)
    def epoch(self):
        return 1700000000.0

class Invoker:
    calls = []
    def invoke(self, function, payload):
        self.calls.append((function, payload))

invoker = Invoker()
runtime.override(clock=Clock(), invoker=invoker)
event = json.load(open("events/slack_command_request_inline.json"))
answer = slack_ingress.handler(event, None)
print(json.dumps({
    "status": answer["statusCode"],
    "body": json.loads(answer["body"]),
    "handed_off": invoker.calls,
    "ms": (time.perf_counter() - started) * 1000,
    "modules": sorted(m for m in sys.modules if m.startswith(("datadog_api_client", "boto3", "botocore", "slack_sdk"))),
}))
"""


def test_ingress_handles_a_command_without_importing_datadog_or_boto3() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env.update(
        {
            "GPUFARM_SLACK_SIGNING_SECRET": "fakesigningsecret000000000000000",
            "GPUFARM_WORKER_FUNCTION": "SlackWorkerFunction",
            "GPUFARM_FARM_CONFIG": "config/farm.example.yaml",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    assert result["body"]["response_type"] == "ephemeral"
    assert "Requesting 8x H100 in onprem-hpc for nlp/llm-ko" in result["body"]["text"]
    [(function, payload)] = result["handed_off"]
    assert function == "SlackWorkerFunction"
    assert payload["kind"] == "request" and payload["request"]["gpu_count"] == 8
    assert result["modules"] == [], f"the ingress imported {result['modules'][:5]}"


# What loading the entry point and answering a request that needs no farm must not import: the farm's and the
# incident's pydantic models, the hand-off's model, the message builders, the request form, the policy and PyYAML.
# A request imports what it needs when it runs (gpufarm.handlers.slack_ingress); these stay off every path but
# the inline request and the form.
HEAVY = (
    "gpufarm.core.config.farm",
    "gpufarm.core.kernel.model",
    "gpufarm.core.kernel.history",
    "gpufarm.core.governance.policy",
    "gpufarm.core.chat.block_kit",
    "gpufarm.core.chat.links",
    "gpufarm.core.chat.messages",
    "gpufarm.core.chat.modal",
    "gpufarm.handlers.slack_events",
    "yaml",
    "slack_sdk",
)

LIGHT_SCRIPT = r"""
import json, sys
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.handlers import runtime

heavy = sys.argv[1].split(",")
loaded = {"import": sorted(m for m in heavy if m in sys.modules)}

class Clock:
    def now(self):
        from datetime import datetime, UTC
        return datetime.fromtimestamp(1700000000, UTC)
    def epoch(self):
        return 1700000000.0

class Invoker:
    calls = []
    def invoke(self, function, payload):
        self.calls.append(payload["kind"])

invoker = Invoker()
runtime.override(clock=Clock(), invoker=invoker)
statuses = []
for name in sys.argv[2:]:
    answer = slack_ingress.handler(json.load(open("events/" + name)), None)
    statuses.append(answer["statusCode"])
loaded["requests"] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps({"loaded": loaded, "statuses": statuses, "handed_off": invoker.calls}))
"""


def test_the_entry_point_and_requests_without_the_farm_import_no_model() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env.update(
        {
            "GPUFARM_SLACK_SIGNING_SECRET": "fakesigningsecret000000000000000",
            "GPUFARM_WORKER_FUNCTION": "SlackWorkerFunction",
            "GPUFARM_FARM_CONFIG": "config/farm.example.yaml",
        }
    )
    events = ("slack_command_release.json", "slack_block_actions_release.json", "slack_command_help.json")
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_SCRIPT, ",".join(HEAVY), *events],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["statuses"] == [200, 200, 200]
    assert result["handed_off"] == ["command", "action"]
    assert result["loaded"] == {"import": [], "requests": []}


# Lambda mode: the secret keys and the farm from SSM (one call), the hand-off an Event invoke, against moto in server
# mode on a loopback port (the ingress's direct calls after a SnapStart restore go over the socket, as in Lambda);
# a WSGI layer in front of moto notes each operation.
LAMBDA_SCRIPT = r"""
import hashlib, hmac, json, os, sys, threading, time
import boto3
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

calls = []
moto = DomainDispatcherApplication(create_backend_app)

def noted(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path.endswith("/invocations"):
        calls.append("Invoke")
    elif environ.get("HTTP_X_AMZ_TARGET"):
        calls.append(environ["HTTP_X_AMZ_TARGET"].split(".")[-1])
    return moto(environ, start_response)

server = make_server("127.0.0.1", 0, noted, threaded=True, request_handler=MotoRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = "http://127.0.0.1:%d" % server.server_port
os.environ["AWS_ENDPOINT_URL"] = url
import urllib.request
urllib.request.urlopen(urllib.request.Request(url + "/moto-api/config", data=b'{"lambda": {"use_docker": false}}'))
for key, value in (("slack_signing_secret", "signing-secret-value-0000"), ("slack_bot_token", "xoxb-0")):
    boto3.client("secretsmanager").create_secret(Name="gpufarm/prod/" + key, SecretString=value)
farm = open("config/farm.example.yaml").read()
boto3.client("ssm").put_parameter(Name="/gpufarm/farm", Value=farm, Type="SecureString")
role = boto3.client("iam").create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
import io, zipfile
code = io.BytesIO()
with zipfile.ZipFile(code, "w") as archive:
    archive.writestr("x.py", "def handler(event, context):\n    return None\n")
boto3.client("lambda").create_function(
    FunctionName="gpufarm-slack-worker", Runtime="python3.12", Role=role, Handler="x.handler",
    Code={"ZipFile": code.getvalue()},
)
before = set(sys.modules)
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.adapters import aws
from gpufarm.handlers import runtime, snapstart

snapshot = "--snapstart" in sys.argv
if snapshot:
    snapstart.run_before_snapshot()
    prepared = sorted(key[0] for key in aws._clients)
    assert runtime._current is None and not aws._cache, "the snapshot must hold no secret"
    assert runtime._last_farm is not None, "the parsed farm is in the snapshot"
    kept_farm = runtime._last_farm[1]
    assert "gpufarm.core.governance.policy" in sys.modules, "the farm and request models are in the snapshot"
    assert "yaml" in sys.modules, "the farm's YAML loader is built into the snapshot"
    snapstart.run_after_restore()
calls.clear()
client_calls = []
for service in ("ssm", "lambda"):
    aws.aws_client(service, runtime.Settings()).meta.events.register(
        "before-call.*.*", lambda model, **_: client_calls.append(model.name)
    )
event = json.load(open("events/slack_command_request_inline.json"))
stamp = str(int(time.time()))
base = ("v0:" + stamp + ":" + event["body"]).encode()
event["headers"]["x-slack-request-timestamp"] = stamp
event["headers"]["x-slack-signature"] = "v0=" + hmac.new(
    b"signing-secret-value-0000", base, hashlib.sha256
).hexdigest()
answer = slack_ingress.handler(event, None)
print(json.dumps({
    "status": answer["statusCode"],
    "body": json.loads(answer["body"]),
    "calls": calls,
    "client_calls": client_calls,
    "prepared": prepared if snapshot else None,
    "farm_parsed_again": (runtime._last_farm[1] is not kept_farm) if snapshot else None,
    "modules": sorted(
        m for m in set(sys.modules) - before
        if m.split(".")[0] in ("datadog_api_client", "pydantic_settings")
        or m.startswith("aws_lambda_powertools.utilities.parameters")
    ),
}))
"""


def _lambda_run(*args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env.update(
        {
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_LAMBDA_FUNCTION_NAME": "gpufarm-slack-ingress",
            "GPUFARM_SECRETS_NAME": "gpufarm/prod",
            # As template.yaml gives the ingress.
            "GPUFARM_SECRET_KEYS": "slack_signing_secret,slack_bot_token",
            "GPUFARM_FARM_CONFIG_PARAMETER": "/gpufarm/farm",
            "GPUFARM_WORKER_FUNCTION": "gpufarm-slack-worker",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", LAMBDA_SCRIPT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_in_lambda_one_ssm_call_reads_secret_and_farm_and_botocore_hands_off() -> None:
    result = _lambda_run()
    assert result["status"] == 200
    assert result["calls"] == ["GetParameters", "Invoke"]
    assert result["client_calls"] == ["GetParameters", "Invoke"], "without SnapStart the botocore clients call"
    # pydantic-settings, Powertools' parameters and the Datadog client stay off the cold path (boto3 too: this
    # script imports it for moto; benchmarks/ingress.py and test_aws_adapters.py check the ingress does not).
    assert result["modules"] == []


def test_snapstart_prepares_clients_without_secrets_and_reads_them_after_restore() -> None:
    result = _lambda_run("--snapstart")
    assert result["prepared"] == ["lambda", "ssm"]
    # The farm read again after the restore (with the secrets, one call) is unchanged: the snapshot's parse serves.
    assert result["farm_parsed_again"] is False
    assert result["status"] == 200
    assert result["calls"] == ["GetParameters", "Invoke"]
    # After the restore both calls go direct (adapters/aws_lean.py), past the clients' pipeline.
    assert result["client_calls"] == []
