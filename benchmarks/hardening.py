"""Hardening figures against `gpufarm local`: forged Slack requests, fuzzed Function URL bodies, secrets left behind.

The CI-sized checks are tests/hardening/test_attack.py (1,000 forged, 10,000 fuzzed); this runs `--scale` times
as many (default 10) with fresh random bodies, prints each figure beside its target and exits 1 when one misses:
- forged: requests with a wrong secret, an altered body, stale or future timestamps, missing or garbled headers,
  `v1=`, base64 signatures or bodies: accepted (target 0), side effects (incidents, messages, modals,
  invocations; target 0 each);
- fuzz: hypothesis bodies into every Function URL, signed and unsigned: answers >= 500, tracebacks (in answers or
  the host's invocation log), dead letters, half-written incidents (target 0 each);
- secrets: the signing secret, bot token, Datadog keys and webhook secret in any answer, Slack message or
  incident field of the run (target 0).

Run: .venv/bin/python benchmarks/hardening.py [--scale 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hardening"))

from attack import Target, ready_farm, run_forgeries, run_fuzz
from hypothesis.errors import HypothesisDeprecationWarning

from gpufarm.handlers import runtime
from gpufarm_sandbox.localhost import start_local

FORGED = 1_000
FUZZED = 10_000


def _line(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run both figures at `--scale` x the CI counts; 0 when every target holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object at the end")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the handlers log every refusal; the figures are what this prints
    # Worker threads draw on the global `random` while hypothesis draws a body: not a strategy using it.
    warnings.filterwarnings("ignore", category=HypothesisDeprecationWarning)
    out: dict[str, Any] = {}
    with start_local(port=0) as local:
        farm = ready_farm(local)
        target = Target(local, farm)
        try:
            forged = run_forgeries(target, FORGED * args.scale)
            out["forged"] = forged
            _line(
                f"forged Slack requests: {forged['forged']} sent, {forged['accepted']} accepted (target 0), "
                f"side effects {forged['side_effects']} (target 0 each), 5xx {forged['server_errors']}, "
                f"statuses {forged['statuses']}, {forged['seconds']} s"
            )
            fuzzed = run_fuzz(target, FUZZED * args.scale, derandomize=False)
            out["fuzz"] = fuzzed
            for run in fuzzed["runs"]:
                _line(
                    f"  fuzz {run['path']:24} {'signed' if run['signed'] else 'unsigned':8} {run['sent']:6d} sent, "
                    f"5xx {run['server_errors']}, statuses {run['statuses']}, {run['seconds']} s"
                )
            _line(
                f"fuzzed bodies: {fuzzed['sent']} sent, answers >= 500: {fuzzed['server_errors']} (target 0), "
                f"tracebacks {fuzzed['tracebacks']} (target 0), dead letters {fuzzed['dead_letters']}, "
                f"half-written incidents {len(fuzzed['half_written'])} (target 0)"
            )
            secrets = forged["secrets_in_answers"] + fuzzed["secrets_in_answers"] + len(fuzzed["secrets_at_rest"])
            out["secrets_found"] = secrets
            _line(
                f"secrets in answers, Slack messages and incident fields: {secrets} (target 0; "
                f"{len(target.secrets)} secret values searched)"
            )
        finally:
            farm.close()
            runtime.reset()
    ok = (
        out["forged"]["accepted"] == 0
        and not any(out["forged"]["side_effects"].values())
        and out["forged"]["server_errors"] == 0
        and out["fuzz"]["server_errors"] == 0
        and out["fuzz"]["tracebacks"] == 0
        and out["fuzz"]["dead_letters"] == 0
        and not out["fuzz"]["half_written"]
        and out["secrets_found"] == 0
    )
    out["ok"] = ok
    if args.json:
        _line(json.dumps(out, default=str))
    for example in out["forged"]["examples"] + [e for r in out["fuzz"]["runs"] for e in r["examples"]]:
        _line(f"  ! {example}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
