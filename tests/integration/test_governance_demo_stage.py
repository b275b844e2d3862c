"""The governance demo stage on the local host: a reject with its reason, a lease kept to its maximum and then
reclaimed, an operator exemption, and the lease's whole history as `/gpu status` prints it."""

from __future__ import annotations

import pytest

from gpufarm.config import Settings
from gpufarm_sandbox.demo import governance_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration


def test_reject_reasons_bounded_keeps_exemptions_and_the_history(local: LocalEnv, farm: LocalFarm) -> None:
    lines: list[str] = []
    ctx = DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append, local=local)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    for fact in (
        "the team's holdings against its quota",
        "the requester reads who and why",
        "the card now says who decided and why",
        "Keep refused: why and whom to ask",
        "reclaimed, reason idle",
        "a researcher cannot exempt a lease",
        "no warning, no reclaim while exempt",
        "every step is there, with who and when",
    ):
        assert f"[ok ] {fact}" in output, output
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]
