"""The node groups the policy rules judge (infra/policy/rules/nodes.py node_groups) from hand-made resources:
where an EKS managed node group's pool and role come from (its tags, else its node labels, else its
templates' tags, else its parent component, each filling only what the ones before left unknown), what its
templates, placement groups, subnets and security groups are (resources of those types only), and a Slurm
template's size tags. Each test failed on a mutant of nodes.py the policy-rules session let through
(`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from typing import Any

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE
from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext
from infra.policy.rules.nodes import NodeGroup, node_groups
from infra.policy.rules.resource_types import (
    EKS_NODE_GROUP,
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    SUBNET,
)
from infra.policy.view import TAG_MAX_NODES, TAG_MIN_NODES, TAG_POOL, TAG_ROLE, ResourceIndex, ResourceView


def eks_group(props: dict[str, Any], component: str = "") -> ResourceView:
    parent = f"urn:component::{component}" if component else None
    return ResourceView(EKS_NODE_GROUP, "group", props, urn="urn:group", parent=parent)


def only_group(platform: ResolvedPlatform | None, *resources: ResourceView) -> NodeGroup:
    (group,) = node_groups(ResourceIndex(list(resources)), PolicyContext(platform))
    return group


def where(group: NodeGroup) -> tuple[str | None, str | None]:
    return group.pool, group.role


def test_an_eks_group_reads_its_pool_and_role_from_its_tags_else_its_node_labels() -> None:
    tagged = eks_group({"tags": {TAG_POOL: "train", TAG_ROLE: "train"}, "labels": {LABEL_POOL: "x"}})
    assert where(only_group(None, tagged)) == ("train", "train")
    labelled = eks_group({"labels": {LABEL_POOL: "infer", LABEL_ROLE: "infer"}})
    assert where(only_group(None, labelled)) == ("infer", "infer")
    assert where(only_group(None, eks_group({"labels": "unknown"}))) == (None, None)


def test_an_eks_groups_component_fills_only_what_its_tags_and_labels_leave_unknown(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The component aws-k8s-infer is the inference pool's: a group that names its role alone gets the
    pool from it, one that names its pool alone the role, and what the group names stays."""
    aws = shipped_platforms["aws-k8s"]
    role_only = eks_group({"labels": {LABEL_ROLE: "train"}}, component="aws-k8s-infer")
    assert where(only_group(aws, role_only)) == ("infer", "train")
    pool_only = eks_group({"tags": {TAG_POOL: "train"}}, component="aws-k8s-infer")
    assert where(only_group(aws, pool_only)) == ("train", "infer")


def test_an_eks_groups_parts_are_resources_of_their_type_only() -> None:
    """Under the mocks a resource's id is its name's: a security group, a subnet and a placement group
    may share an id with what the group and its template refer to, and are not taken for it."""
    template = ResourceView(
        LAUNCH_TEMPLATE,
        "lt",
        {"placement": {"groupName": "pg-id"}, "securityGroupNames": ["sg-id"]},
        urn="urn:lt",
        ids=frozenset({"lt-id"}),
    )
    placement = ResourceView(PLACEMENT_GROUP, "pg", {}, urn="urn:pg", ids=frozenset({"pg-id"}))
    subnet = ResourceView(SUBNET, "subnet", {}, urn="urn:subnet", ids=frozenset({"subnet-id"}))
    security = ResourceView(SECURITY_GROUP, "sg", {}, urn="urn:sg", ids=frozenset({"sg-id"}))
    namesakes = [
        ResourceView(SECURITY_GROUP, f"other-{i}", {}, urn=f"urn:other-{i}", ids=frozenset({same}))
        for i, same in enumerate(("lt-id", "subnet-id"))
    ] + [ResourceView(SUBNET, "other-pg", {}, urn="urn:other-pg", ids=frozenset({"pg-id"}))]
    group = eks_group({"launchTemplate": {"id": "lt-id"}, "subnetIds": ["subnet-id"]})
    found = only_group(None, group, template, placement, subnet, security, *namesakes)
    assert [r.name for r in found.templates] == ["lt"]
    assert [r.name for r in found.placement_groups] == ["pg"]
    assert [r.name for r in found.subnets] == ["subnet"]
    assert [r.name for r in found.security_groups] == ["sg"]


def test_a_slurm_templates_size_tags_that_are_no_numbers_read_as_its_pools_sizes(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    pool = next(p for p in aws.pools if p.role == "train")
    tags = {TAG_ROLE: "train", TAG_POOL: pool.name, TAG_MIN_NODES: "some", TAG_MAX_NODES: "many"}
    template = ResourceView(LAUNCH_TEMPLATE, "lt", {"tags": tags}, urn="urn:lt")
    group = only_group(aws, template)
    assert (group.kind, group.min_size, group.max_size) == ("slurm", pool.spec.min_nodes, pool.spec.max_nodes)
