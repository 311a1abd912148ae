"""Node groups: the resources a pool's nodes are launched from, with their pool, role and size.

Three kinds of node group exist on aws:
- an Auto Scaling group (inference and service pools): its size, zones, placement group and spot split
  are the group's properties; its launch templates are the ones it references;
- an EKS managed node group (scheduler.kind kueue): its size is its `scalingConfig`, its market its
  `capacityType`, its zones its `subnetIds`; its launch template (referenced by `launchTemplate.id`)
  carries the placement group, the network interfaces and the security groups;
- a Slurm-managed training pool (ParallelCluster-style power saving): a launch template of role train
  that no Auto Scaling group references. Slurm's ResumeProgram launches instances from it with
  RunInstances, so the template itself carries what the group would: the size range (tags
  `gpuplat:min-nodes` / `gpuplat:max-nodes`), the placement group (`placement.groupName`), the subnet
  and security groups (`networkInterfaces`), and the market (`instanceMarketOptions`).

Rules read the same properties from either kind; `anchor` is the resource a finding names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE
from infra.platform.resolve import ResolvedPool
from infra.policy.rules.base import PolicyContext, _get, _number
from infra.policy.rules.resource_types import (
    ASG,
    EKS_NODE_GROUP,
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    SUBNET,
)
from infra.policy.view import (
    TAG_MAX_NODES,
    TAG_MIN_NODES,
    TAG_POOL,
    TAG_ROLE,
    UNKNOWN,
    ResourceIndex,
    ResourceView,
)

GroupKind = Literal["asg", "eks", "slurm"]
_DESCRIPTIONS = {
    "asg": "Auto Scaling group",
    "eks": "EKS managed node group",
    "slurm": "Slurm-managed launch template",
}


@dataclass(frozen=True)
class NodeGroup:
    """The nodes of one pool and what they launch into: templates, placement groups, subnets, groups.

    `anchor` is the Auto Scaling group (kind `asg`), the EKS managed node group (kind `eks`) or the
    launch template Slurm launches from (kind `slurm`, then also the only entry of `templates`).
    `min_size`/`max_size` are the pool's size range as declared by the resources (for a Slurm pool, its
    tags; failing those, the stack's pool).
    """

    anchor: ResourceView
    kind: GroupKind
    role: str | None
    pool: str | None
    templates: list[ResourceView]
    placement_groups: list[ResourceView]
    subnets: list[ResourceView]
    security_groups: list[ResourceView]
    min_size: int
    max_size: int

    @property
    def description(self) -> str:
        """What the anchor is, for messages."""
        return _DESCRIPTIONS[self.kind]

    @property
    def mixed(self) -> Mapping[str, Any] | None:
        """An Auto Scaling group's mixed instances policy (None for Slurm pools and plain groups)."""
        if self.kind != "asg":
            return None
        value = self.anchor.props.get("mixedInstancesPolicy")
        return value if isinstance(value, Mapping) else None

    @property
    def spot_market(self) -> bool:
        """A Slurm pool's template requests spot instances (instanceMarketOptions.marketType spot), or an
        EKS node group's capacity type is SPOT."""
        if self.kind == "eks":
            return self.anchor.props.get("capacityType") in ("SPOT", UNKNOWN)
        return self.kind == "slurm" and _get(self.anchor.props, "instanceMarketOptions", "marketType") in (
            "spot",
            UNKNOWN,
        )

    @property
    def on_demand_base(self) -> int:
        """Instances launched on-demand before any spot: all of them unless spot is asked for."""
        if self.kind != "asg":
            return 0 if self.spot_market else self.max_size
        if self.mixed is None:
            return self.max_size
        return int(_number(_get(self.mixed, "instancesDistribution", "onDemandBaseCapacity")))

    @property
    def on_demand_percentage_above_base(self) -> float:
        if self.kind != "asg":
            return 0.0 if self.spot_market else 100.0
        if self.mixed is None:
            return 100.0
        value = _get(self.mixed, "instancesDistribution", "onDemandPercentageAboveBaseCapacity")
        return 100.0 if value is None else _number(value, 100.0)

    @property
    def reserved(self) -> bool:
        return any(
            _get(t.props, "capacityReservationSpecification", "capacityReservationTarget") is not None
            for t in self.templates
        )


def _interfaces_security_groups(index: ResourceIndex, template: ResourceView) -> list[ResourceView]:
    return index.referenced(
        template, "networkInterfaces", "vpcSecurityGroupIds", "securityGroupNames", type_=SECURITY_GROUP
    )


def _component_pool(resource: ResourceView, ctx: PolicyContext | None) -> ResolvedPool | None:
    """The stack's pool whose component (`<stack>-<pool>`) is the resource's parent."""
    platform = ctx.platform if ctx else None
    if platform is None:
        return None
    return next((p for p in platform.pools if resource.parent_name == f"{platform.name}-{p.name}"), None)


def _size_tag(template: ResourceView, key: str, fallback: int) -> int:
    value = template.tag(key)
    if value is None or value == UNKNOWN:
        return fallback
    return int(_number(value, fallback))


def _labels(resource: ResourceView) -> Mapping[str, Any]:
    labels = resource.props.get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _eks_node_group(index: ResourceIndex, group: ResourceView, ctx: PolicyContext | None) -> NodeGroup:
    """An EKS managed node group: pool and role from its gpuplat tags, else its node labels, else its
    templates' tags, else its parent component."""
    templates = index.referenced(group, "launchTemplate", type_=LAUNCH_TEMPLATE)
    labels = _labels(group)
    role = group.tag(TAG_ROLE) or labels.get(LABEL_ROLE)
    role = role or next((t.tag(TAG_ROLE) for t in templates if t.tag(TAG_ROLE)), None)
    pool = group.tag(TAG_POOL) or labels.get(LABEL_POOL)
    pool = pool or next((t.tag(TAG_POOL) for t in templates if t.tag(TAG_POOL)), None)
    if pool is None or role is None:
        candidate = _component_pool(group, ctx)
        if candidate is not None:
            pool = pool or candidate.name
            role = role or candidate.role
    scaling = group.props.get("scalingConfig")
    return NodeGroup(
        anchor=group,
        kind="eks",
        role=str(role) if role is not None else None,
        pool=str(pool) if pool is not None else None,
        templates=templates,
        placement_groups=[
            pg for t in templates for pg in index.referenced(t, "placement", type_=PLACEMENT_GROUP)
        ],
        subnets=index.referenced(group, "subnetIds", type_=SUBNET),
        security_groups=[sg for t in templates for sg in _interfaces_security_groups(index, t)],
        min_size=int(_number(_get(scaling, "minSize"))),
        max_size=int(_number(_get(scaling, "maxSize"))),
    )


def node_groups(index: ResourceIndex, ctx: PolicyContext | None = None) -> list[NodeGroup]:
    """Every node group with its pool and role: the Auto Scaling groups, the EKS managed node groups,
    then the Slurm-managed training templates. Pool and role come from the gpuplat tags (the group's,
    else its templates'), else from the parent component (`<stack>-<pool>`) matched against the
    platform's pools.

    Eight rules ask for them: they are found once per index and platform (ResourceIndex.derived), each
    caller getting its own list. Finding them reads every template's network interfaces (32 on a
    p5.48xlarge), the most of a check's time at 50 pools when each rule found them again."""
    platform = ctx.platform if ctx is not None else None
    return list(index.derived("node_groups", platform, lambda: _node_groups(index, ctx)))


def _node_groups(index: ResourceIndex, ctx: PolicyContext | None) -> list[NodeGroup]:
    groups = []
    launched: set[str] = set()  # templates some Auto Scaling group or EKS node group launches from
    for asg in index.of_type(ASG):
        templates = index.referenced(asg, "launchTemplate", "mixedInstancesPolicy", type_=LAUNCH_TEMPLATE)
        launched |= {t.urn or t.name for t in templates}
        role = asg.tag(TAG_ROLE) or next((t.tag(TAG_ROLE) for t in templates if t.tag(TAG_ROLE)), None)
        pool = asg.tag(TAG_POOL) or next((t.tag(TAG_POOL) for t in templates if t.tag(TAG_POOL)), None)
        if pool is None or role is None:
            candidate = _component_pool(asg, ctx)
            if candidate is not None:
                pool = pool or candidate.name
                role = role or candidate.role
        groups.append(
            NodeGroup(
                anchor=asg,
                kind="asg",
                role=role,
                pool=pool,
                templates=templates,
                placement_groups=index.referenced(asg, "placementGroup", type_=PLACEMENT_GROUP),
                subnets=index.referenced(asg, "vpcZoneIdentifiers", type_=SUBNET),
                security_groups=[sg for t in templates for sg in _interfaces_security_groups(index, t)],
                min_size=int(_number(asg.props.get("minSize"))),
                max_size=int(_number(asg.props.get("maxSize"))),
            )
        )
    for resource in index.of_type(EKS_NODE_GROUP):
        group = _eks_node_group(index, resource, ctx)
        launched |= {t.urn or t.name for t in group.templates}
        groups.append(group)
    for template in index.of_type(LAUNCH_TEMPLATE):
        if (template.urn or template.name) in launched:
            continue
        candidate = _component_pool(template, ctx)
        role = template.tag(TAG_ROLE) or (candidate.role if candidate else None)
        if role != "train":
            continue
        pool = template.tag(TAG_POOL) or (candidate.name if candidate else None)
        if candidate is None and pool is not None and ctx is not None and ctx.platform is not None:
            candidate = next((p for p in ctx.platform.pools if p.name == pool), None)
        groups.append(
            NodeGroup(
                anchor=template,
                kind="slurm",
                role=role,
                pool=pool,
                templates=[template],
                placement_groups=index.referenced(template, "placement", type_=PLACEMENT_GROUP),
                subnets=index.referenced(template, "networkInterfaces", "subnetId", type_=SUBNET),
                security_groups=_interfaces_security_groups(index, template),
                min_size=_size_tag(template, TAG_MIN_NODES, candidate.spec.min_nodes if candidate else 0),
                max_size=_size_tag(template, TAG_MAX_NODES, candidate.spec.max_nodes if candidate else 0),
            )
        )
    return groups


def _group_of(groups: list[NodeGroup], pool: str) -> NodeGroup | None:
    return next((g for g in groups if g.pool == pool), None)


def _pool_target(groups: list[NodeGroup], pool: ResolvedPool) -> tuple[str, str | None]:
    group = _group_of(groups, pool.name)
    if group is not None:
        return group.anchor.name, group.anchor.urn or None
    return f"pool {pool.name}", None
