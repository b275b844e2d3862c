"""Profiler upload benchmark: analysis and upload time and peak RSS for 10 MB and 200 MB traces.

The traces are synthesised from the real torch.profiler fixture (tests/fixtures/profiler/cpu_mlp.json): its
events are replicated, each copy shifted past the previous one in time and its ProfilerStep# spans renumbered,
until the file reaches the size. So the mix of events is the profiler's own; only the length of the run is made
up. Each size runs in a fresh child process, so its peak RSS (ru_maxrss) is that upload's alone:

- analysis: reading and analysing the trace (gpufarm.profiling.reader + analysis), the part that must fit 1 GB;
- upload: the whole `gpufarm profile upload` path (lease check, analysis, gzip, both S3 objects under moto,
  the incident record through the one writer, the metrics), against in-memory Datadog fakes.

    .venv/bin/python benchmarks/profile.py            # 10 MB and 200 MB
    .venv/bin/python benchmarks/profile.py --sizes 10  # one size, in MB

Goal (issue 14): a 200 MB trace analysed in at most 60 s within 1 GB.
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
            svc,
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
    with tempfile.TemporaryDirectory(prefix="gpufarm-profile-bench-") as work:
        for size in (int(s) for s in args.sizes.split(",")):
            path = Path(work) / f"trace-{size}mb.json"
            events = synthesise(path, size)
            print(f"{size} MB trace: {path.stat().st_size / 1e6:.1f} MB, {events:,} events (fixture replicated)")
            for mode in ("analysis", "upload"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True, check=True
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"  {mode:8s} {result['seconds']:7.2f} s  peak RSS {result['peak_rss_mb']:7.1f} MB  "
                    f"{result['steps']:,} steps"
                )
                if mode == "analysis" and size >= 200:
                    ok = ok and result["seconds"] <= GOAL_S and result["peak_rss_mb"] <= GOAL_MB
    print(f"goal (200 MB analysed in <= {GOAL_S:.0f} s within {GOAL_MB} MB): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
