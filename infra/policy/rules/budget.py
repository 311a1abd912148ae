"""Budget rules: the pools' GPUs and hourly cost at full size stay within the stack's budget.

A pool's full size is the larger of the stack's `max` and what its node groups declare (an Auto Scaling
group's maxSize, a Slurm-managed training template's `gpuplat:max-nodes`): the resources, not the
description alone, say how many nodes can run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules.base import Finding, PolicyContext, _stack_label
from infra.policy.rules.nodes import node_groups
from infra.policy.rules.service_costs import service_costs, total_usd_per_hour
from infra.policy.view import ResourceIndex


@dataclass(frozen=True)
class _PoolSize:
    name: str
    nodes: int  # at full size, as the stack or its node groups say (the larger)
    declared_by: tuple[str, ...]  # node groups declaring more nodes than the stack
    gpus: int
    usd_per_hour: float


def _pool_sizes(index: ResourceIndex, ctx: PolicyContext, platform: ResolvedPlatform) -> list[_PoolSize]:
    groups = node_groups(index, ctx)
    sizes = []
    for pool in platform.pools:
        own = [g for g in groups if g.pool == pool.name]
        declared = sum(g.max_size for g in own)
        nodes = max(pool.spec.max_nodes, declared)
        over = tuple(g.anchor.name for g in own) if declared > pool.spec.max_nodes else ()
        cost = round(pool.node_usd_per_hour * nodes, 2)
        sizes.append(_PoolSize(pool.name, nodes, over, pool.gpus_per_node * nodes, cost))
    return sizes


def _beyond_stack(sizes: list[_PoolSize], platform: ResolvedPlatform) -> str:
    notes = [
        f"{', '.join(s.declared_by)} declare{'s' if len(s.declared_by) == 1 else ''} {s.nodes} nodes "
        f"for pool {s.name!r}, which the stack sizes at {platform.pool(s.name).spec.max_nodes}"
        for s in sizes
        if s.declared_by
    ]
    return f" ({'; '.join(notes)})" if notes else ""


def check_budget_gpus(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_gpus
    sizes = _pool_sizes(index, ctx, platform)
    total = sum(s.gpus for s in sizes)
    if total > limit:
        yield Finding(
            _stack_label(ctx),
            f"the pools hold {total} GPUs at full size, over the budget of {limit}"
            f"{_beyond_stack(sizes, platform)}",
        )


def check_budget_cost(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_hourly_usd
    sizes = _pool_sizes(index, ctx, platform)
    pools = round(sum(s.usd_per_hour for s in sizes), 2)
    services = total_usd_per_hour(service_costs(index))
    total = round(pools + services, 2)
    if total > limit:
        yield Finding(
            _stack_label(ctx),
            f"the stack costs ${total:,.2f} per hour at full size (pools ${pools:,.2f}, services "
            f"${services:,.2f}: EKS, NAT gateways, FSx), over the budget of ${limit:,.2f}"
            f"{_beyond_stack(sizes, platform)}",
        )
