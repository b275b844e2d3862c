"""Demo stage "enforcement": a lease on cloud-aws (`enforce: kubernetes`) labels and taints its host's Node
(enforce_kube), and a lease on the HPC pool (`enforce: slurm`) is held by a real Slurm reservation.

With Debian's slurm-wlm and munge installed (and run as root), it starts a single-controller Slurm on loopback
whose nodes are the HPC pool's hosts (gpufarm_sandbox.slurmlocal), and runs the enforcer the node distribution
ships (`gpufarm-node enforce slurm`, gpufarm_node.enforce) against the local host's Datadog. alice asks for
8 H100 on onprem-hpc; her DM says how to submit; one enforcer run later `scontrol show reservation` shows
gpufarm-ir-<n> on her host for her cluster user; her job runs in it and another user's is refused. She releases
the lease; the next run deletes the reservation and the other user's job runs on the host. alice's cluster user is
played by the local account `daemon`, the other user by `nobody`. Without Slurm the stage says so and the demo
goes on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_node.datadog import DatadogTarget
from gpufarm_node.enforce.config import SlurmNames, load_slurm_names
from gpufarm_node.enforce.datadog_io import DatadogIO
from gpufarm_node.enforce.run import SlurmEnforcer
from gpufarm_node.enforce.scontrol import Scontrol
from gpufarm_node.enforce.slurm_plan import reservation_name
from gpufarm_sandbox import slurmlocal
from gpufarm_sandbox.demo import enforce_kube
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, HOSTS

if TYPE_CHECKING:
    from gpufarm.config import Settings
    from gpufarm_sandbox.demo.context import DemoContext

POOL = "onprem-hpc"
NODES = tuple(name for name, _model, _gpus, pool, _cluster in HOSTS if pool == POOL)


def run(ctx: DemoContext) -> None:
    """The Kubernetes half; then allocate, enforce, submit, reclaim on Slurm, or say that Slurm is not installed."""
    if ctx.local is None:
        ctx.check(False, "the enforcement stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    settings = Settings()
    kube_farm = LocalFarm(ctx.base_url, ctx.local.host, settings)
    try:
        enforce_kube.play(ctx, kube_farm, settings)
    finally:
        kube_farm.close()
    reason = slurmlocal.missing()
    if reason:
        ctx.info(f"Slurm enforcement skipped: {reason}. The other stages run as before.")
        return
    farm = LocalFarm(ctx.base_url, ctx.local.host, settings)
    try:
        with slurmlocal.local_slurm(NODES) as slurm:
            names = load_slurm_names(ctx.local.host.root / "config" / "farm.example.yaml")
            names = SlurmNames(names.pools, {ALICE.id: slurmlocal.LEASE_USER}, names.accounts)
            ctx.info(f"a local Slurm with nodes {', '.join(NODES)}; alice's cluster user is {slurmlocal.LEASE_USER}")
            enforcer = SlurmEnforcer(
                _datadog(settings), Scontrol(env=slurm.env), names, _datadog(settings), cluster_tag="hpc"
            )
            _Stage(ctx, farm, slurm, enforcer).play()
    finally:
        farm.close()


def _datadog(settings: Settings) -> DatadogIO:
    api = settings.datadog_api_key.get_secret_value() if settings.datadog_api_key else ""
    app = settings.datadog_app_key.get_secret_value() if settings.datadog_app_key else None
    return DatadogIO(DatadogTarget(settings.datadog_base_url(), api, app), type_name=settings.incident_type)


class _Stage:
    def __init__(self, ctx: DemoContext, farm: LocalFarm, slurm: slurmlocal.LocalSlurm, enforcer: SlurmEnforcer):
        self.ctx, self.farm, self.slurm, self.enforcer = ctx, farm, slurm, enforcer

    def play(self) -> None:
        ir = self.allocate()
        if ir is None:
            return
        host = self.farm.allocation(ir).hosts[0]
        self.enforced(ir, host)
        self.jobs(ir, host)
        self.reclaimed(ir, host)

    def _show(self, text: str) -> None:
        self.ctx.info("$ scontrol show reservation --oneliner")
        for line in text.splitlines() or ["(nothing)"]:
            self.ctx.info(f"  {line}")

    def enforce(self) -> float:
        """One enforcer run; its seconds."""
        started = time.perf_counter()
        report = self.enforcer.run_once()
        for line in report.lines():
            self.ctx.info(f"enforcer: {line}")
        self.ctx.check(report.converged, "the enforcer's run converged", report.error or "")
        return time.perf_counter() - started

    def allocate(self) -> int | None:
        allocated: int | None = None
        with self.ctx.step(f"alice: /gpu request 8 H100 env={POOL} (a pool with enforce: slurm)"):
            self.farm.slash(ALICE, f"request 8 H100 project=slurm-demo team=nlp env={POOL} days=3")
            self.farm.settle()
            ir = ir_in(shown(self.farm.answer(ALICE, "/slurm-demo`")))
            if ir is None:
                self.ctx.check(False, "alice's request got an IR")
                return None
            lease: int = ir
            ok = self.farm.wait_for(lambda: self.farm.allocation(lease).phase is Phase.ALLOCATED)
            if not self.ctx.check(ok, f"IR-{ir} is allocated in Datadog", ", ".join(self.farm.allocation(ir).hosts)):
                return None
            hint = f"--reservation={reservation_name(ir)}"
            dm = self.farm.messages(user=ALICE.id, kind="dm", contains=hint)
            self.ctx.check(bool(dm), "the allocation DM says how to submit", f"sbatch {hint} …")
            allocated = ir
        return allocated

    def enforced(self, ir: int, host: str) -> None:
        with self.ctx.step("gpufarm-node enforce slurm: one run"):
            seconds = self.enforce()
            text = self.slurm.reservations()
            self._show(text)
            self.ctx.info("(EndTime: the lease's expiry by the sandbox's clock, which earlier stages may move on)")
            name = reservation_name(ir)
            ok = f"ReservationName={name} " in text and f"Nodes={host} " in text and "State=ACTIVE" in text
            self.ctx.check(ok, f"{name} is active on {host} for {slurmlocal.LEASE_USER}", f"{seconds:.2f}s run")

    def jobs(self, ir: int, host: str) -> None:
        name = reservation_name(ir)
        with self.ctx.step("jobs: the lease's user runs in the reservation, another user is refused"):
            accepted, job = self.slurm.submit(slurmlocal.LEASE_USER, name)
            state = self.slurm.wait_job(job) if accepted else job
            self.ctx.check(state == "COMPLETED", f"{slurmlocal.LEASE_USER}'s job in {name} ran", f"job {job}: {state}")
            refused, answer = self.slurm.submit(slurmlocal.OTHER_USER, name)
            self.ctx.check(
                not refused and "Access denied" in answer, f"{slurmlocal.OTHER_USER}'s job is refused", answer
            )

    def reclaimed(self, ir: int, host: str) -> None:
        with self.ctx.step(f"alice releases IR-{ir}; the next run frees {host}"):
            self.farm.slash(ALICE, f"release IR-{ir} now")
            self.farm.settle()
            ended = self.farm.wait_for(lambda: self.farm.allocation(ir).phase is Phase.RECLAIMED)
            self.ctx.check(ended, f"IR-{ir} is reclaimed in Datadog")
            self.enforce()
            text = self.slurm.reservations()
            self._show(text)
            self.ctx.check(reservation_name(ir) not in text, f"{reservation_name(ir)} is gone")
            accepted, job = self.slurm.submit(slurmlocal.OTHER_USER, node=host)
            state = self.slurm.wait_job(job) if accepted else job
            self.ctx.check(state == "COMPLETED", f"{slurmlocal.OTHER_USER}'s job runs on {host} again", state)
