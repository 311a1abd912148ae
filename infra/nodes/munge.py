"""Which nodes run MUNGE, and so may read the stack's MUNGE key: the hosts of the inventory groups that
playbooks/scheduler.yml runs the munge role on (the Slurm controllers and the training nodes).

One definition for the AWS identities (only those pool roles may read the key from SSM), the boot
path (only those nodes fetch it) and the policy rule that keeps it so. Kubernetes (kueue) stacks run
no Slurm: no pool runs MUNGE there.
"""

from __future__ import annotations

from infra.nodes.inventory import pool_group, role_group_members
from infra.platform.resolve import ResolvedPlatform, ResolvedPool

# The `hosts:` of the "MUNGE authentication on every Slurm host" play of playbooks/scheduler.yml.
MUNGE_GROUPS = ("slurm_controller", "slurm_compute")


def munge_pools(platform: ResolvedPlatform) -> list[ResolvedPool]:
    """The pools whose nodes run munged, in the platform's order."""
    members = role_group_members(platform)
    groups = {group for name in MUNGE_GROUPS for group in members.get(name, [])}
    return [pool for pool in platform.pools if pool_group(pool.name) in groups]


def runs_munge(platform: ResolvedPlatform, pool: ResolvedPool) -> bool:
    return any(p.name == pool.name for p in munge_pools(platform))


def munge_roles(platform: ResolvedPlatform) -> set[str]:
    """The pool roles (train, infer, service) of which some pool runs munged: the node identities (one
    per pool role on aws) that may read the MUNGE key."""
    return {pool.role for pool in munge_pools(platform)}
