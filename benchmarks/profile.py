"""Profiler upload benchmark: analysis and upload time and peak RSS for 10 MB and 200 MB traces, and how fast
hostile traces are refused.

The traces are synthesised from the real torch.profiler fixture (tests/fixtures/profiler/cpu_mlp.json): its
events are replicated, each copy shifted past the previous one in time and its ProfilerStep# spans renumbered,
until the file reaches the size. So the mix of events is the profiler's own; only the length of the run is made
up. Each size runs in a fresh child process, so its peak RSS (ru_maxrss) is that upload's alone:

- analysis: reading and analysing the trace (gpufarm.profiling.reader + analysis), the part that must fit 1 GB;
- upload: the whole `gpufarm profile upload` path (lease check, analysis, gzip, both S3 objects under moto,
  the incident record through the one writer, the metrics), against in-memory Datadog fakes.

The hostile traces (each small on disk) break one per-event bound of gpufarm.profiling.reader each: nesting
200,000 deep, one 200 MB string in a gzip (of letters, and of escaped quotes), 3 million tiny events in a gzip,
one event of 10 MB, and 100 million values under a key that is not traceEvents. Each is read in a fresh process
like the analysis above and must be refused (ValidationFailed, exit 2 from `gpufarm profile upload`).

    .venv/bin/python benchmarks/profile.py            # 10 MB and 200 MB, then the hostile traces
    .venv/bin/python benchmarks/profile.py --sizes 10  # one size, in MB
    .venv/bin/python benchmarks/profile.py --sizes ''  # only the hostile traces

Goals: a 200 MB trace analysed in at most 60 s within 1 GB (issue 14); each hostile trace refused in at most 5 s
within the same 1 GB (issue 22).
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
    if mode == "analysis":
        from gpufarm.profiling import reader
        from gpufarm.profiling.analysis import analyse

        figures = analyse(reader.events(path), batch_size=32)
    else:
        figures = _upload(path)
    elapsed = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "seconds": round(elapsed, 2),
        "peak_rss_mb": round(peak_mb, 1),
        "steps": figures.steps,
        "events": figures.events,
    }


def _upload(path: Path) -> Any:
    import boto3
    from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics
    from moto import mock_aws

    from gpufarm.adapters.profile_store import S3ProfileStore
    from gpufarm.config import Settings
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.governance.policy import build_request
    from gpufarm.core.service import GpuFarm
    from gpufarm.profiling.links import LinkSigner
    from gpufarm.profiling.upload import upload

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    farm = parse_farm(FARM_YAML)
    svc = GpuFarm(
        incidents=incidents, hosts=FakeHosts(), chat=FakeChat(), clock=clock, farm=farm, metrics=FakeMetrics()
    )
    values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm"}
    alloc, _ = svc.create_request(
        build_request(values, farm, requester="U0000000001", channel=None, request_id="r-000001")
    )
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bench-profiles")
        store = S3ProfileStore(Settings(), "bench-profiles", client=s3)
        (done,) = upload(
            svc.context,
            store,
            LinkSigner(b"bench"),
            pages_url="http://127.0.0.1/pages",
            retention_days=30,
            ir=alloc.ir,
            actor="U0000000001",
            paths=[path],
            name="bench",
            batch_size=32,
        )
    return done.figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,200", help="trace sizes in MB, comma-separated")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
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
                result = _in_child(mode, path)
                print(
                    f"  {mode:8s} {result['seconds']:7.2f} s  peak RSS {result['peak_rss_mb']:7.1f} MB  "
                    f"{result['steps']:,} steps"
                )
                if mode == "analysis" and size >= 200:
                    ok = ok and result["seconds"] <= GOAL_S and result["peak_rss_mb"] <= GOAL_MB
        if sizes:
            print(f"goal (200 MB analysed in <= {GOAL_S:.0f} s within {GOAL_MB} MB): {'met' if ok else 'NOT met'}")
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
