"""The farm file's enforcement: which pools a scheduler of the farm enforces, and whose names it enforces for.

    environments:
      onprem-hpc: {enforce: slurm, ...}
    enforcement:
      slurm:
        users: {U0DANA: dana}     # Slack user id -> the cluster user a lease's reservation names
        accounts: {nlp: nlp}      # team -> Slurm account, named when the requester has no user above

The enforcer runs on-prem (`gpufarm-node enforce slurm`, gpufarm_node.enforce) and reads this same slice of the
file; the runtime validates it with the rest (a bad slice is an invalid configuration) and tells a lease's holder
how to submit into its reservation. `tests/unit/test_enforce_contract.py` holds both readings equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import SLACK_USER_PATTERN, Name

# Slurm reservations gpufarm owns are named with this prefix and the lease's number (gpufarm_node.enforce.slurm_plan).
RESERVATION_PREFIX = "gpufarm-ir-"
# What the node agent puts on its Node while a dedicated lease holds it (gpufarm_node.enforce.kube_plan), and the
# pod label that names a pod's lease (gpufarm_node.attribution.IR_LABEL).
NODE_LABEL = "gpufarm.io/ir"
NODE_TAINT = "gpufarm.io/lease"
# A POSIX user name as slurmctld resolves it, and a Slurm account (stored lower-case).
CLUSTER_USER_PATTERN = r"^[a-z_][a-z0-9_.-]{0,31}$"
SLURM_ACCOUNT_PATTERN = r"^[a-z0-9_][a-z0-9_.-]{0,63}$"
MAX_CLUSTER_USERS = 20_000


class Enforcer(StrEnum):
    """What enforces a pool's leases beyond gpufarm's own bookkeeping (host tags)."""

    NONE = "none"
    # A Slurm reservation gpufarm-ir-<n> per lease, held by `gpufarm-node enforce slurm` next to slurmctld.
    SLURM = "slurm"
    # The node agent labels and taints its own Kubernetes Node while a dedicated lease holds it (gpufarm_node.enforce
    # .kube); on a shared pool a pod's `gpufarm.io/ir` label is checked against the device it received.
    KUBERNETES = "kubernetes"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


SlackUser = Annotated[str, Field(pattern=SLACK_USER_PATTERN)]
ClusterUser = Annotated[str, Field(pattern=CLUSTER_USER_PATTERN)]
SlurmAccount = Annotated[str, Field(pattern=SLURM_ACCOUNT_PATTERN)]


class SlurmEnforcement(_Strict):
    """Whose names a lease's Slurm reservation carries."""

    users: dict[SlackUser, ClusterUser] = Field(default_factory=dict, max_length=MAX_CLUSTER_USERS)
    accounts: dict[Name, SlurmAccount] = Field(default_factory=dict)


class EnforcementSettings(_Strict):
    """The `enforcement:` section."""

    slurm: SlurmEnforcement = SlurmEnforcement()

    def problems(self, enforcers: Mapping[str, Enforcer], teams: Iterable[str]) -> list[str]:
        """What is wrong across sections: an account for a team that does not exist, or a team without one while
        a pool is enforced by Slurm (a requester without a cluster user falls back to the team's account)."""
        known = set(teams)
        out = [f"enforcement.slurm.accounts: '{t}' is not a team" for t in self.slurm.accounts if t not in known]
        slurm_pools = sorted(name for name, e in enforcers.items() if e is Enforcer.SLURM)
        missing = sorted(known - set(self.slurm.accounts))
        if slurm_pools and missing:
            out.append(
                f"enforcement.slurm.accounts: team '{missing[0]}' has no Slurm account, and pools "
                f"{', '.join(slurm_pools)} are enforced by Slurm (a requester without a user there needs one)"
            )
        return out


def reservation_name(ir: int) -> str:
    """`gpufarm-ir-123`: the Slurm reservation of IR-123."""
    return f"{RESERVATION_PREFIX}{ir}"


def submit_hint(enforcer: Enforcer, ir: int, *, shared: bool = False) -> str | None:
    """How the holder of IR-`ir` submits into what enforces it, or None when nothing does (`shared`: the pool hands
    out devices, not hosts)."""
    if enforcer is Enforcer.KUBERNETES:
        return kubernetes_hint(ir, shared=shared)
    if enforcer is Enforcer.SLURM:
        name = reservation_name(ir)
        return (
            f"Submit with `sbatch --reservation={name} …` (or `srun --reservation={name} …`): "
            "its hosts take no other jobs."
        )
    return None


def kubernetes_hint(ir: int, *, shared: bool = False) -> str:
    """The pod spec lines a lease's pods need: on a dedicated pool the toleration of the lease's taint and the node
    selector of its label; on a shared pool the label alone (a pod on another lease's device is a squatter)."""
    value = f"ir-{ir}"
    if shared:
        return (
            f"Label its pods so their devices count as the lease's (a pod on another lease's device is a squatter):\n"
            f"```metadata:\n  labels:\n    {NODE_LABEL}: {value}```"
        )
    return (
        "Its nodes are tainted for this lease alone; its pods need:\n"
        f"```metadata:\n  labels:\n    {NODE_LABEL}: {value}\n"
        f"spec:\n  nodeSelector:\n    {NODE_LABEL}: {value}\n"
        f"  tolerations:\n  - key: {NODE_TAINT}\n    operator: Equal\n    value: {value}\n"
        "    effect: NoSchedule```"
    )
