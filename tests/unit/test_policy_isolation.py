"""isolation-shared-resources on hand-made resources (infra/policy/rules/isolation.py check_shared_resources):
what makes a template, placement group or security group shared between training and inference. Each test
failed on a mutant of the rule the policy-rules session let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext, isolation
from infra.policy.rules.isolation import check_inference_taint, check_partitions, check_shared_resources
from infra.policy.rules.resource_types import ASG, LAUNCH_TEMPLATE, PLACEMENT_GROUP, SECURITY_GROUP
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceIndex, ResourceView
from infra.scheduling.slurm import Partition

TAG_ROLE = "gpuplat:role"


def tagged(type_: str, name: str, role: str, urn: bool = True) -> ResourceView:
    return ResourceView(
        type_, name, {"tags": {TAG_ROLE: role}}, urn=f"urn:{name}" if urn else "", ids=frozenset({name})
    )


def group(name: str, template: str, placement: str = "", role: str = "", component: str = "") -> ResourceView:
    """An Auto Scaling group launching from the template (into the placement group) it names: tagged with its
    role, or known by its component (`<stack>-<pool>`) only."""
    props = {"minSize": 0, "maxSize": 4, "launchTemplate": {"id": template}, "placementGroup": placement}
    if role:
        props["tags"] = [{"key": TAG_ROLE, "value": role}, {"key": "gpuplat:pool", "value": role}]
    parent = f"urn:component::{component}" if component else None
    return ResourceView(ASG, name, props, urn=f"urn:{name}", parent=parent)


def shared(platform: ResolvedPlatform, *resources: ResourceView, isolate_subnets: bool = False) -> list[str]:
    config = PolicyConfig.model_validate({"isolateSubnets": isolate_subnets})
    found = check_shared_resources(ResourceIndex(list(resources)), PolicyContext(platform, config))
    return [f.message.split(" serves both")[0] for f in found]


def test_an_inference_template_or_placement_group_a_training_group_uses_is_shared(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    template = tagged(LAUNCH_TEMPLATE, "infer-lt", "infer")
    placement = tagged(PLACEMENT_GROUP, "infer-pg", "infer")
    training = group("train-asg", "infer-lt", "infer-pg", role="train")
    both = ["LaunchTemplate 'infer-lt'", "PlacementGroup 'infer-pg'"]
    assert shared(aws, template, placement, training) == both
    # Subnets are compared too when asked; what else the group shares is still compared then.
    assert shared(aws, template, placement, training, isolate_subnets=True) == both


def test_groups_known_by_their_pools_components_share_the_template_they_both_launch_from(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    common = ResourceView(LAUNCH_TEMPLATE, "common-lt", {}, urn="urn:common-lt", ids=frozenset({"common-lt"}))
    training = group("train-asg", "common-lt", component="aws-prod-train")
    inference = group("infer-asg", "common-lt", component="aws-prod-infer")
    assert shared(shipped_platforms["aws-prod"], common, training, inference) == [
        "LaunchTemplate 'common-lt'"
    ]


def test_resources_without_urns_are_told_apart_by_their_names(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A training security group and an inference placement group, neither with a URN (a preview): two
    resources, neither shared."""
    training = tagged(SECURITY_GROUP, "train-sg", "train", urn=False)
    inference = tagged(PLACEMENT_GROUP, "infer-pg", "infer", urn=False)
    assert shared(shipped_platforms["aws-prod"], training, inference) == []


def test_an_inference_pool_tainted_no_execute_alone_keeps_training_off(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    pools = []
    for pool in aws.pools:
        if pool.role == "infer":
            taints = [taint.model_copy(update={"effect": "NoExecute"}) for taint in pool.spec.taints[:1]]
            assert taints, "aws-prod's inference pool is tainted"
            pool = replace(pool, spec=pool.spec.model_copy(update={"taints": taints}))
        pools.append(pool)
    platform = replace(aws, pools=tuple(pools))
    assert list(check_inference_taint(ResourceIndex([]), PolicyContext(platform))) == []
    untainted = replace(
        aws, pools=tuple(replace(p, spec=p.spec.model_copy(update={"taints": []})) for p in aws.pools)
    )
    assert [f.resource for f in check_inference_taint(ResourceIndex([]), PolicyContext(untainted))] == [
        "pool infer"
    ]


def test_each_inference_pool_needs_the_taint_or_the_configured_label_and_is_told_which(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The tainted inference pool, then two untainted ones, the first with the label the config names: the
    last is reported, and its message names the label it lacks."""
    aws = shipped_platforms["aws-prod"]
    infer = aws.pool("infer")
    labelled = replace(
        infer,
        spec=infer.spec.model_copy(update={"name": "infer-1", "taints": [], "labels": {"serving": "yes"}}),
    )
    bare = replace(infer, spec=infer.spec.model_copy(update={"name": "infer-2", "taints": [], "labels": {}}))
    platform = replace(aws, pools=(*aws.pools, labelled, bare))
    config = PolicyConfig.model_validate({"inferenceLabel": "serving=yes"})
    found = list(check_inference_taint(ResourceIndex([]), PolicyContext(platform, config)))
    assert [(f.resource, f.message) for f in found] == [
        (
            "pool infer-2",
            "inference pool 'infer-2' has no NoSchedule or NoExecute taint and not the label serving=yes: "
            "nothing keeps training jobs off its nodes",
        )
    ]


def _partition(name: str, pool: str, nodes: list[str]) -> Partition:
    return Partition(name, pool, nodes, 8, "h100", 1, "OFF", False, False, ["normal"])


def _layout(
    platform: ResolvedPlatform, made: list[Partition]
) -> Callable[[ResolvedPlatform], list[Partition]]:
    """The Slurm layout's partitions, replaced by `made` for the platform the rule was given."""

    def partitions(of: ResolvedPlatform) -> list[Partition]:
        assert of is platform
        return made

    return partitions


def test_a_partition_built_from_a_pool_that_does_not_train_and_its_serving_nodes_are_each_a_finding(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """isolation-partitions on partitions the Slurm layout never builds today (it makes one per training
    pool, infra/scheduling/slurm.py partitions), as a changed layout or a hand-edited program could: a
    partition of the inference pool is refused for its pool and for its nodes, which serve inference (its
    hosts' names and addresses both); a partition of no pool of the stack is judged by its node list alone;
    one of a training pool whose nodes are its own passes."""
    onprem = shipped_platforms["onprem"]
    made = [
        _partition("serving", "infer", []),
        _partition("stray", "gone", ["gpu-21", "10.40.2.21", "gpu-01"]),
        _partition("train", "train", ["gpu-01", "gpu-02"]),
    ]
    monkeypatch.setattr(isolation, "partitions", _layout(onprem, made))
    found = list(check_partitions(ResourceIndex([]), PolicyContext(onprem)))
    assert [(f.resource, f.message) for f in found] == [
        (
            "partition serving",
            "Slurm partition 'serving' is built from infer pool 'infer'; partitions hold training nodes only",
        ),
        (
            "partition serving",
            "Slurm partition 'serving' includes 10.40.2.21, which also serve inference pool infer: training "
            "jobs would land on serving nodes",
        ),
        (
            "partition stray",
            "Slurm partition 'stray' includes 10.40.2.21, gpu-21, which also serve inference pool infer: "
            "training jobs would land on serving nodes",
        ),
    ]


def test_a_partition_over_two_inference_pools_names_both(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes of two inference pools in one partition: each node once, sorted, and both pools, sorted; an
    inference pool's node names count as well as its hosts (cloud pools have no hosts)."""
    aws = shipped_platforms["aws-prod"]
    infer = aws.pool("infer")
    second = replace(infer, spec=infer.spec.model_copy(update={"name": "chat"}))
    platform = replace(aws, pools=(*aws.pools, second))
    made = [_partition("mixed", "train", ["infer-1", "chat-0", "train-0", "infer-1"])]
    monkeypatch.setattr(isolation, "partitions", _layout(platform, made))
    found = list(check_partitions(ResourceIndex([]), PolicyContext(platform)))
    assert [(f.resource, f.message) for f in found] == [
        (
            "partition mixed",
            "Slurm partition 'mixed' includes chat-0, infer-1, which also serve inference pool chat, infer: "
            "training jobs would land on serving nodes",
        )
    ]
