"""The spot rules' checks of the stack's pools (infra/policy/rules/spot.py), on resolved platforms and an
empty resource index: what the rules say of the pools themselves, whatever the program emitted. Each test
failed on a mutant of the rules that the suite let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext, spot
from infra.policy.rules.resource_types import ASG, LUSTRE
from infra.policy.rules.spot import (
    check_inference_base_capacity,
    check_interruptible_on_spot,
    check_spot_training_recovery,
)
from infra.policy.view import ResourceIndex, ResourceView

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


# Pools with their Auto Scaling groups


def asg(
    name: str, min_size: int, base: int, percent: float, pool: str = "", role: str = "", parent: str = ""
) -> Any:
    """An Auto Scaling group with a mixed instances policy; tagged with its pool and role, or known only by
    its parent component (`<stack>-<pool>`)."""
    tags = [{"key": "gpuplat:pool", "value": pool}, {"key": "gpuplat:role", "value": role}] if pool else []
    distribution = {"onDemandBaseCapacity": base, "onDemandPercentageAboveBaseCapacity": percent}
    props = {
        "minSize": min_size,
        "maxSize": 8,
        "tags": tags,
        "mixedInstancesPolicy": {"instancesDistribution": distribution},
    }
    return ResourceView(
        ASG, name, props, urn=f"urn:{name}", parent=f"urn:component::{parent}" if parent else None
    )


def test_inference_groups_keep_their_minimum_on_demand_and_only_inference_groups_are_asked(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A training group below its minimum on-demand is no finding (its work survives interruption); the
    inference group, known by its component only, is, after it."""
    aws = PolicyContext(shipped_platforms["aws-prod"])
    index = ResourceIndex(
        [
            asg("train-asg", 2, 0, 0, pool="train-spot", role="train"),
            asg("infer-asg", 2, 1, 0, parent="aws-prod-infer"),
        ]
    )
    found = list(check_inference_base_capacity(index, aws))
    assert [(f.resource, f.urn) for f in found] == [("infer-asg", "urn:infer-asg")]
    assert found[0].message.startswith(
        "inference group 'infer-asg' keeps 1 on-demand instances as base capacity but needs at least its "
        "minimum of 2"
    )
    enough = ResourceIndex([asg("infer-asg", 2, 2, 0, parent="aws-prod-infer")])
    assert not list(check_inference_base_capacity(enough, aws))


def test_a_spot_pool_whose_group_launches_any_on_demand_is_named(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """train-spot is spot in the stack: its group may launch no on-demand instance, neither as base nor as
    any percentage above it. The group is known by its component (`aws-prod-train-spot`)."""
    aws = PolicyContext(shipped_platforms["aws-prod"])
    for base, percent in ((1, 0), (0, 1), (0, 10), (3, 50)):
        index = ResourceIndex([asg("spot-asg", 0, base, percent, parent="aws-prod-train-spot")])
        found = list(check_interruptible_on_spot(index, aws))
        assert [f.message for f in found] == [
            "pool 'train-spot' is spot in the stack, but its Auto Scaling group 'spot-asg' launches "
            f"on-demand instances (base {base}, {percent:g}% above base)"
        ], (base, percent)
    all_spot = ResourceIndex([asg("spot-asg", 0, 0, 0, parent="aws-prod-train-spot")])
    assert not list(check_interruptible_on_spot(all_spot, aws))


def test_spot_training_on_a_local_volume_is_told_its_checkpoints_die_with_the_node(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """aws-prod with its parallel filesystem a local volume: the one problem is the volume (no FSx is asked
    for, the stack has no Lustre to ask it of), named at the spot pool's group, known by its component."""
    platform = shipped_platforms["aws-prod"]
    storage = platform.spec.storage
    local_fs = storage.parallel_fs.model_copy(update={"kind": "local-volume"})
    spec = platform.spec.model_copy(update={"storage": storage.model_copy(update={"parallel_fs": local_fs})})
    index = ResourceIndex([asg("spot-asg", 0, 0, 0, parent="aws-prod-train-spot")])
    found = list(check_spot_training_recovery(index, PolicyContext(replace(platform, spec=spec))))
    assert [(f.resource, f.urn, f.message) for f in found] == [
        (
            "spot-asg",
            "urn:spot-asg",
            "spot training pool 'train-spot' needs persistent checkpoints: the parallel filesystem is a "
            "local volume, which does not outlive its node",
        )
    ]


def test_spot_training_on_aws_needs_a_persistent_fsx_for_lustre(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """aws-prod's parallel filesystem is FSx for Lustre: none declared, or a scratch one (SCRATCH_1 when the
    deployment type is left out, as AWS defaults it), is a problem; a persistent one is not."""
    aws = PolicyContext(shipped_platforms["aws-prod"])
    lead = "spot training pool 'train-spot' needs persistent checkpoints: "

    def problems(*filesystems: ResourceView) -> list[tuple[str, str]]:
        found = check_spot_training_recovery(ResourceIndex(list(filesystems)), aws)
        return [(f.resource, f.message.removeprefix(lead)) for f in found]

    assert problems() == [
        ("pool train-spot", "no FSx for Lustre file system is declared to hold the checkpoints")
    ]
    scratch = ResourceView(LUSTRE, "scratch", {"deploymentType": "SCRATCH_2"})
    unset = ResourceView(LUSTRE, "unset", {})
    assert problems(scratch, unset) == [
        (
            "pool train-spot",
            "file system 'scratch' is SCRATCH_2: scratch file systems lose data when a server fails",
        ),
        (
            "pool train-spot",
            "file system 'unset' is SCRATCH_1: scratch file systems lose data when a server fails",
        ),
    ]
    assert problems(ResourceView(LUSTRE, "kept", {"deploymentType": "PERSISTENT_2"})) == []


def test_a_spot_training_pool_without_a_partition_is_named_by_its_pool(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spot training pool the Slurm layout gives no partition (it makes one per training pool today,
    infra/scheduling/slurm.py partitions; a changed layout might not): its jobs cannot be requeued, and the
    finding names the pool, as no partition has a name."""
    aws = shipped_platforms["aws-prod"]

    def no_partitions(platform: ResolvedPlatform) -> list[object]:
        assert platform is aws
        return []

    monkeypatch.setattr(spot, "partitions", no_partitions)
    found = list(check_spot_training_recovery(NO_RESOURCES, PolicyContext(aws)))
    # (an empty program has no FSx for Lustre either: that finding is another test's)
    assert [(f.resource, f.message) for f in found if "preempt mode" in f.message] == [
        (
            "partition train-spot",
            "spot training pool 'train-spot' has preempt mode no partition: jobs on reclaimed nodes are "
            "cancelled instead of requeued and resumed from their checkpoint",
        )
    ]
