"""The Slack page walked in a real browser: request → approval → allocation DM → idle warning → Keep → release.

Each step is what a person does on `http://127.0.0.1:<port>/slack` of the local host: choose who they are, type
`/gpu help` (an answer only they see), fill the request form `/gpu request` opens (a bad field refused where it is),
click the operators' Approve, read the DM, click Keep on the idle warning and Release (with its confirmation) on the
App Home tab. Everything goes the real way: the page asks the sandbox to send the signed
command, click or event to the ingress, and shows what the functions put into the workspace. The only thing that
is not a click is the idle monitor's alert, posted to the idle alert's Function URL as Datadog would post it.

Used by tests/integration/test_slack_page_browser.py and `benchmarks/slack_page.py` (which times each step and
writes the screenshots into docs/screenshots/).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import BOB, DANA

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

# The request form as bob fills it: 16 H100, beyond his team's quota, so an operator decides.
FORM = {
    "gpu_model": "H100",
    "gpu_count": "16",
    "environment": "onprem-hpc",
    "team": "vision",
    "project": "vit",
    "duration_days": "7",
}
SELECTS = frozenset({"gpu_model", "environment", "team"})
STEP_TIMEOUT_S = 30.0
# Shown as a Slack user sees them: the research channel and the operators' channel of the demo's workspace.
RESEARCH = "ml-research"
OPERATORS = "gpu-ops"


class WalkError(AssertionError):
    """A step of the walk did not show what it should."""


@dataclass
class Walk:
    """What the walk did: the lease, each step's seconds, the screenshots taken, the page's console errors."""

    ir: int | None = None
    steps: list[tuple[str, float]] = field(default_factory=list)
    screenshots: dict[str, bytes] = field(default_factory=dict)
    console_errors: list[str] = field(default_factory=list)


def walk(page: Page, farm: LocalFarm, *, screenshots: bool = True) -> Walk:
    """Drive the page through the lease's life; WalkError naming the step that did not happen."""
    from playwright.sync_api import Error as PlaywrightError

    done = Walk()

    def step(name: str, action: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            action()
        except PlaywrightError as exc:  # a timeout too: playwright's TimeoutError is one
            raise WalkError(f"{name}: {type(exc).__name__}: {exc}") from None
        done.steps.append((name, round(time.perf_counter() - started, 3)))

    def shot(name: str) -> None:
        if screenshots:
            done.screenshots[name] = page.screenshot(type="png")

    step("open the page as bob", lambda: _open(page, farm, BOB.id))
    step("bob asks /gpu help in #ml-research; the answer is his alone", lambda: _help(page))
    step("bob fills the request form (a bad project refused on its field)", lambda: _request(page, done))
    ir = done.ir
    assert ir is not None
    step("dana (who sees none of bob's answers) approves on the operators' card", lambda: _approve(page, farm, ir))
    step("bob reads the allocation DM", lambda: _allocation_dm(page, ir))
    shot("slack-page")
    step("the idle monitor warns; bob sees Keep in the DM", lambda: _idle_warning(page, farm, ir))
    step("bob clicks Keep", lambda: _keep(page, farm, ir))
    step("bob opens the Home tab", lambda: _home(page, ir))
    shot("slack-home")
    step("bob releases from the Home tab", lambda: _release(page, farm, ir))
    return done


# -- the steps ---------------------------------------------------------------------------------------------------


def _open(page: Page, farm: LocalFarm, user: str) -> None:
    page.goto(f"{farm.base_url}/slack?user={user}", wait_until="load")
    # A locator, not a script: the page's Content-Security-Policy allows no evaluated strings.
    page.locator("body[data-rendered='true']").wait_for(state="attached", timeout=STEP_TIMEOUT_S * 1000)
    page.locator(f"#channels button[data-channel='{RESEARCH}']").click()


def _help(page: Page) -> None:
    page.fill("#box", "/gpu help")
    page.press("#box", "Enter")
    answer = _message(page, "/gpu request")
    if "Only visible to you" not in answer.inner_text():
        raise WalkError("the help answer is not shown as an ephemeral message")


def _request(page: Page, done: Walk) -> None:
    """The bare command opens the request form; a bad project is refused on its field; the fixed form is sent."""
    page.fill("#box", "/gpu request")
    page.press("#box", "Enter")
    page.locator("#overlay").wait_for(state="visible", timeout=STEP_TIMEOUT_S * 1000)
    for block, value in FORM.items():
        control = page.locator(f"#in-{block}")
        if block in SELECTS:
            control.select_option(value)
        else:
            control.fill(value)
    page.fill("#in-project", "VIT KO!")
    page.locator("#modal-submit").click()
    error = page.locator("#modal .bk-error")
    error.wait_for(timeout=STEP_TIMEOUT_S * 1000)
    page.fill("#in-project", FORM["project"])
    page.locator("#modal-submit").click()
    page.locator("#overlay").wait_for(state="hidden", timeout=STEP_TIMEOUT_S * 1000)
    # A form has no response_url: the answer comes by DM.
    page.locator("#open-app").click()
    page.locator("#tab-messages").click()
    answer = _message(page, "Sent to the GPU operators")
    done.ir = ir_in(answer.inner_text())
    if done.ir is None:
        raise WalkError(f"no IR in the answer: {answer.inner_text()[:200]}")


def _approve(page: Page, farm: LocalFarm, ir: int) -> None:
    page.select_option("#who", DANA.id)
    # Dana, in the channel where bob asked for help, does not see the answer only he was shown.
    page.locator(f"#channels button[data-channel='{RESEARCH}']").click()
    page.locator("#messages article.ephemeral").first.wait_for(state="detached", timeout=STEP_TIMEOUT_S * 1000)
    page.locator(f"#channels button[data-channel='{OPERATORS}']").click()
    card = _message(page, f"IR-{ir}", has_button="gpu_approve")
    card.locator("button[data-action-id='gpu_approve']").click()
    _until(lambda: farm.allocation(ir).phase is Phase.ALLOCATED, f"IR-{ir} allocated after the approval")


def _allocation_dm(page: Page, ir: int) -> None:
    page.select_option("#who", BOB.id)
    page.locator("#open-app").click()
    page.locator("#tab-messages").click()
    _message(page, f"IR-{ir} is allocated")


def _idle_warning(page: Page, farm: LocalFarm, ir: int) -> None:
    token = {"X-Gpufarm-Token": farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
    alert = {"alert_transition": "Triggered", "alert_scope": f"ir:ir-{ir}", "alert_id": "1"}
    status, _ = farm.post("/fn/idle_alert/", alert, token)
    if status != 202:
        raise WalkError(f"the idle alert was answered {status}")
    _message(page, f"IR-{ir}", has_button="gpu_keep")


def _keep(page: Page, farm: LocalFarm, ir: int) -> None:
    warning = _message(page, f"IR-{ir}", has_button="gpu_keep")
    warning.locator("button[data-action-id='gpu_keep']").click()
    _until(lambda: farm.allocation(ir).phase is Phase.ALLOCATED, f"IR-{ir} kept")
    _message(page, "kept")


def _home(page: Page, ir: int) -> None:
    page.locator("#tab-home").click()
    home = page.locator(".home-surface")
    home.filter(has_text=f"IR-{ir}").wait_for(timeout=STEP_TIMEOUT_S * 1000)
    for expected in ("Live leases", "Extend", "Release", "Your teams' quota and budget"):
        if expected not in home.inner_text():
            raise WalkError(f"the Home does not show {expected!r}")


def _release(page: Page, farm: LocalFarm, ir: int) -> None:
    page.locator(f".home-surface [data-block-id='home:{ir}'] button[data-action-id='gpu_release']").click()
    page.locator("#confirm-overlay").wait_for(state="visible", timeout=STEP_TIMEOUT_S * 1000)
    page.locator("#confirm-ok").click()
    _until(lambda: farm.allocation(ir).state is State.RESOLVED, f"IR-{ir} released")
    page.locator(".home-surface").filter(has_text="You hold no GPUs now.").wait_for(timeout=STEP_TIMEOUT_S * 1000)


# -- helpers -----------------------------------------------------------------------------------------------------


def _message(page: Page, text: str, *, has_button: str | None = None) -> Locator:
    """The newest message of the open conversation showing `text` (and a button of `has_button`), once shown."""
    found = page.locator("#messages article.message").filter(has_text=text)
    if has_button:
        found = found.filter(has=page.locator(f"button[data-action-id='{has_button}']"))
    last = found.last
    last.wait_for(timeout=STEP_TIMEOUT_S * 1000)
    return last


def _until(check: Callable[[], Any], what: str, timeout_s: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise WalkError(f"timed out waiting for {what}")
