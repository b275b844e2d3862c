"""Profiler runs through `gpufarm local`: the demo's profile stage on a fresh local host with moto's S3 server.

Alice gets an upload token through the sandbox's Slack (`/gpu profile-token`); the real CLI uploads a real
torch.profiler trace from another process holding only that token and GPUFARM_API_URL, through the local
profile_upload function (a forged token is exit 2); the page comes from the local profile_pages function for the
signed link (a forged one is refused), the metrics from the sandbox, the run from `/gpu status`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufarm.config import Settings
from gpufarm_sandbox.demo import profile_stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import start_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_profile_stage_uploads_a_real_trace_and_serves_its_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    lines: list[str] = []
    with start_local(port=0, setup=True, profiles=True) as env:
        farm = LocalFarm(env.url, env.host, Settings())
        try:
            farm.seed_workspace()
            farm.seed_hosts()
        finally:
            farm.close()
        ctx = DemoContext(sandbox=env.sandbox, base_url=env.url, settings=Settings(), out=lines.append, local=env)
        profile_stage.run(ctx)
    assert ctx.failures == [], "\n".join(lines)
    assert ctx.checks >= 12
