"""budget-gpus on hand-made node groups (infra/policy/rules/budget.py): a pool's full size is the larger of
the stack's and what its groups declare, and the finding names, per pool, the groups that declare more
(one group "declares", several "declare"; pools apart by ";"). Each test failed on a mutant of the rule
the policy-rules session let through (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import Finding, PolicyContext
from infra.policy.rules.budget import check_budget_cost, check_budget_gpus
from infra.policy.rules.resource_types import ASG
from infra.policy.view import TAG_POOL, TAG_ROLE, ResourceIndex, ResourceView


def pool_group(name: str, pool: str, max_size: int) -> ResourceView:
    tags = [{"key": TAG_ROLE, "value": "train"}, {"key": TAG_POOL, "value": pool}]
    return ResourceView(ASG, name, {"maxSize": max_size, "tags": tags}, urn=f"urn:{name}")


def test_the_groups_declaring_more_nodes_than_the_stack_are_named_per_pool(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    groups = [pool_group("a", "train", 4), pool_group("b", "train", 4), pool_group("c", "train-spot", 10)]
    (finding,) = check_budget_gpus(ResourceIndex(groups), PolicyContext(aws))
    assert finding.message.endswith(
        " (a, b declare 8 nodes for pool 'train', which the stack sizes at 4; c declares 10 nodes for pool "
        "'train-spot', which the stack sizes at 4)"
    )


@pytest.mark.parametrize("check", [check_budget_gpus, check_budget_cost])
def test_a_group_known_by_its_pools_component_only_counts_for_its_pool(
    shipped_platforms: dict[str, ResolvedPlatform], check: Callable[..., Iterator[Finding]]
) -> None:
    """For the GPUs and for the hourly cost: 40 nodes of the training pool are over both budgets."""
    aws = shipped_platforms["aws-prod"]
    group = ResourceView(ASG, "d", {"maxSize": 40}, urn="urn:d", parent="urn:component::aws-prod-train")
    (finding,) = check(ResourceIndex([group]), PolicyContext(aws))
    assert finding.message.endswith(" (d declares 40 nodes for pool 'train', which the stack sizes at 4)")


def with_hourly_budget(platform: ResolvedPlatform, usd: float) -> ResolvedPlatform:
    budget = platform.spec.budget.model_copy(update={"max_hourly_usd": usd})
    return replace(platform, spec=platform.spec.model_copy(update={"budget": budget}))


def test_a_stack_costing_exactly_its_hourly_budget_passes(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    (finding,) = check_budget_cost(ResourceIndex([]), PolicyContext(with_hourly_budget(aws, 0)))
    cost = float(finding.message.split("costs $")[1].split(" ")[0].replace(",", ""))
    assert not list(check_budget_cost(ResourceIndex([]), PolicyContext(with_hourly_budget(aws, cost))))
    assert list(check_budget_cost(ResourceIndex([]), PolicyContext(with_hourly_budget(aws, cost - 0.01))))
