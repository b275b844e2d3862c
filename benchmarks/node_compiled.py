"""The node agent pure and with its hot modules compiled by mypyc, side by side on benchmarks/node.py's fake host.

    .venv/bin/python benchmarks/node_compiled.py [--rounds 3] [--cycles 40] [--sets all,snapshot,...] [--json]

Builds each set of gpufarm-node modules below with mypyc (the dev environment's, with the C compiler on PATH) into
a temporary copy of the package, then, round by round, runs `benchmarks/node.py --runs 1 --json` once per build in
fresh processes (the pure package first on even rounds and last on odd ones, so a machine that grows busier favours
none), the compiled build first on the import path (its extension modules load before the .py beside them). Each
node.py run measures Datadog's nvml check and the NVML floor in the same run, so every ratio is paired with its own
anchor. Prints, per build, the agent's own CPU per cycle at the default 60 s flush, agent / check and agent / floor
(median and spread over rounds), and each build's difference from the pure agent of the same round: a set that
compiles one phase's modules shows what compiling that phase changes.

Not compiled: gpufarm_node.sender (its protocols derive from one another and its float-repr cache from dict, which
mypyc refuses: the push's payload building stays pure here), the fake NVML and everything tests monkeypatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODE = Path(__file__).resolve().parent.parent / "node"
NODE_BENCH = Path(__file__).resolve().parent / "node.py"
FLUSH = "flush every 60 s (default)"
# The cycle's phases by the modules that do them (benchmarks/node_phases.py names the same phases).
SETS: dict[str, list[str]] = {
    "snapshot": ["nvml/source.py", "nvml/fields.py", "nvml/device.py"],
    "series building": ["collect.py", "device_values.py", "series_tags.py"],
    "attribution": ["attribution.py", "tags.py"],
    "snapshot objects": ["model.py"],
    "all": [
        "nvml/source.py",
        "nvml/fields.py",
        "nvml/device.py",
        "model.py",
        "device_values.py",
        "collect.py",
        "series_tags.py",
        "attribution.py",
        "tags.py",
        "squatters.py",
    ],
}
MYPY_CONFIG = """[mypy]
python_version = 3.11
strict = True
[mypy-pynvml,datadog_api_client.*,kubernetes.*,zstandard,grpc.*]
ignore_missing_imports = True
"""


def build(modules: list[str], into: Path) -> float:
    """Copy the package into `into` and compile `modules` there in place; returns the compile's wall seconds."""
    shutil.copytree(NODE / "gpufarm_node", into / "gpufarm_node", ignore=shutil.ignore_patterns("__pycache__"))
    (into / "mypy.ini").write_text(MYPY_CONFIG)
    mypyc = Path(sys.executable).with_name("mypyc")
    started = time.monotonic()
    done = subprocess.run(
        [str(mypyc), "--config-file", "mypy.ini", *(f"gpufarm_node/{m}" for m in modules)],
        cwd=into,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"mypyc failed for {modules}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.monotonic() - started


def measure(path: Path | None, cycles: int) -> dict[str, float]:
    """One node.py run (--runs 1) with `path` first on the import path (None: the pure package)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    done = subprocess.run(
        [sys.executable, str(NODE_BENCH), "--runs", "1", "--cycles", str(cycles), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    run = figures[FLUSH]["socket"][0]
    agent = statistics.mean(run["cpu_ms"])
    floor = statistics.mean(run["floor_ms"])
    check = statistics.mean(figures["nvml_check"][0]["cpu_ms"])
    return {
        "agent_ms": agent,
        "check_ms": check,
        "floor_ms": floor,
        "vs_check": agent / check,
        "vs_floor": agent / floor,
    }


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    """Build, measure alternating, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of: {', '.join(SETS)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SETS]
    if unknown:
        parser.error(f"unknown sets: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="gpufarm-node-mypyc-") as tmp:
        builds: dict[str, Path | None] = {"pure": None}
        compile_s: dict[str, float] = {}
        for name in chosen:
            into = Path(tmp) / name.replace(" ", "-")
            compile_s[name] = build(SETS[name], into)
            builds[name] = into
        results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
        order = list(builds)
        for index in range(args.rounds):
            for name in order if index % 2 == 0 else order[::-1]:
                results[name].append(measure(builds[name], args.cycles))
    if args.json:
        print(json.dumps({"compile_s": compile_s, "results": results}))
        return
    print(
        f"gpufarm-node pure and mypyc-compiled, {args.rounds} rounds of benchmarks/node.py --runs 1 --cycles "
        f"{args.cycles}, 60 s flush, median (min-max) over rounds"
    )
    pure = [r["agent_ms"] for r in results["pure"]]
    for name, runs in results.items():
        agent = [r["agent_ms"] for r in runs]
        modules = "the pure package" if name == "pure" else ", ".join(SETS[name])
        built = "" if name == "pure" else f", compiled in {compile_s[name]:.0f} s"
        print(f"\n  {name} ({modules}{built}):")
        print(f"    agent CPU per cycle: {_spread(agent)} ms; check {_spread([r['check_ms'] for r in runs])} ms")
        print(f"    agent / check: {_spread([r['vs_check'] for r in runs])}   (target <= 1.0)")
        print(f"    agent / floor: {_spread([r['vs_floor'] for r in runs], 1)}   (target <= 4)")
        if name != "pure":
            delta = [a - p for a, p in zip(agent, pure, strict=True)]
            print(f"    against the pure agent of the same round: {_spread(delta)} ms")


if __name__ == "__main__":
    main()
