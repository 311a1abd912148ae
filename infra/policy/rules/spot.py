"""Spot rules: interruptible pools on spot, inference base capacity, spot training recovery and share."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from pathlib import PurePosixPath

from infra.policy.rules.base import Finding, PolicyContext, _stack_label
from infra.policy.rules.nodes import _group_of, _pool_target, node_groups
from infra.policy.rules.resource_types import LUSTRE
from infra.policy.view import ResourceIndex
from infra.scheduling.slurm import partitions

SPOT_BACKENDS = ("aws",)  # spot markets exist only on the cloud backend


def check_interruptible_on_spot(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    groups = node_groups(index, ctx)
    for pool in platform.pools:
        if not pool.spec.interruptible:
            continue
        label, urn = _pool_target(groups, pool)
        if pool.spec.capacity == "on-demand":
            discount = pool.node_type.price.spot_discount
            saving = f" (about {discount:.0%} less for {pool.node_type.name})" if discount else ""
            yield Finding(
                label,
                f"pool {pool.name!r} is interruptible but runs on on-demand capacity: its work survives "
                f"losing a node, so spot capacity carries it for less{saving}",
                urn,
            )
            continue
        group = _group_of(groups, pool.name)
        on_demand = group is not None and (
            group.on_demand_base > 0 or group.on_demand_percentage_above_base > 0
        )
        if pool.spec.capacity == "spot" and group is not None and on_demand:
            yield Finding(
                label,
                f"pool {pool.name!r} is spot in the stack, but its {group.description} "
                f"{group.anchor.name!r} launches on-demand instances (base {group.on_demand_base}, "
                f"{group.on_demand_percentage_above_base:g}% above base)",
                urn,
            )


def check_inference_base_capacity(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    groups = node_groups(index, ctx)
    for group in groups:
        if group.role != "infer" or group.reserved:
            continue
        if group.on_demand_base < group.min_size:
            yield Finding(
                group.anchor.name,
                f"inference group {group.anchor.name!r} keeps {group.on_demand_base} on-demand instances as "
                f"base capacity but needs at least its minimum of {group.min_size}: below that, a spot "
                "interruption takes serving replicas away while latency matters",
                group.anchor.urn or None,
            )
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    for pool in platform.pools_with_role("infer"):
        if pool.spec.capacity == "spot" and _group_of(groups, pool.name) is None:
            yield Finding(
                f"pool {pool.name}",
                f"inference pool {pool.name!r} runs on spot capacity: its minimum of "
                f"{pool.spec.min_nodes} nodes must be on-demand or reserved",
            )


def _is_under(path: str, directory: str) -> bool:
    """Whether `path` lies in `directory` once `.`, `..` and repeated slashes are resolved (no symlinks:
    the rule sees the stack, not the nodes' file systems)."""
    return PurePosixPath(posixpath.normpath(path)).is_relative_to(posixpath.normpath(directory))


def check_spot_training_recovery(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    spot_pools = [p for p in platform.pools_with_role("train") if p.spec.capacity == "spot"]
    if not spot_pools:
        return
    groups = node_groups(index, ctx)
    storage = platform.spec.storage
    fs = storage.parallel_fs
    problems: list[str] = []
    if fs.kind == "local-volume":
        problems.append("the parallel filesystem is a local volume, which does not outlive its node")
    if not _is_under(storage.checkpoint_path, fs.mount_path):
        resolved = posixpath.normpath(storage.checkpoint_path)
        shown = storage.checkpoint_path + (f" (= {resolved})" if resolved != storage.checkpoint_path else "")
        problems.append(
            f"checkpoint_path {shown} is not on the shared filesystem ({fs.mount_path}), so a checkpoint "
            "dies with the node that wrote it"
        )
    if platform.spec.backend == "aws" and fs.kind == "fsx-lustre":
        lustre = index.of_type(LUSTRE)
        if not lustre:
            problems.append("no FSx for Lustre file system is declared to hold the checkpoints")
        for filesystem in lustre:
            deployment = str(filesystem.props.get("deploymentType", ""))
            if not deployment.startswith("PERSISTENT"):
                problems.append(
                    f"file system {filesystem.name!r} is {deployment or 'SCRATCH_1'}: scratch file systems "
                    "lose data when a server fails"
                )
    by_pool = {p.pool: p for p in partitions(platform)}
    for pool in spot_pools:
        label, urn = _pool_target(groups, pool)
        for problem in problems:
            yield Finding(
                label, f"spot training pool {pool.name!r} needs persistent checkpoints: {problem}", urn
            )
        partition = by_pool.get(pool.name)
        if partition is None or partition.preempt_mode != "REQUEUE":
            mode = partition.preempt_mode if partition else "no partition"
            yield Finding(
                f"partition {partition.name if partition else pool.name}",
                f"spot training pool {pool.name!r} has preempt mode {mode}: jobs on reclaimed nodes are "
                "cancelled instead of requeued and resumed from their checkpoint",
                urn,
            )


def check_spot_training_share(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    if platform.spec.environment == "production":
        return
    total = platform.training_gpus
    spot = sum(p.max_gpus for p in platform.pools_with_role("train") if p.spec.capacity == "spot")
    wanted = ctx.config.min_spot_share
    if total and spot / total < wanted:
        yield Finding(
            _stack_label(ctx),
            f"{spot} of {total} training GPUs ({spot / total:.0%}) are on spot in this "
            f"{platform.spec.environment} stack; at least {wanted:.0%} should be, since non-production "
            "training can be interrupted",
        )
