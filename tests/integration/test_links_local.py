"""Links end to end on the local host: the allocation DM and `/gpu status` of a lease link to its incident and to
the project dashboard `gpufarm datadog apply` made on the sandbox (its id found by the runtime through the
dashboard list), scoped by Datadog's template variables; both links open locally, the dashboard page with the
lease's team, project and IR chosen."""

from __future__ import annotations

import html
import re
import urllib.request
from typing import Any

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.setup.dashboards import dashboard_key
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE

pytestmark = pytest.mark.integration

LINK = re.compile(r"<(https?://[^|>]+)\|([^>]+)>")


def test_a_leases_messages_link_to_its_incident_and_project_dashboard(farm: LocalFarm) -> None:
    [project] = [d["id"] for d in farm.admin.list_dashboards() if dashboard_key(d) == "project"]
    farm.slash(ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=3")
    assert farm.settle()
    answer = farm.answer(ALICE, "IR-")
    assert answer is not None
    ir = ir_in(answer["text"])
    assert ir is not None and farm.allocation(ir).phase is Phase.ALLOCATED
    farm.slash(ALICE, f"status IR-{ir}")
    assert farm.settle()

    dashboard = f"{farm.base_url}/dashboard/{project}?tpl_var_team=nlp&tpl_var_project=llm-ko&tpl_var_ir=ir-{ir}"
    incident = f"{farm.base_url}/incidents/{ir}"
    for says in ("is allocated", "Phase: `allocated`"):
        message = farm.answer(ALICE, says)
        assert message is not None, says
        links = dict(LINK.findall(_context(message)))
        assert links == {incident: f"Incident IR-{ir}", dashboard: "Project dashboard"}, (says, links)

    status, page = _open(incident)
    assert status == 200 and f"IR-{ir}" in page
    status, page = _open(dashboard)
    assert status == 200 and "gpufarm: project" in page
    # The page has the lease's variables chosen: its team picked, its project and IR filled in.
    assert '<option value="nlp" selected>' in page
    assert 'name="project" value="llm-ko"' in page and f'name="ir" value="ir-{ir}"' in page
    assert "Bad request" not in html.unescape(page)


def _context(message: dict[str, Any]) -> str:
    """The text of a Slack message's context blocks (where the lease's links are)."""
    blocks = [b for b in message.get("blocks") or [] if b.get("type") == "context"]
    return "\n".join(str(e.get("text", "")) for b in blocks for e in b.get("elements") or [])


def _open(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()
