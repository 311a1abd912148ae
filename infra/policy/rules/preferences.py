"""Placement preference rules: every pool a preference names is a training pool of the stack, and on Slurm
a preference has GPU types to choose between (Slurm orders types, infra.scheduling.slurm.placement)."""

from __future__ import annotations

from collections.abc import Iterator

from infra.policy.rules.base import Finding, PolicyContext
from infra.policy.view import ResourceIndex
from infra.scheduling.placement import unknown_pools
from infra.scheduling.slurm import heterogeneous, on_demand_gpu_types
from infra.spec.models import PlacementPreference


def _preferences(ctx: PolicyContext) -> Iterator[tuple[str, PlacementPreference]]:
    scheduler = ctx.platform.spec.scheduler if ctx.platform else None
    if scheduler is None:
        return
    for index, team in enumerate(scheduler.teams):
        if team.placement is not None:
            yield f"scheduler.teams[{index}] ({team.name})", team.placement
    for index, job_class in enumerate(scheduler.job_classes):
        yield f"scheduler.job_classes[{index}] ({job_class.name})", job_class.placement


def check_placement_preferences(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    training = [p.name for p in platform.pools_with_role("train")]
    slurm_moot = platform.spec.scheduler.kind == "slurm" and not heterogeneous(platform)
    types = on_demand_gpu_types(platform)
    for where, preference in _preferences(ctx):
        unknown = unknown_pools(platform, preference)
        if unknown:
            yield Finding(
                where,
                f"{where}.placement names {', '.join(unknown)}, which is no training pool of the stack "
                f"(training pools: {', '.join(training) or 'none'})",
            )
        elif slurm_moot:
            yield Finding(
                where,
                f"{where}.placement has nothing to choose between: the on-demand training pools hold one GPU "
                f"type ({', '.join(types) or 'none'}), and on Slurm a preference orders GPU types",
            )
