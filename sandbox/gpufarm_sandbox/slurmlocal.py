"""A real single-controller Slurm on loopback, in a temporary folder: munged, slurmctld and one slurmd per node.

For the tests, the demo and the benchmarks of the Slurm enforcer (gpufarm_node.enforce): Debian's `slurm-wlm` and
`munge`, run as root (slurmd starts jobs as their users) with a generated slurm.conf, free ports, state, logs and
the munge key under the folder, and nothing outside it touched. Each node is a slurmd of its own on 127.0.0.1
(`slurmd -N <name>`), so a lease of several hosts and a partial reclaim are real too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "sinfo")
# Two local accounts every Debian system has, standing for a lease's user and someone else.
LEASE_USER = "daemon"
OTHER_USER = "nobody"
START_TIMEOUT_S = 30.0
_CALL_TIMEOUT_S = 20.0


def missing() -> str | None:
    """Why a local Slurm cannot start here (not installed, not root, no such users), or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "a local Slurm runs its daemons as root (slurmd starts jobs as their users)"
    for user in (LEASE_USER, OTHER_USER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no local user {user!r} to run jobs as"
    return None


def _binary(name: str) -> str:
    found = shutil.which(name) or str(Path("/usr/sbin", name))
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalSlurm:
    """A running local Slurm: its folder, slurm.conf, node names and the environment its commands need."""

    root: Path
    nodes: tuple[str, ...]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment its commands run in (SLURM_CONF set), without changing this process's."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "TZ": os.environ.get("TZ", "UTC")}

    def call(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (scontrol, sbatch, squeue, sinfo ...) against this cluster."""
        return subprocess.run(  # noqa: S603 - Slurm's own binaries, arguments from the caller
            [_binary(args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=_CALL_TIMEOUT_S,
            env=self.env,
            check=check,
        )

    def reservations(self) -> str:
        """`scontrol show reservation --oneliner`."""
        return self.call("scontrol", "show", "reservation", "--oneliner").stdout.strip()

    def submit(
        self, user: str, reservation: str | None = None, *, node: str | None = None, command: str = "true"
    ) -> tuple[bool, str]:
        """Submit a job as `user` (sbatch --uid), in `reservation` and on `node` when given; (accepted, sbatch's
        answer: the job id, or why it was refused)."""
        args = ["sbatch", f"--uid={user}", "--chdir=/tmp", "--output=/dev/null", "--time=1", "--parsable"]
        args += [f"--reservation={reservation}"] if reservation else []
        args += [f"--nodelist={node}"] if node else []
        done = self.call(*args, f"--wrap={command}", check=False)
        return done.returncode == 0, (done.stdout or done.stderr).strip()

    def job_state(self, job_id: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED ...) as scontrol shows it."""
        text = self.call("scontrol", "show", "job", job_id.split(";", maxsplit=1)[0], "--oneliner", check=False).stdout
        for token in text.split():
            if token.startswith("JobState="):
                return token.partition("=")[2]
        return "UNKNOWN"

    def wait_job(self, job_id: str, timeout_s: float = 20.0) -> str:
        """Wait until the job has run (COMPLETED) or failed; its last state."""
        deadline = time.monotonic() + timeout_s
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state
            time.sleep(0.1)
        return state

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo shows it (idle, reserved, alloc, down ...)."""
        text = self.call("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in text.splitlines() if line.strip())


def _conf(root: Path, nodes: Sequence[str], ctld_port: int, node_ports: Sequence[int]) -> str:
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    lines = [
        "ClusterName=gpufarmlocal",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={root}/munge/munge.sock",
        "CredType=cred/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "SchedulerType=sched/builtin",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmctldTimeout=10",
        "SlurmdTimeout=10",
        "MinJobAge=30",
        "PlugStackConfig=/dev/null",
    ]
    lines += [
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=500 State=UNKNOWN"
        for name, port in zip(nodes, node_ports, strict=True)
    ]
    lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@contextmanager
def local_slurm(nodes: Sequence[str] = ("hpc-a-001",)) -> Iterator[LocalSlurm]:
    """Start munged, slurmctld and a slurmd per node in a temporary folder; stop them and remove it after.

    RuntimeError (with the daemons' log tail) when they do not come up within START_TIMEOUT_S.
    """
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    root = Path(tempfile.mkdtemp(prefix="gpufarm-slurm-"))
    root.chmod(0o755)
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    slurm = LocalSlurm(root, tuple(nodes))
    try:
        _start(slurm)
        yield slurm
    finally:
        _stop(slurm)
        shutil.rmtree(root, ignore_errors=True)


def _start(slurm: LocalSlurm) -> None:
    root = slurm.root
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ports = [_free_port() for _ in range(len(slurm.nodes) + 1)]
    slurm.conf.write_text(_conf(root, slurm.nodes, ports[0], ports[1:]))
    munge = root / "munge"
    _daemon(
        slurm,
        _binary("munged"),
        "--force",
        f"--key-file={key}",
        f"--socket={munge / 'munge.sock'}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--log-file={root / 'log' / 'munged.log'}",
        f"--seed-file={munge / 'seed'}",
    )
    _daemon(slurm, _binary("slurmctld"), "-i")
    for name in slurm.nodes:
        _daemon(slurm, _binary("slurmd"), "-N", name)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with suppress(subprocess.SubprocessError, ValueError):
            states = slurm.node_states()
            if len(states) == len(slurm.nodes) and all(s.startswith(("idle", "resv")) for s in states.values()):
                return
        time.sleep(0.2)
    raise RuntimeError(f"the local Slurm did not come up in {START_TIMEOUT_S:.0f}s: {_log_tail(root)}")


def _daemon(slurm: LocalSlurm, *args: str) -> None:
    done = subprocess.run(  # noqa: S603 - Slurm's and munge's own daemons, fixed arguments
        list(args), capture_output=True, text=True, timeout=_CALL_TIMEOUT_S, env=slurm.env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} did not start: {(done.stderr or done.stdout).strip()[:300]}")


def _stop(slurm: LocalSlurm) -> None:
    """Stop the daemons this cluster started, by the pids in its own pid files."""
    root = slurm.root
    with suppress(subprocess.SubprocessError, OSError):
        slurm.call("scontrol", "shutdown", check=False)
    pidfiles = [root / "slurmctld.pid", *(root / f"slurmd-{n}.pid" for n in slurm.nodes), root / "munge/munged.pid"]
    deadline = time.monotonic() + 10
    for pidfile in pidfiles:
        pid = _pid(pidfile)
        if pid is None:
            continue
        while _alive(pid) and time.monotonic() < deadline:
            with suppress(ProcessLookupError):
                os.kill(pid, 15)
            time.sleep(0.05)
        if _alive(pid):
            with suppress(ProcessLookupError):
                os.kill(pid, 9)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def _log_tail(root: Path) -> str:
    tails = []
    for log in sorted((root / "log").glob("*.log")):
        with suppress(OSError):
            tails.append(f"{log.name}: " + " | ".join(log.read_text().splitlines()[-3:]))
    return "; ".join(tails)[:1500]
