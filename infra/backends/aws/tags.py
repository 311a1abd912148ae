"""Tags every AWS resource carries; the pool tags are what Ansible's aws_ec2 inventory keys on."""

from __future__ import annotations

from infra.nodes.inventory import TAG_GROUP, TAG_POOL, TAG_ROLE, TAG_STACK, pool_group
from infra.platform.resolve import ResolvedPlatform, ResolvedPool


def base_tags(platform: ResolvedPlatform) -> dict[str, str]:
    return {
        TAG_STACK: platform.name,
        **platform.spec.tags.as_dict(),
        "environment": platform.spec.environment,
    }


def pool_tags(platform: ResolvedPlatform, pool: ResolvedPool) -> dict[str, str]:
    return {
        **base_tags(platform),
        TAG_POOL: pool.name,
        TAG_ROLE: pool.role,
        TAG_GROUP: pool_group(pool.name),
        "Name": f"{platform.name}-{pool.name}",
    }
