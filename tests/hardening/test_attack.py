"""The hardening suite: forged Slack requests, fuzzed bodies into every Function URL, and secrets in what is left.

CI counts (1,000 forged, 10,000 fuzzed); benchmarks/hardening.py runs ten times as many and prints the figures.
"""

from __future__ import annotations

import pytest
from attack import Target, run_forgeries, run_fuzz

FORGED = 1_000
FUZZED = 10_000


def test_forged_slack_requests_are_all_refused_with_no_side_effect(target: Target) -> None:
    figures = run_forgeries(target, FORGED)
    assert figures["forged"] >= FORGED
    assert figures["accepted"] == 0, figures["examples"]
    assert figures["side_effects"] == {"incidents": 0, "messages": 0, "views": 0, "invocations": 0}
    assert figures["server_errors"] == 0 and figures["secrets_in_answers"] == 0, figures["examples"]
    assert set(figures["statuses"]) <= {400, 401, 413}


# The local host's worker threads draw on the global `random` (retry jitter) while hypothesis draws the next body in
# this thread; hypothesis takes that for a strategy using `random` and warns. The bodies do not depend on it.
# 10,000 bodies take ~40 s alone and over 100 s beside another test worker on two cores.
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzzed_bodies_into_every_function_url_never_break_a_handler(target: Target) -> None:
    figures = run_fuzz(target, FUZZED)
    examples = [e for run in figures["runs"] for e in run["examples"]]
    assert figures["sent"] >= FUZZED
    assert figures["server_errors"] == 0, examples
    assert figures["tracebacks"] == 0 and figures["dead_letters"] == 0, examples
    assert figures["half_written"] == []
    assert figures["secrets_in_answers"] == 0 and figures["secrets_at_rest"] == []
