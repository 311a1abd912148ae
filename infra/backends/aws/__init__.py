"""AWS backend: network, identities, storage and GPU node pools composed from one resolved platform."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from infra.backends.aws.iam import NodeIdentity, NodeIdentityArgs
from infra.backends.aws.network import GpuNetwork, NetworkArgs
from infra.backends.aws.node_pool import GpuNodePool, GpuNodePoolArgs
from infra.backends.aws.storage import (
    BucketArgs,
    ObjectStore,
    ObjectStoreArgs,
    ParallelFilesystem,
    ParallelFilesystemArgs,
)
from infra.backends.aws.tags import base_tags, pool_tags
from infra.backends.base import common_outputs
from infra.inventory import aws_ec2_config, platform_vars
from infra.resolve import ResolvedPlatform

_REPOSITORY_PURPOSES = ("datasets", "checkpoints")


class AwsBackend:
    def declare(self, platform: ResolvedPlatform) -> dict[str, Any]:
        spec = platform.spec
        assert spec.region is not None  # enforced by the spec
        tags = base_tags(platform)
        network = GpuNetwork(
            platform.name,
            NetworkArgs(
                cidr=spec.aws.vpc_cidr,
                region=spec.region,
                zones=list(spec.zones),
                gateway_port=spec.aws.gateway_port,
                model_server_port=spec.aws.model_server_port,
                tags=tags,
            ),
        )
        store = ObjectStore(
            f"{platform.name}-objects",
            ObjectStoreArgs(
                stack=platform.name,
                buckets=[
                    BucketArgs(b.purpose, b.noncurrent_retention_days)
                    for b in spec.storage.object_store.buckets
                ],
                tags=tags,
            ),
        )
        bucket_arns = {purpose: bucket.arn for purpose, bucket in store.buckets.items()}
        identities = {
            role: NodeIdentity(f"{platform.name}-{role}", NodeIdentityArgs(role, bucket_arns, tags))
            for role in sorted({p.role for p in platform.pools})
        }
        image_id: pulumi.Input[str] = (
            spec.aws.image_id or aws.ssm.get_parameter_output(name=spec.aws.image_ssm_parameter).value
        )
        for pool in platform.pools:
            GpuNodePool(
                f"{platform.name}-{pool.name}",
                GpuNodePoolArgs(
                    pool=pool.spec,
                    node_type=pool.node_type,
                    image_id=image_id,
                    subnet_ids=[s.id for s in network.private_subnets],
                    security_group_id=network.security_groups[pool.role].id,
                    instance_profile_arn=identities[pool.role].profile.arn,
                    root_volume_gib=spec.aws.root_volume_gib,
                    efa=pool.role == "train" and spec.fabric.kind == "efa",
                    tags=pool_tags(platform, pool),
                ),
            )
        outputs = common_outputs(platform)
        outputs["buckets"] = {purpose: bucket.bucket for purpose, bucket in store.buckets.items()}
        layout = platform.lustre_layout
        if layout is not None:
            filesystem = ParallelFilesystem(
                f"{platform.name}-fs",
                ParallelFilesystemArgs(
                    layout=layout,
                    subnet_id=network.private_subnets[0].id,
                    security_group_id=network.security_groups["lustre"].id,
                    repositories={
                        f"/{purpose}": store.buckets[purpose].bucket
                        for purpose in _REPOSITORY_PURPOSES
                        if purpose in store.buckets
                    },
                    tags=tags,
                ),
            )
            outputs["fsx_dns_name"] = filesystem.filesystem.dns_name
            outputs["fsx_mount_name"] = filesystem.filesystem.mount_name
        outputs["inventory_config"] = aws_ec2_config(platform)
        outputs["group_vars"] = platform_vars(platform)
        return outputs
