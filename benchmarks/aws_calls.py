"""The Slack ingress's two AWS calls, each alone: through the botocore client, and made directly (adapters/aws_lean.py).

One process against moto in server mode on a loopback port (seeded as benchmarks/ingress.py seeds it), every call on
a fresh connection, as the first request after a SnapStart restore makes it. Per call, the thread's CPU time,
median and 10th percentile of --runs calls, the ways alternating call by call:
- client: `ssm.get_parameters(Names=[two secret references, the farm], WithDecryption=True)` and
  `lambda.invoke(FunctionName=..., InvocationType="Event", Payload=...)` on the ingress's botocore clients;
- urllib3: the same request built as aws_lean builds it (botocore's AWSRequest, signed with its SigV4Auth), sent
  with botocore's own URLLib3Session: what the client's sending costs without its pipeline;
- direct: aws_lean's AwsEndpoint (the same signing, sent with http.client), as the restored ingress calls;
- signing: SigV4Auth over the AWSRequest alone.

Run: .venv/bin/python benchmarks/aws_calls.py [--runs 40] (needs the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingress  # benchmarks/ingress.py: moto in server mode, its seed and environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with ingress.moto_server() as (url, _recorder):
        ingress.seed(url)
        os.environ.update(ingress.aws_env(url))
        figures = measure(args.runs)
    print(f"one AWS call after a restore, a fresh connection each, thread CPU over {args.runs} calls (ms):")
    print(f"  {'call':<28} {'median':>7} {'p10':>7}")
    for name, values in figures.items():
        print(f"  {name:<28} {statistics.median(values):7.3f} {sorted(values)[len(values) // 10]:7.3f}")
    for call in ("GetParameters", "Invoke"):
        ratio = statistics.median(figures[f"{call} direct"]) / statistics.median(figures[f"{call} client"])
        print(f"  {call}: direct / client {ratio:.2f} x")


def measure(runs: int) -> dict[str, list[float]]:
    """Thread CPU per call of each way, alternating, connections dropped before each call."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import EnvProvider
    from botocore.httpsession import URLLib3Session

    from gpufarm.adapters import aws
    from gpufarm.config import Settings

    settings = Settings()
    ssm, lam = aws.aws_client("ssm", settings), aws.aws_client("lambda", settings)
    aws.use_direct_calls(("ssm", "lambda"), settings)
    direct_ssm, direct_lambda = aws.direct_endpoint("ssm", settings), aws.direct_endpoint("lambda", settings)
    assert direct_ssm is not None and direct_lambda is not None
    credentials = EnvProvider().load()  # the environment's keys, as the ingress's direct calls take them
    names = [
        aws.secret_parameter(f"{ingress.SECRET_NAME}/slack_signing_secret"),
        aws.secret_parameter(f"{ingress.SECRET_NAME}/slack_bot_token"),
        ingress.FARM_PARAMETER,
    ]
    payload = json.dumps({"kind": "request"}).encode()
    http = URLLib3Session(timeout=10)

    def signed(service: str, path: str, headers: dict[str, str], body: bytes) -> AWSRequest:
        request = AWSRequest(method="POST", url=ssm.meta.endpoint_url + path, data=body, headers=headers)
        SigV4Auth(credentials.get_frozen_credentials(), service, ssm.meta.region_name).add_auth(request)
        return request

    def ssm_request() -> AWSRequest:
        body = json.dumps({"Names": names, "WithDecryption": True}).encode()
        target = {"X-Amz-Target": "AmazonSSM.GetParameters", "Content-Type": "application/x-amz-json-1.1"}
        return signed("ssm", "/", target, body)

    def invoke_request() -> AWSRequest:
        path = f"/2015-03-31/functions/{ingress.WORKER}/invocations"
        return signed("lambda", path, {"X-Amz-Invocation-Type": "Event"}, payload)

    def sent(request: AWSRequest) -> None:
        answer = http.send(request.prepare())
        assert answer.status_code < 300, answer.status_code

    ways: dict[str, Callable[[], object]] = {
        "GetParameters client": lambda: ssm.get_parameters(Names=names, WithDecryption=True),
        "GetParameters urllib3": lambda: sent(ssm_request()),
        "GetParameters direct": lambda: direct_ssm.call_json("GetParameters", {"Names": names, "WithDecryption": True}),
        "Invoke client": lambda: lam.invoke(FunctionName=ingress.WORKER, InvocationType="Event", Payload=payload),
        "Invoke urllib3": lambda: sent(invoke_request()),
        "Invoke direct": lambda: direct_lambda.invoke_event(ingress.WORKER, payload),
        "signing alone": ssm_request,
    }
    for way in ways.values():
        way()  # once untimed: the first call of each builds what later ones reuse
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        for name, way in ways.items():
            aws.forget_connections()
            http.close()
            started = time.thread_time()
            way()
            figures[name].append((time.thread_time() - started) * 1000)
    return figures


if __name__ == "__main__":
    main()
