"""Node groups: the resources a pool's nodes are launched from, with their pool, role and size.

Two kinds of node group exist on aws:
- an Auto Scaling group (inference and service pools): its size, zones, placement group and spot split
  are the group's properties; its launch templates are the ones it references;
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

from infra.policy.rules.base import PolicyContext, _get, _number
from infra.policy.rules.resource_types import (
    ASG,
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
from infra.resolve import ResolvedPool

GroupKind = Literal["asg", "slurm"]


@dataclass(frozen=True)
class NodeGroup:
    """The nodes of one pool and what they launch into: templates, placement groups, subnets, groups.

    `anchor` is the Auto Scaling group (kind `asg`) or the launch template Slurm launches from (kind
    `slurm`, then also the only entry of `templates`). `min_size`/`max_size` are the pool's size range
    as declared by the resources (for a Slurm pool, its tags; failing those, the stack's pool).
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
        return "Auto Scaling group" if self.kind == "asg" else "Slurm-managed launch template"

    @property
    def mixed(self) -> Mapping[str, Any] | None:
        """An Auto Scaling group's mixed instances policy (None for Slurm pools and plain groups)."""
        if self.kind != "asg":
            return None
        value = self.anchor.props.get("mixedInstancesPolicy")
        return value if isinstance(value, Mapping) else None

    @property
    def spot_market(self) -> bool:
        """A Slurm pool's template requests spot instances (instanceMarketOptions.marketType spot)."""
        return self.kind == "slurm" and _get(self.anchor.props, "instanceMarketOptions", "marketType") in (
            "spot",
            UNKNOWN,
        )

    @property
    def on_demand_base(self) -> int:
        """Instances launched on-demand before any spot: all of them unless spot is asked for."""
        if self.kind == "slurm":
            return 0 if self.spot_market else self.max_size
        if self.mixed is None:
            return self.max_size
        return int(_number(_get(self.mixed, "instancesDistribution", "onDemandBaseCapacity")))

    @property
    def on_demand_percentage_above_base(self) -> float:
        if self.kind == "slurm":
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


def node_groups(index: ResourceIndex, ctx: PolicyContext | None = None) -> list[NodeGroup]:
    """Every node group with its pool and role: the Auto Scaling groups, then the Slurm-managed training
    templates. Pool and role come from the gpuplat tags (the group's, else its templates'), else from the
    parent component (`<stack>-<pool>`) matched against the platform's pools."""
    groups = []
    launched: set[str] = set()  # templates some Auto Scaling group launches from
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
