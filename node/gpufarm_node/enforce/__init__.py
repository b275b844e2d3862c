"""Leases the farm's own schedulers enforce: the on-prem side of docs/design.md, rule 15.

An enforcer reads the live leases from Datadog (outbound only), computes what its scheduler should hold for them
(pure: `leases`, `slurm_plan`), reads what it holds, and applies the difference one atomic operation at a time
(`scontrol`). Slurm today (`gpufarm-node enforce slurm`); a Kubernetes or squatter enforcer takes the same leases.
"""
