"""fabric-cluster-placement on hand-made groups and resolved platforms (infra/policy/rules/fabric.py
check_cluster_placement): which training groups need one cluster placement group (more than one node),
what the finding names, groups known by their pool's component only, and the stack's own placement
against its multi-node training pools. Each test failed on a mutant of the rule the policy-rules session
let through (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from dataclasses import replace

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext
from infra.policy.rules.fabric import check_cluster_placement
from infra.policy.rules.resource_types import ASG, PLACEMENT_GROUP
from infra.policy.view import TAG_ROLE, ResourceIndex, ResourceView
from tests.unit.test_policy_spot_pools import with_pools

NEEDS = "EFA traffic between nodes needs them in one cluster placement group"


def training_group(max_size: int, *placement: str, component: str = "") -> ResourceView:
    props = {"maxSize": max_size, "placementGroup": list(placement)}
    if not component:
        props["tags"] = [{"key": TAG_ROLE, "value": "train"}]
    parent = f"urn:component::{component}" if component else None
    return ResourceView(ASG, "train-asg", props, urn="urn:train-asg", parent=parent)


def placement_group(name: str, strategy: str) -> ResourceView:
    return ResourceView(
        PLACEMENT_GROUP, name, {"strategy": strategy}, urn=f"urn:{name}", ids=frozenset({name})
    )


def findings(platform: ResolvedPlatform | None, *resources: ResourceView) -> list[str]:
    return [
        f.message for f in check_cluster_placement(ResourceIndex(list(resources)), PolicyContext(platform))
    ]


def test_a_training_group_of_more_than_one_node_needs_a_cluster_placement_group() -> None:
    assert findings(None, training_group(1)) == []
    assert findings(None, training_group(2)) == [
        f"training group 'train-asg' scales to 2 nodes with no placement group: {NEEDS}"
    ]
    spread, partition = placement_group("pg-a", "spread"), placement_group("pg-b", "partition")
    assert findings(None, training_group(4, "pg-a", "pg-b"), spread, partition) == [
        "training group 'train-asg' scales to 4 nodes with placement group strategy spread, partition: "
        + NEEDS
    ]
    cluster = placement_group("pg-c", "cluster")
    assert findings(None, training_group(4, "pg-a", "pg-c"), spread, cluster) == []


def test_a_training_group_known_by_its_pools_component_only_is_judged(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    assert findings(aws, training_group(4, component="aws-prod-train")) == [
        f"training group 'train-asg' scales to 4 nodes with no placement group: {NEEDS}"
    ]


def test_the_stacks_placement_must_be_cluster_when_a_training_pool_spans_several_nodes(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    spread = replace(
        aws,
        spec=aws.spec.model_copy(
            update={"fabric": aws.spec.fabric.model_copy(update={"placement": "spread"})}
        ),
    )
    assert findings(with_pools(spread, train={"count": 1}, train_spot={"count": 1})) == []
    assert findings(with_pools(spread, train={"count": 2}, train_spot={"count": 1})) == [
        "fabric.placement is 'spread' while training pools train span several nodes: they need cluster "
        "placement for full EFA bandwidth"
    ]
