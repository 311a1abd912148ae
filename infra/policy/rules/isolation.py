"""Isolation rules: training and inference share no resources, partitions or untainted nodes."""

from __future__ import annotations

from collections.abc import Iterator

from infra.policy.rules.base import Finding, PolicyContext
from infra.policy.rules.nodes import _interfaces_security_groups, node_groups
from infra.policy.rules.resource_types import LAUNCH_TEMPLATE, PLACEMENT_GROUP, SECURITY_GROUP
from infra.policy.view import TAG_ROLE, ResourceIndex, ResourceView
from infra.scheduling.slurm import partitions


def check_shared_resources(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    roles: dict[str, set[str]] = {}
    users: dict[str, dict[str, set[str]]] = {}
    views: dict[str, ResourceView] = {}

    def mark(resource: ResourceView, role: str | None, user: str) -> None:
        if role not in ("train", "infer"):
            return
        key = resource.urn or resource.name
        views[key] = resource
        roles.setdefault(key, set()).add(role)
        users.setdefault(key, {}).setdefault(role, set()).add(user)

    for group in node_groups(index, ctx):
        shared = [*group.templates, *group.placement_groups, *group.security_groups]
        if ctx.config.isolate_subnets:
            shared += group.subnets
        for resource in shared:
            mark(resource, group.role, group.anchor.name)
    for resource in index.of_type(LAUNCH_TEMPLATE, SECURITY_GROUP, PLACEMENT_GROUP):
        mark(resource, resource.tag(TAG_ROLE), f"its {TAG_ROLE} tag")
    for template in index.of_type(LAUNCH_TEMPLATE):
        for sg in _interfaces_security_groups(index, template):
            mark(sg, template.tag(TAG_ROLE), template.name)
    for key, served in sorted(roles.items()):
        if {"train", "infer"} <= served:
            resource = views[key]
            kind = resource.type.rsplit(":", 1)[-1]
            yield Finding(
                resource.name,
                f"{kind} {resource.name!r} serves both training and inference "
                f"(training: {', '.join(sorted(users[key]['train']))}; inference: "
                f"{', '.join(sorted(users[key]['infer']))}): training traffic and noisy neighbours reach "
                "latency-bound serving",
                resource.urn or None,
            )


def check_partitions(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    inference: dict[str, str] = {}
    for pool in platform.pools_with_role("infer"):
        for host in pool.spec.hosts:
            inference[host.address] = pool.name
            inference[host.name] = pool.name
        for node in pool.node_names():
            inference.setdefault(node, pool.name)
    by_name = {p.name: p for p in platform.pools}
    for partition in partitions(platform):
        source = by_name.get(partition.pool)
        if source is not None and source.role != "train":
            yield Finding(
                f"partition {partition.name}",
                f"Slurm partition {partition.name!r} is built from {source.role} pool {source.name!r}; "
                "partitions hold training nodes only",
            )
        nodes = set(partition.nodes)
        if source is not None:
            nodes |= {h.address for h in source.spec.hosts}
        overlap = sorted(n for n in nodes if n in inference)
        if overlap:
            pools = sorted({inference[n] for n in overlap})
            yield Finding(
                f"partition {partition.name}",
                f"Slurm partition {partition.name!r} includes {', '.join(overlap)}, which also serve "
                f"inference pool {', '.join(pools)}: training jobs would land on serving nodes",
            )


def check_inference_taint(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    label = ctx.config.inference_label
    for pool in platform.pools_with_role("infer"):
        if any(t.effect in ("NoSchedule", "NoExecute") for t in pool.spec.taints):
            continue
        if label is not None:
            key, _, value = label.partition("=")
            if pool.spec.labels.get(key) == value:
                continue
        missing = "no NoSchedule or NoExecute taint" + (f" and not the label {label}" if label else "")
        yield Finding(
            f"pool {pool.name}",
            f"inference pool {pool.name!r} has {missing}: nothing keeps training jobs off its nodes",
        )
