"""The spot rules' checks of the stack's pools (infra/policy/rules/spot.py), on resolved platforms and an
empty resource index: what the rules say of the pools themselves, whatever the program emitted. Each test
failed on a mutant of the rules that the suite let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext
from infra.policy.rules.spot import check_inference_base_capacity, check_interruptible_on_spot
from infra.policy.view import ResourceIndex

NO_RESOURCES = ResourceIndex([])


def with_pools(platform: ResolvedPlatform, **changes: dict[str, Any]) -> ResolvedPlatform:
    """The platform with these pools' spec fields changed (`spot_discount` changes the node type's price)."""
    pools = []
    for pool in platform.pools:
        change = dict(changes.get(pool.name.replace("-", "_"), {}))
        if "spot_discount" in change:
            price = pool.node_type.price.model_copy(update={"spot_discount": change.pop("spot_discount")})
            pool = replace(pool, node_type=pool.node_type.model_copy(update={"price": price}))
        pools.append(replace(pool, spec=pool.spec.model_copy(update=change)) if change else pool)
    return replace(platform, pools=tuple(pools))


def test_an_inference_pool_on_spot_without_its_group_is_named_on_the_cloud_only(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = with_pools(shipped_platforms["aws-prod"], infer={"capacity": "spot"})
    found = list(check_inference_base_capacity(NO_RESOURCES, PolicyContext(aws)))
    assert [(f.resource, f.message) for f in found] == [
        (
            "pool infer",
            "inference pool 'infer' runs on spot capacity: its minimum of 2 nodes must be on-demand or "
            "reserved",
        )
    ]
    assert not list(check_inference_base_capacity(NO_RESOURCES, PolicyContext(shipped_platforms["aws-prod"])))
    # No spot market on the local backend: nothing to say of a pool asking for spot there.
    local = with_pools(shipped_platforms["local"], infer={"capacity": "spot"})
    assert not list(check_inference_base_capacity(NO_RESOURCES, PolicyContext(local)))


def test_every_interruptible_pool_on_on_demand_capacity_is_named_with_the_saving_where_known(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """train-spot and train both interruptible on on-demand: both named, not only the first; a node type
    without a spot price names no saving."""
    aws = with_pools(
        shipped_platforms["aws-prod"],
        train={"interruptible": True, "spot_discount": None},
        train_spot={"capacity": "on-demand"},
    )
    found = {f.message for f in check_interruptible_on_spot(NO_RESOURCES, PolicyContext(aws))}
    lead = (
        "is interruptible but runs on on-demand capacity: its work survives losing a node, so spot capacity "
    )
    assert found == {
        f"pool 'train' {lead}carries it for less",
        f"pool 'train-spot' {lead}carries it for less (about 55% less for p5.48xlarge)",
    }
