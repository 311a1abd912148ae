"""Node groups: each Auto Scaling group with what it launches into, its pool and its role."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.policy.rules.base import PolicyContext, _get, _number
from infra.policy.rules.resource_types import (
    ASG,
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    SUBNET,
)
from infra.policy.view import TAG_POOL, TAG_ROLE, ResourceIndex, ResourceView
from infra.resolve import ResolvedPool


@dataclass(frozen=True)
class NodeGroup:
    """An Auto Scaling group and what it launches into: template, placement group, subnets, groups."""

    asg: ResourceView
    role: str | None
    pool: str | None
    templates: list[ResourceView]
    placement_groups: list[ResourceView]
    subnets: list[ResourceView]
    security_groups: list[ResourceView]

    @property
    def max_size(self) -> int:
        return int(_number(self.asg.props.get("maxSize")))

    @property
    def min_size(self) -> int:
        return int(_number(self.asg.props.get("minSize")))

    @property
    def mixed(self) -> Mapping[str, Any] | None:
        value = self.asg.props.get("mixedInstancesPolicy")
        return value if isinstance(value, Mapping) else None

    @property
    def on_demand_base(self) -> int:
        """Instances launched on-demand before any spot: all of them without a mixed policy."""
        if self.mixed is None:
            return self.max_size
        return int(_number(_get(self.mixed, "instancesDistribution", "onDemandBaseCapacity")))

    @property
    def on_demand_percentage_above_base(self) -> float:
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


def node_groups(index: ResourceIndex, ctx: PolicyContext | None = None) -> list[NodeGroup]:
    """Every Auto Scaling group with its pool and role: from the gpuplat tags, else the launch template's
    tags, else the parent component (`<stack>-<pool>`) matched against the platform's pools."""
    groups = []
    for asg in index.of_type(ASG):
        templates = index.referenced(asg, "launchTemplate", "mixedInstancesPolicy", type_=LAUNCH_TEMPLATE)
        role = asg.tag(TAG_ROLE) or next((t.tag(TAG_ROLE) for t in templates if t.tag(TAG_ROLE)), None)
        pool = asg.tag(TAG_POOL) or next((t.tag(TAG_POOL) for t in templates if t.tag(TAG_POOL)), None)
        platform = ctx.platform if ctx else None
        if platform is not None and (pool is None or role is None):
            for candidate in platform.pools:
                if asg.parent_name == f"{platform.name}-{candidate.name}":
                    pool = pool or candidate.name
                    role = role or candidate.role
        groups.append(
            NodeGroup(
                asg=asg,
                role=role,
                pool=pool,
                templates=templates,
                placement_groups=index.referenced(asg, "placementGroup", type_=PLACEMENT_GROUP),
                subnets=index.referenced(asg, "vpcZoneIdentifiers", type_=SUBNET),
                security_groups=[sg for t in templates for sg in _interfaces_security_groups(index, t)],
            )
        )
    return groups


def _group_of(groups: list[NodeGroup], pool: str) -> NodeGroup | None:
    return next((g for g in groups if g.pool == pool), None)


def _pool_target(groups: list[NodeGroup], pool: ResolvedPool) -> tuple[str, str | None]:
    group = _group_of(groups, pool.name)
    if group is not None:
        return group.asg.name, group.asg.urn or None
    return f"pool {pool.name}", None
