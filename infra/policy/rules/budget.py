"""Budget rules: the pools' GPUs and hourly cost at full size stay within the stack's budget."""

from __future__ import annotations

from collections.abc import Iterator

from infra.policy.rules.base import Finding, PolicyContext, _stack_label
from infra.policy.view import ResourceIndex


def check_budget_gpus(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_gpus
    if platform.total_gpus > limit:
        yield Finding(
            _stack_label(ctx),
            f"the pools hold {platform.total_gpus} GPUs at full size, over the budget of {limit}",
        )


def check_budget_cost(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_hourly_usd
    if platform.max_usd_per_hour > limit:
        yield Finding(
            _stack_label(ctx),
            f"the pools cost ${platform.max_usd_per_hour:,.2f} per hour at full size, over the budget of "
            f"${limit:,.2f}",
        )
