"""Profiler upload benchmark: analysis time and peak RSS, the whole upload through the token endpoint for 10 MB and
200 MB traces, and how fast hostile traces are refused.

The traces are synthesised from the real torch.profiler fixture (tests/fixtures/profiler/cpu_mlp.json): its
events are replicated, each copy shifted past the previous one in time and its ProfilerStep# spans renumbered,
until the file reaches the size. So the mix of events is the profiler's own; only the length of the run is made
up. Each size runs in a fresh child process, so its peak RSS (ru_maxrss) is that upload's alone:

- analysis: reading and analysing the trace (gpufarm.profiling.reader + analysis), the part that must fit 1 GB;
- upload: end to end through the token endpoint, as a researcher runs it: `gpufarm profile upload` in its own
  process holding only an upload token and GPUFARM_API_URL begins, PUTs the trace to moto's S3 server (its own
  process, presigned URLs checked), and completes; the upload function (its own process, over in-memory Datadog
  fakes) downloads the trace, analyses it, gzips and stores it, records the run through the one writer and
  publishes its metrics. The wall time is the CLI's; the peak RSS is the function's process (the one analysing).

The hostile traces (each small on disk) break one per-event bound of gpufarm.profiling.reader each: nesting
200,000 deep, one 200 MB string in a gzip (of letters, and of escaped quotes), 3 million tiny events in a gzip,
one event of 10 MB, and 100 million values under a key that is not traceEvents. Each is read in a fresh process
like the analysis above and must be refused (ValidationFailed, exit 2 from `gpufarm profile upload`).

    .venv/bin/python benchmarks/profile.py            # 10 MB and 200 MB, then the hostile traces
    .venv/bin/python benchmarks/profile.py --sizes 10  # one size, in MB
    .venv/bin/python benchmarks/profile.py --sizes ''  # only the hostile traces

Goals: a 200 MB trace uploaded end to end in at most 60 s, its analysing process within 1 GB; each hostile trace
refused in at most 5 s within the same 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "profiler" / "cpu_mlp.json"
GOAL_S, GOAL_MB = 60.0, 1024
HOSTILE_GOAL_S = 5.0
ACCESS, SECRET = "AKIABENCHPROFILES001", "bench-not-a-secret"  # moto's stand-in credential
TOKEN_KEY = "bench-upload-token-key-0123456789"


def hostile_traces(work: Path) -> list[tuple[str, Path]]:
    """Write the hostile traces a megabyte at a time (the parent's peak RSS is inherited by each child's figure)."""
    import gzip

    mb = 1_000_000
    made: dict[str, tuple[bytes, bytes, int, bytes, bool]] = {
        # what: (head, repeated piece, times, tail, gzipped)
        "nested 200,000 deep": (b'{"traceEvents": [' + b"[" * 200_000, b"]" * 200_000, 1, b"]}", False),
        "one 200 MB string, gzipped": (b'{"traceEvents": [{"name": "', b"a" * mb, 200, b'"}]}', True),
        "one 200 MB string of escaped quotes, gzipped": (
            b'{"traceEvents": [{"name": "',
            b'\\"' * (mb // 2),
            200,
            b'"}]}',
            True,
        ),
        "3,000,000 tiny events, gzipped": (b'{"traceEvents": [', b"{}," * 500_000, 6, b"{}]}", True),
        "one 10 MB event, gzipped": (b'{"traceEvents": [{"args": [', b"0," * 500_000, 10, b"0]}]}", True),
        "100,000,000 values beside traceEvents, gzipped": (b'{"x": [', b"0," * 500_000, 200, b"0]}", True),
    }
    out = []
    for index, (what, (head, piece, times, tail, zipped)) in enumerate(made.items()):
        path = work / f"hostile-{index}.json{'.gz' if zipped else ''}"
        with path.open("wb") as raw:
            sink = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) if zipped else raw
            sink.write(head)
            for _ in range(times):
                sink.write(piece)
            sink.write(tail)
            sink.close()
        out.append((what, path))
    return out


def refuse(path: Path) -> dict[str, Any]:
    """Read a hostile trace in this process: how long until it was refused, and with what."""
    from gpufarm.core.kernel.errors import ValidationFailed
    from gpufarm.profiling import reader
    from gpufarm.profiling.analysis import analyse

    started = time.perf_counter()
    try:
        analyse(reader.events(path))
        refused = None
    except ValidationFailed as exc:
        refused = exc.message
    elapsed = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(elapsed, 2), "peak_rss_mb": round(peak_mb, 1), "refused": refused}


def synthesise(target: Path, size_mb: int) -> int:
    """Write a trace of about `size_mb` MB from copies of the fixture's events; returns the events written."""
    doc = json.loads(FIXTURE.read_text())
    events: list[dict[str, Any]] = doc.pop("traceEvents")
    spans = [e for e in events if isinstance(e.get("ts"), int | float)]
    first = min(e["ts"] for e in spans)
    span = max(e["ts"] + e.get("dur", 0) for e in spans) - first + 10.0
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    head = json.dumps(doc)[:-1] + ', "traceEvents": [\n'
    limit, written, copy = size_mb * 1_000_000, 0, 0
    with target.open("w") as out:
        out.write(head)
        size = len(head)
        while size < limit:
            for event in events:
                e = dict(event)
                if isinstance(e.get("ts"), int | float):
                    e["ts"] = e["ts"] + copy * span
                name = str(e.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy * steps}"
                text = ("" if written == 0 else ",\n") + json.dumps(e)
                out.write(text)
                size += len(text)
                written += 1
            copy += 1
        out.write("\n]}\n")
    return written


def child(mode: str, path: Path) -> dict[str, Any]:
    """Run one measurement in this process (the parent reads its JSON line)."""
    sys.path.insert(0, str(ROOT / "tests"))
    started = time.perf_counter()
    if mode == "hostile":
        return refuse(path)
    from gpufarm.profiling import reader
    from gpufarm.profiling.analysis import analyse

    figures = analyse(reader.events(path), batch_size=32)
    elapsed = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "seconds": round(elapsed, 2),
        "peak_rss_mb": round(peak_mb, 1),
        "steps": figures.steps,
        "events": figures.events,
    }


def serve_s3(port_file: Path) -> None:
    """moto's S3 server with presigned URLs checked (the local host's), until killed; its port in `port_file`."""
    import logging

    from gpufarm_sandbox.localhost.s3_server import CheckedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = CheckedMotoServer({ACCESS: SECRET})
    server.start()
    port_file.write_text(str(server.get_host_and_port()[1]))
    while True:
        time.sleep(3600)


def serve_function(s3_url: str) -> None:
    """The upload function on a loopback port over in-memory Datadog fakes; prints its URL, a lease and a token,
    serves until a line on stdin, then prints its own peak RSS."""
    import logging
    import threading

    import botocore.session
    from botocore.config import Config
    from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics
    from upload_service import function_app
    from werkzeug.serving import make_server

    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.governance.policy import build_request
    from gpufarm.core.kernel.upload_token import mint
    from gpufarm.core.leases.upload_tokens import expiry
    from gpufarm.core.service import GpuFarm
    from gpufarm.handlers import runtime as rt

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(
        AWS_ENDPOINT_URL_S3=s3_url,
        AWS_ACCESS_KEY_ID=ACCESS,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION="us-east-1",
        GPUFARM_PROFILE_BUCKET="bench-profiles",
        GPUFARM_PROFILE_PAGES_URL="http://127.0.0.1:9/pages",
        GPUFARM_PROFILE_LINK_SECRET="bench-link-secret",
        GPUFARM_UPLOAD_TOKEN_SECRET=TOKEN_KEY,
    )
    s3 = botocore.session.get_session().create_client("s3", config=Config(signature_version="s3v4"))
    s3.create_bucket(Bucket="bench-profiles")
    clock = FakeClock()
    farm = parse_farm(FARM_YAML)
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=FakeHosts(),
        chat=FakeChat(),
        clock=clock,
        farm=farm,
        metrics=FakeMetrics(),
    )
    values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm"}
    request = build_request(values, farm, requester="U0000000001", channel=None, request_id="r-000001")
    alloc, _ = svc.create_request(request)
    rt.override(service=svc, farm=farm, clock=clock)
    logs: list[str] = []
    server = make_server("127.0.0.1", 0, function_app(logs), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = mint(alloc.ir, "U0000000001", expiry(svc.context.get(alloc.ir), clock.now()), TOKEN_KEY.encode())
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_port}", "ir": alloc.ir, "token": token}), flush=True)
    sys.stdin.readline()
    server.shutdown()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_rss_mb": round(peak_mb, 1), "log": logs[-3:]}), flush=True)


def upload_end_to_end(path: Path) -> dict[str, Any]:
    """One upload of `path` through the token endpoint: the CLI's wall time, the function's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="gpufarm-bench-s3-") as work:
        port_file = Path(work) / "port"
        s3 = subprocess.Popen([sys.executable, __file__, "--serve", "s3", str(port_file)])
        function = None
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start")
                time.sleep(0.1)
            s3_url = f"http://127.0.0.1:{port_file.read_text()}"
            function = subprocess.Popen(
                [sys.executable, __file__, "--serve", "function", s3_url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert function.stdin is not None and function.stdout is not None
            ready = json.loads(function.stdout.readline())
            # A researcher's process: their shell's basics, the token and the URL; no key, secret or credential.
            env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
            env.update(GPUFARM_UPLOAD_TOKEN=ready["token"], GPUFARM_API_URL=ready["url"])
            args = [sys.executable, "-m", "gpufarm", "profile", "upload", str(path), "--ir", f"IR-{ready['ir']}"]
            started = time.perf_counter()
            done = subprocess.run(
                [*args, "--name", "bench", "--batch-size", "32"], env=env, capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - started
            function.stdin.write("stop\n")
            function.stdin.flush()
            measured = json.loads(function.stdout.readline())
            if done.returncode != 0:
                raise RuntimeError(f"the upload failed: {done.stderr.strip()[-300:]}")
            steps = int(done.stdout.split(": ", 1)[1].split(" steps", 1)[0])
            return {"seconds": round(elapsed, 2), "peak_rss_mb": measured["peak_rss_mb"], "steps": steps}
        finally:
            for process in (function, s3):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,200", help="trace sizes in MB, comma-separated")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, metavar=("WHAT", "ARG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        sys.path.insert(0, str(ROOT / "tests"))
        if args.serve[0] == "s3":
            serve_s3(Path(args.serve[1]))
        else:
            serve_function(args.serve[1])
        return 0
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return 0
    ok = True
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="gpufarm-profile-bench-") as work:
        for size in sizes:
            path = Path(work) / f"trace-{size}mb.json"
            events = synthesise(path, size)
            print(f"{size} MB trace: {path.stat().st_size / 1e6:.1f} MB, {events:,} events (fixture replicated)")
            for mode in ("analysis", "upload"):
                result = _in_child(mode, path) if mode == "analysis" else upload_end_to_end(path)
                what = "peak RSS" if mode == "analysis" else "function's peak RSS"
                print(
                    f"  {mode:8s} {result['seconds']:7.2f} s  {what} {result['peak_rss_mb']:7.1f} MB  "
                    f"{result['steps']:,} steps"
                )
                if mode == "upload" and size >= 200:
                    ok = ok and result["seconds"] <= GOAL_S and result["peak_rss_mb"] <= GOAL_MB
        if sizes:
            print(
                f"goal (200 MB uploaded end to end in <= {GOAL_S:.0f} s, the analysing process within {GOAL_MB} MB): "
                f"{'met' if ok else 'NOT met'}"
            )
        hostile_ok = True
        for what, path in hostile_traces(Path(work)):
            result = _in_child("hostile", path)
            print(
                f"hostile: {what} ({path.stat().st_size:,} bytes): {result['seconds']:.2f} s "
                f"(goal <= {HOSTILE_GOAL_S:.0f} s), peak RSS {result['peak_rss_mb']:.1f} MB; "
                f"{'refused: ' + result['refused'] if result['refused'] else 'NOT refused'}"
            )
            hostile_ok = hostile_ok and bool(result["refused"]) and result["seconds"] <= HOSTILE_GOAL_S
            hostile_ok = hostile_ok and result["peak_rss_mb"] <= GOAL_MB
    print(f"goal (each hostile trace refused in <= {HOSTILE_GOAL_S:.0f} s): {'met' if hostile_ok else 'NOT met'}")
    return 0 if ok and hostile_ok else 1


def _in_child(mode: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    sys.exit(main())
