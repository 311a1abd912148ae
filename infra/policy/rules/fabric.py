"""Fabric rules: RDMA on every NIC of multi-node training, cluster placement, EFA security groups."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from infra.data.load import catalog
from infra.policy.rules.base import Finding, PolicyContext, _get, _items, _stack_label, _truthy
from infra.policy.rules.nodes import _group_of, node_groups
from infra.policy.rules.resource_types import (
    EGRESS_RULE,
    INGRESS_RULE,
    LAUNCH_TEMPLATE,
    SECURITY_GROUP,
    SG_RULE,
)
from infra.policy.view import ResourceIndex, ResourceView


def _is_efa(interface: Any) -> bool:
    return bool(_get(interface, "interfaceType") == "efa")


def check_multi_node_rdma(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    groups = node_groups(index, ctx)
    for group in groups:
        if group.role != "train" or group.max_size <= 1:
            continue
        for template in group.templates:
            instance_type = str(template.props.get("instanceType", ""))
            node_type = catalog().get(instance_type)
            if node_type is None:
                continue
            interfaces = [i for i in _items(template.props.get("networkInterfaces")) if _is_efa(i)]
            if node_type.network.fabric != "efa":
                yield Finding(
                    template.name,
                    f"training group {group.anchor.name!r} scales to {group.max_size} nodes on "
                    f"{instance_type}, which has no RDMA ({node_type.network.fabric}, no EFA): NCCL falls "
                    "back to TCP between nodes",
                    template.urn or None,
                )
            elif len(interfaces) < node_type.network.nics:
                effect = "over TCP" if not interfaces else "at a fraction of the fabric bandwidth"
                yield Finding(
                    template.name,
                    f"training group {group.anchor.name!r} scales to {group.max_size} nodes but its launch "
                    f"template attaches {len(interfaces)} of the {node_type.network.nics} EFA interfaces "
                    f"{instance_type} has: NCCL runs {effect}",
                    template.urn or None,
                )
    platform = ctx.platform
    if platform is not None and platform.spec.backend == "aws":
        # judged on the resources above; a pool whose nodes no resource declares (yet) on the stack
        for pool in platform.pools_with_role("train"):
            nic = pool.node_type.network.fabric
            if pool.spec.max_nodes > 1 and nic != "efa" and _group_of(groups, pool.name) is None:
                yield Finding(
                    f"pool {pool.name}",
                    f"training pool {pool.name!r} scales to {pool.spec.max_nodes} nodes on "
                    f"{pool.node_type.name}, which has no RDMA ({nic}, no EFA): NCCL falls back to TCP "
                    "between nodes",
                )
    if platform is None or platform.spec.backend != "onprem":
        return  # local: simulated GPUs, no fabric to have
    fabric = platform.spec.fabric.kind
    for pool in platform.pools_with_role("train"):
        if pool.spec.max_nodes <= 1:
            continue
        nic = pool.node_type.network.fabric
        if fabric not in ("infiniband", "roce") or nic not in ("infiniband", "roce"):
            yield Finding(
                f"pool {pool.name}",
                f"training pool {pool.name!r} has {pool.spec.max_nodes} nodes but fabric {fabric!r} on "
                f"{nic} NICs: multi-node training needs RDMA (InfiniBand or RoCE) on every one of the "
                f"{pool.node_type.network.nics} NICs {pool.node_type.name} lists",
            )


def check_cluster_placement(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    for group in node_groups(index, ctx):
        if group.role != "train" or group.max_size <= 1:
            continue
        strategies = [str(pg.props.get("strategy", "")) for pg in group.placement_groups]
        if "cluster" not in strategies:
            found = (
                f"placement group strategy {', '.join(strategies)}" if strategies else "no placement group"
            )
            yield Finding(
                group.anchor.name,
                f"training group {group.anchor.name!r} scales to {group.max_size} nodes with {found}: EFA "
                "traffic between nodes needs them in one cluster placement group",
                group.anchor.urn or None,
            )
    platform = ctx.platform
    if platform is not None and platform.spec.backend == "aws":
        placement = platform.spec.fabric.placement
        multi = [p.name for p in platform.pools_with_role("train") if p.spec.max_nodes > 1]
        if multi and placement != "cluster":
            yield Finding(
                _stack_label(ctx),
                f"fabric.placement is {placement!r} while training pools {', '.join(multi)} span several "
                "nodes: they need cluster placement for full EFA bandwidth",
            )


def _rule_targets(index: ResourceIndex, rule: ResourceView, sg: ResourceView) -> bool:
    protocol = str(rule.props.get("ipProtocol", rule.props.get("protocol", "")))
    if protocol not in ("-1", "all"):
        return False
    return index.refers_to(rule, sg, "securityGroupId") and bool(
        index.refers_to(rule, sg, "referencedSecurityGroupId", "sourceSecurityGroupId")
        or _truthy(rule.props.get("self"))
    )


def _inline_self(sg: ResourceView, direction: str) -> bool:
    return any(
        _truthy(_get(item, "self")) and str(_get(item, "protocol")) in ("-1", "all")
        for item in _items(sg.props.get(direction))
    )


def check_efa_security_group(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    efa_groups: dict[str, ResourceView] = {}
    for template in index.of_type(LAUNCH_TEMPLATE):
        for interface in _items(template.props.get("networkInterfaces")):
            if not _is_efa(interface):
                continue
            single = replace(template, props={"networkInterfaces": [interface]})
            for sg in index.referenced(single, "networkInterfaces", type_=SECURITY_GROUP):
                efa_groups[sg.urn or sg.name] = sg
    sg_rules = index.of_type(SG_RULE)
    for sg in efa_groups.values():
        for direction, rule_type, label in (
            ("ingress", INGRESS_RULE, "inbound traffic from"),
            ("egress", EGRESS_RULE, "outbound traffic to"),
        ):
            candidates = index.of_type(rule_type) + [r for r in sg_rules if r.props.get("type") == direction]
            if _inline_self(sg, direction) or any(_rule_targets(index, r, sg) for r in candidates):
                continue
            yield Finding(
                sg.name,
                f"security group {sg.name!r} carries EFA interfaces but has no rule allowing all {label} "
                "itself: EFA's OS-bypass traffic is dropped and NCCL hangs or falls back",
                sg.urn or None,
            )
