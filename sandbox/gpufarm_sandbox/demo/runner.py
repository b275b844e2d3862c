"""`gpufarm demo`: start the local environment in-process and run every stage, checking each step."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterable

import click

from gpufarm_sandbox.cli import datadog_quirks_option
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.emulator.quirks import describe_quirks

# Where `gpufarm demo` reads its Datadog quirk modes when --datadog-quirks is not given (`GPUFARM_DEMO_QUIRKS=all
# make demo`).
QUIRKS_ENV = "GPUFARM_DEMO_QUIRKS"

# Stages run in this order; each is `run(ctx: DemoContext) -> None` in its own module.
STAGES: tuple[tuple[str, str], ...] = (
    ("foundation: incidents, host tags and metrics through the adapters", "gpufarm_sandbox.demo.foundation_stage"),
    ("lifecycle: request, approve, allocate, release from Slack", "gpufarm_sandbox.demo.lifecycle_stage"),
    ("node agents: NVML metrics attributed to each IR", "gpufarm_sandbox.demo.metrics_stage"),
    ("membership, charging what is held, lease semantics", "gpufarm_sandbox.demo.membership_stage"),
    ("idle reclaim and expiry: agent metrics through gpufarm's own monitors", "gpufarm_sandbox.demo.idle_stage"),
    ("GPU slicing: two leases on one MIG host, only the idle one reclaimed", "gpufarm_sandbox.demo.slicing_stage"),
    ("governance: a reject's reason, bounded keeps, an exemption", "gpufarm_sandbox.demo.governance_stage"),
    ("fair share: the team below its share served first, every wait says why", "gpufarm_sandbox.demo.fairshare_stage"),
    ("enforcement: a lease held by a real Slurm reservation", "gpufarm_sandbox.demo.enforce_stage"),
    ("inventory: clouds, no agent, a source skipped, the ledger", "gpufarm_sandbox.demo.inventory_stage"),
    ("profiler runs: a real trace on a lease, its page and metrics", "gpufarm_sandbox.demo.profile_stage"),
    ("the operators' daily digest: what needs an operator today", "gpufarm_sandbox.demo.digest_stage"),
    ("report: the month's GPU-hours as HTML and CSV", "gpufarm_sandbox.demo.report_stage"),
    (
        "chargeback: the month's file for finance, equal to the ledger to the cent; the capacity outlook",
        "gpufarm_sandbox.demo.chargeback_stage",
    ),
    ("budget: a budget in money crosses 80 %, told once with its forecast", "gpufarm_sandbox.demo.budget_stage"),
    ("lending: a borrowed lease preempted on notice after its first hour", "gpufarm_sandbox.demo.lending_stage"),
    ("quota change: asked in chat, approved, applied at once, ended", "gpufarm_sandbox.demo.quota_change_stage"),
    # Last: its clock jump to the window's start ends every lease the stages above left.
    (
        "reservations: booked, refused with the nearest window, honoured, a no-show",
        "gpufarm_sandbox.demo.reservation_stage",
    ),
)


def run_demo(
    out: Callable[[str], None] = click.echo,
    *,
    stages: tuple[tuple[str, str], ...] = STAGES,
    quirks: str | Iterable[str] = (),
) -> DemoContext:
    """Run the stages against a fresh local environment whose sandbox plays the Datadog quirk modes `quirks`;
    returns the context with its checks and failures."""
    from gpufarm.config import Settings
    from gpufarm_sandbox.localhost import start_local

    started = time.perf_counter()
    with start_local(port=0, profiles=True, quirks=quirks) as env:
        ctx = DemoContext(sandbox=env.sandbox, base_url=env.url, settings=Settings(), out=out, local=env)
        out(f"gpufarm demo: sandbox and functions on {env.url}")
        out(f"datadog quirks: {describe_quirks(env.sandbox.quirks)}")
        for title, module_name in stages:
            out(f"\n#### {title}")
            run: Callable[[DemoContext], None] = importlib.import_module(module_name).run
            with ctx.step(f"stage {module_name.rsplit('.', 1)[-1]}"):
                run(ctx)
    elapsed = time.perf_counter() - started
    out(f"\n{ctx.checks - len(ctx.failures)}/{ctx.checks} checks passed in {elapsed:.1f}s")
    for failure in ctx.failures:
        out(f"  FAILED: {failure}")
    return ctx


@click.command()
@datadog_quirks_option(envvar=QUIRKS_ENV)
def demo(quirks: frozenset[str]) -> None:
    """Run the whole lifecycle on a local sandbox (no cloud account needed); exit 0 only if every check passed.

    Without --datadog-quirks, the quirk modes come from GPUFARM_DEMO_QUIRKS.
    """
    ctx = run_demo(quirks=quirks)
    sys.exit(1 if ctx.failures or ctx.checks == 0 else 0)
