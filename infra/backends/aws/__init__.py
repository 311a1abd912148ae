"""AWS backend: network, identities, storage, the node bootstrap and the node pools, from one resolved
platform. How nodes boot and join: infra/backends/aws/bootstrap.py; who launches them: node_pool.py.
With scheduler.kind kueue the pools are an EKS cluster's node groups instead (infra/backends/aws/eks.py)."""

from __future__ import annotations

import base64
import functools
import json
import math
import secrets
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.backends.aws.bootstrap import (
    GROUP_VARS_KEY,
    BootScript,
    bundle_files,
    bundle_key,
    launched_through_fleet,
    munge_parameter,
    node_group_vars,
    node_inventory,
    serving_replicas,
    serving_version_parameter,
    settings_digest,
)
from infra.backends.aws.controller_nodes import ControllerNodes, ControllerNodesArgs, controller_addresses
from infra.backends.aws.gateway import GatewayEndpoint, GatewayEndpointArgs
from infra.backends.aws.iam import (
    AccountScope,
    NodeIdentity,
    NodeIdentityArgs,
    bootstrap_statements,
    cluster_manager_statements,
    inference_node_statements,
    munge_key_denied_statements,
    munge_key_statements,
    policy_document,
    serving_version_statements,
)
from infra.backends.aws.network import GpuNetwork, NetworkArgs
from infra.backends.aws.node_image import ImageBuildIdentity, ImageBuildScript, NodeImage, NodeImageArgs
from infra.backends.aws.node_pool import GpuNodePool, GpuNodePoolArgs
from infra.backends.aws.storage import (
    BucketArgs,
    ObjectStore,
    ObjectStoreArgs,
    ParallelFilesystem,
    ParallelFilesystemArgs,
    stack_object_uri,
)
from infra.backends.aws.tags import base_tags, pool_tags
from infra.backends.base import common_outputs
from infra.nodes.inventory import aws_ec2_config, platform_vars
from infra.nodes.munge import munge_roles, runs_munge
from infra.nodes.role_templates import role_defaults
from infra.platform import zones
from infra.platform.boot_time import expected_boot_s
from infra.platform.resolve import ResolvedPlatform, ResolvedPool, image_parameter
from infra.platform.serving_layout import startup_budget_s
from infra.spec.defaults import os_release
from infra.spec.load import PROJECT_ROOT

_REPOSITORY_PURPOSES = ("datasets", "checkpoints")


def _version_record_policy(stack: str, role: str, scope: AccountScope) -> list[dict[str, Any]]:
    """A node role's statements on the stack's serving version record: the inference role reads it."""
    record = scope.ssm_parameter(serving_version_parameter(stack))
    return serving_version_statements(record, reader=role == "infer")


BOOTSTRAP_BUCKET = "bootstrap"
# The aws_ssm connection plugin moves files through a bucket with presigned URLs (the operator's
# credentials sign them; nodes need no S3 permission for it). Nothing there outlives a day.
SSM_TRANSFER_BUCKET = "ssm-transfer"
_PLATFORM_BUCKETS = (BucketArgs(BOOTSTRAP_BUCKET, 30), BucketArgs(SSM_TRANSFER_BUCKET, 1, expire_days=1))
MUNGE_KEY_BYTES = 1024


def _root_device(image_id: str) -> pulumi.Output[str]:
    """The image's root device name: the launch templates resize the volume mapped there."""
    ami = aws.ec2.get_ami_output(filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[image_id])])
    device: pulumi.Output[str] = ami.root_device_name
    return device


def _network(platform: ResolvedPlatform, tags: dict[str, str]) -> GpuNetwork:
    spec = platform.spec
    assert spec.region is not None  # enforced by the spec
    return GpuNetwork(
        platform.name,
        NetworkArgs(
            cidr=spec.aws.vpc_cidr,
            region=spec.region,
            zones=list(spec.zones),
            gateway_port=spec.aws.gateway_port,
            model_server_port=spec.aws.model_server_port,
            tags=tags,
            model_server_replicas=platform.serving_layout.replicas if platform.serving_layout else 1,
            canary_port=int(role_defaults("inference_server")["inference_server_canary_port"])
            if spec.serving is not None
            else None,
        ),
    )


def _object_store(
    platform: ResolvedPlatform, tags: dict[str, str], platform_buckets: tuple[BucketArgs, ...]
) -> ObjectStore:
    """The stack's buckets, and those the platform itself needs (`platform_buckets`)."""
    return ObjectStore(
        f"{platform.name}-objects",
        ObjectStoreArgs(
            stack=platform.name,
            buckets=[
                *(
                    BucketArgs(b.purpose, b.noncurrent_retention_days)
                    for b in platform.spec.storage.object_store.buckets
                ),
                *platform_buckets,
            ],
            tags=tags,
        ),
    )


def _filesystem(
    platform: ResolvedPlatform, network: GpuNetwork, store: ObjectStore, tags: dict[str, str]
) -> ParallelFilesystem | None:
    layout = platform.lustre_layout
    if layout is None:
        return None
    return ParallelFilesystem(
        f"{platform.name}-fs",
        ParallelFilesystemArgs(
            layout=layout,
            # Where the training GPUs are (one zone: FSx for Lustre serves from its subnet's zone).
            subnet_id=network.subnet_by_zone[zones.filesystem_zone(platform)].id,
            security_group_id=network.security_groups["lustre"].id,
            repositories={
                f"/{purpose}": store.buckets[purpose].bucket
                for purpose in _REPOSITORY_PURPOSES
                if purpose in store.buckets
            },
            tags=tags,
        ),
    )


def inference_warmup_s(platform: ResolvedPlatform, pool: ResolvedPool) -> int | None:
    """An inference node is capacity once it has booted (infra/platform/boot_time.py) and its replicas have
    loaded the model (infra/platform/serving_layout.py's start budget); until then its metrics would make
    target tracking add nodes while the first ones still load."""
    spec, layout = platform.spec, platform.serving_layout
    if pool.role != "infer" or spec.serving is None or layout is None:
        return None
    return expected_boot_s(spec) + startup_budget_s(spec.serving, layout, pool.node_type)


# How long the gateways take to see an instance leave (gpuplat-gateway-targets.timer runs every 15 s:
# twice that), and what the node's agent adds after its last request (completing the action).
GATEWAY_NOTICE_S = 30
DRAIN_MARGIN_S = 60


def inference_drain_timeout_s(platform: ResolvedPlatform, pool: ResolvedPool) -> int | None:
    """A leaving inference node is held until the gateways drained it and its longest request (the
    gateway's timeout) has ended."""
    serving = platform.spec.serving
    if pool.role != "infer" or serving is None:
        return None
    return GATEWAY_NOTICE_S + math.ceil(serving.gateway_timeout_s) + DRAIN_MARGIN_S


class AwsBackend:
    def declare(self, platform: ResolvedPlatform) -> dict[str, Any]:
        spec = platform.spec
        assert spec.region is not None  # enforced by the spec
        tags = base_tags(platform)
        network = _network(platform, tags)
        if spec.scheduler.kind == "kueue":
            return self._declare_kueue(platform, network, tags)
        store = _object_store(platform, tags, _PLATFORM_BUCKETS)
        bootstrap_bucket = store.buckets[BOOTSTRAP_BUCKET]
        # What nodes fetch when they boot: the MUNGE key, the bundle and the group vars.
        bootstrap = pulumi.ComponentResource("gpu-platform:aws:NodeBootstrap", f"{platform.name}-bootstrap")
        in_bootstrap = pulumi.ResourceOptions(parent=bootstrap)
        munge_key = aws.ssm.Parameter(
            f"{platform.name}-munge-key",
            name=munge_parameter(platform.name),
            type="SecureString",
            value=pulumi.Output.secret(base64.b64encode(secrets.token_bytes(MUNGE_KEY_BYTES)).decode()),
            description="MUNGE key of the stack's Slurm cluster (created once, never rotated by pulumi up)",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=bootstrap, ignore_changes=["value"]),
        )
        identities = self._identities(platform, store, bootstrap_bucket, munge_key, network.vpc.arn, tags)

        filesystem_source: pulumi.Input[str] = ""
        outputs = common_outputs(platform)
        filesystem = _filesystem(platform, network, store, tags)
        if filesystem is not None:
            outputs["fsx_dns_name"] = filesystem.filesystem.dns_name
            outputs["fsx_mount_name"] = filesystem.filesystem.mount_name
            filesystem_source = pulumi.Output.concat(
                filesystem.filesystem.dns_name, "@tcp:/", filesystem.filesystem.mount_name
            )

        image_id: pulumi.Input[str] = (
            spec.aws.image_id or aws.ssm.get_parameter_output(name=image_parameter(spec)).value
        )
        root_device: pulumi.Output[str] = pulumi.Output.from_input(image_id).apply(_root_device)
        key = bundle_key(PROJECT_ROOT)
        bundle = aws.s3.BucketObjectv2(
            f"{platform.name}-bundle",
            bucket=bootstrap_bucket.id,
            key=key,
            source=pulumi.AssetArchive(
                {name: pulumi.FileAsset(str(path)) for name, path in bundle_files(PROJECT_ROOT).items()}
            ),
            tags=tags,
            opts=in_bootstrap,
        )

        def boot_script(
            pool: ResolvedPool, node_name: str = "", bundle: str | None = None
        ) -> pulumi.Output[str]:
            script: pulumi.Output[str] = bootstrap_bucket.bucket.apply(
                lambda bucket: BootScript(
                    stack=platform.name,
                    region=str(spec.region),
                    bucket=bucket,
                    bundle_key=key if bundle is None else bundle,
                    inventory=node_inventory(platform, pool),
                    os_release=os_release(spec),
                    node_name=node_name,
                    fetch_munge_key=runs_munge(platform, pool),
                    serving_replicas=serving_replicas(platform, pool),
                    power_off_on_failure=pool.role == "train",
                    settings_digest=settings_digest(platform) if pool.role == "train" else "",
                ).render()
            )
            return script

        baked = {
            p.name
            for p in platform.pools
            if p.node_type.gpu_count and spec.aws.bake_images and not spec.aws.image_id
        }
        image_builds = (
            ImageBuildIdentity(
                f"{platform.name}-image-build",
                bootstrap_bucket.arn,
                munge_key.arn,
                tags,
                serving_record_arn=munge_key.arn.apply(
                    lambda arn: (
                        f"{arn.rsplit(':parameter/', 1)[0]}:parameter"
                        f"{serving_version_parameter(platform.name)}"
                    )
                )
                if spec.serving is not None
                else None,
            )
            if baked
            else None
        )
        # Every pool's build script carries the same platform values: resolved once, not once per pool (they
        # hold every training node's Slurm line, so per pool they cost pools x nodes).
        image_variables = platform_vars(platform) if baked else {}

        def pool_image(pool: ResolvedPool) -> pulumi.Input[str]:
            """The pool's node image (aws.bake_images, GPU pools), else the stack's image."""
            if image_builds is None or pool.name not in baked:
                return image_id
            build_script = bootstrap_bucket.bucket.apply(
                lambda bucket: ImageBuildScript(
                    region=str(spec.region),
                    bucket=bucket,
                    bundle_key=key,
                    inventory=node_inventory(platform, pool),
                    variables=image_variables,
                    os_release=os_release(spec),
                ).render()
            )
            return NodeImage(
                f"{platform.name}-{pool.name}",
                NodeImageArgs(
                    parent_image_id=image_id,
                    root_device=root_device,
                    build_script=build_script,
                    bundle_key=key,
                    instance_profile_name=image_builds.profile.name,
                    lifecycle_role_arn=image_builds.lifecycle_role_arn,
                    lifecycle_grant=image_builds.lifecycle_grant,
                    subnet_id=network.subnet_by_zone[zones.pool_zones(platform, pool)[0]].id,
                    security_group_id=network.security_groups[pool.role].id,
                    root_volume_gib=spec.aws.root_volume_gib,
                    tags=pool_tags(platform, pool),
                    build_after=[bundle],
                ),
            ).image_id

        def node_pool(pool: ResolvedPool, boot_after: list[pulumi.Resource]) -> GpuNodePool:
            return GpuNodePool(
                f"{platform.name}-{pool.name}",
                GpuNodePoolArgs(
                    pool=pool.spec,
                    node_type=pool.node_type,
                    image_id=pool_image(pool),
                    root_device=root_device,
                    subnet_ids=[network.subnet_by_zone[zone].id for zone in zones.pool_zones(platform, pool)],
                    security_group_id=network.security_groups[pool.role].id,
                    instance_profile_arn=identities[pool.role].profile.arn,
                    root_volume_gib=spec.aws.root_volume_gib,
                    efa=platform.uses_efa(pool),
                    placement=spec.fabric.placement if pool.role == "train" else "none",
                    tags=pool_tags(platform, pool),
                    user_data=boot_script(pool),
                    boot_after=boot_after,
                    instance_warmup_s=inference_warmup_s(platform, pool),
                    drain_timeout_s=inference_drain_timeout_s(platform, pool),
                    replicas_per_node=platform.serving_layout.replicas
                    if pool.role == "infer" and platform.serving_layout
                    else 1,
                ),
            )

        # Training pools first: the group vars name their launch templates. Everything that launches at
        # once (controllers, Auto Scaling groups) waits for the bundle and the group vars it fetches;
        # the group vars wait for the filesystem.
        controller = platform.controller_pool
        addresses = controller_addresses(
            controller.node_names(), zones.pool_zones(platform, controller), network.subnet_cidrs
        )
        templates = {
            pool.name: node_pool(pool, []).launch_template.id for pool in platform.pools_with_role("train")
        }
        template_names = sorted(templates)
        purposes = sorted(store.buckets)
        zone_names = sorted(network.subnet_by_zone)
        buckets_end = 1 + len(template_names) + len(purposes)
        group_vars = pulumi.Output.all(
            filesystem_source,
            *[templates[n] for n in template_names],
            *[store.buckets[p].bucket for p in purposes],
            *[network.subnet_by_zone[zone].id for zone in zone_names],
        ).apply(
            lambda values: node_group_vars(
                platform,
                values[0],
                addresses,
                dict(zip(template_names, values[1 : 1 + len(template_names)], strict=True)),
                dict(zip(purposes, values[1 + len(template_names) : buckets_end], strict=True)),
                key,
                subnet_by_zone=dict(zip(zone_names, values[buckets_end:], strict=True)),
            )
        )
        group_vars_object = aws.s3.BucketObjectv2(
            f"{platform.name}-group-vars",
            bucket=bootstrap_bucket.id,
            key=GROUP_VARS_KEY,
            content=group_vars.apply(lambda values: json.dumps(values, sort_keys=True, indent=1)),
            content_type="application/json",
            tags=tags,
            opts=in_bootstrap,
        )
        boot_after: list[pulumi.Resource] = [bundle, group_vars_object]
        controllers = ControllerNodes(
            f"{platform.name}-{controller.name}",
            ControllerNodesArgs(
                node_names=controller.node_names(),
                instance_type=controller.node_type.name,
                image_id=image_id,
                zones=zones.pool_zones(platform, controller),
                subnet_by_zone={zone: subnet.id for zone, subnet in network.subnet_by_zone.items()},
                subnet_cidrs=network.subnet_cidrs,
                security_group_id=network.security_groups[controller.role].id,
                instance_profile_name=identities[controller.role].profile.name,
                root_volume_gib=spec.aws.root_volume_gib,
                tags=pool_tags(platform, controller),
                # No bundle key in the controllers' user data: they boot from the group vars' (a
                # role change is no user data change, so no stop and start; bootstrap.BootScript).
                user_data={
                    node: boot_script(controller, node, bundle="") for node in controller.node_names()
                },
                boot_after=boot_after,
            ),
        )
        groups: dict[str, pulumi.Output[str]] = {}
        for pool in platform.pools:
            if pool.name == controller.name or pool.role == "train":
                continue
            group = node_pool(pool, boot_after).group
            if group is not None:
                groups[pool.name] = group.name
        if spec.serving is not None:
            gateway = platform.gateway_pool
            endpoint = GatewayEndpoint(
                f"{platform.name}-gateway",
                GatewayEndpointArgs(
                    vpc_id=network.vpc.id,
                    subnet_ids=[subnet.id for subnet in network.private_subnets],
                    port=spec.aws.gateway_port,
                    instance_ids=(
                        [i.id for i in controllers.instances.values()]
                        if gateway.name == controller.name
                        else []
                    ),
                    group_names=[groups[gateway.name]] if gateway.name in groups else [],
                    tags=tags,
                ),
            )
            outputs["gateway_endpoint"] = pulumi.Output.concat(
                "http://", endpoint.balancer.dns_name, f":{spec.aws.gateway_port}/v1"
            )

        bootstrap.register_outputs({"bundle_key": key})
        outputs["buckets"] = {purpose: bucket.bucket for purpose, bucket in store.buckets.items()}
        outputs["controller_addresses"] = addresses
        outputs["bootstrap_bundle"] = key
        outputs["inventory_config"] = store.buckets[SSM_TRANSFER_BUCKET].bucket.apply(
            lambda bucket: aws_ec2_config(platform, bucket)
        )
        outputs["group_vars"] = group_vars
        return outputs

    def _declare_kueue(
        self, platform: ResolvedPlatform, network: GpuNetwork, tags: dict[str, str]
    ) -> dict[str, Any]:
        """An EKS cluster whose node groups are the pools, and the Kubernetes layer on it. Nothing of
        Slurm: no controllers, MUNGE key, bootstrap bundle or launch permissions."""
        from infra.backends.aws.eks import EksCluster, EksClusterArgs
        from infra.k8s.facts import ClusterFacts, SharedVolume
        from infra.k8s.resources import declare_layer

        spec = platform.spec
        store = _object_store(platform, tags, ())
        filesystem = _filesystem(platform, network, store, tags)
        assert filesystem is not None  # aws offers fsx-lustre only (the spec's filesystems by backend)
        eks = EksCluster(
            f"{platform.name}-eks",
            EksClusterArgs(
                platform=platform,
                subnet_by_zone={zone: subnet.id for zone, subnet in network.subnet_by_zone.items()},
                security_group_ids={role: sg.id for role, sg in network.security_groups.items()},
                bucket_arns={purpose: bucket.arn for purpose, bucket in store.buckets.items()},
                tags=tags,
            ),
        )
        fs = spec.storage.parallel_fs
        lustre = filesystem.filesystem
        facts = ClusterFacts(
            shared_volume=SharedVolume(
                "fsx-csi",
                fs.mount_path,
                fs.capacity_tib,
                {"file_system_id": lustre.id, "dns_name": lustre.dns_name, "mount_name": lustre.mount_name},
                pulumi.Output.concat,
            ),
            cluster_name=eks.cluster.name,
            region=spec.region,
            model_uri=None if spec.serving is None else stack_object_uri(spec.serving.model, store.buckets),
            pod_identity=True,
        )
        outputs = common_outputs(platform)
        outputs.update(declare_layer(platform, eks.provider, facts, depends_on=eks.ready))
        outputs["fsx_dns_name"] = lustre.dns_name
        outputs["fsx_mount_name"] = lustre.mount_name
        outputs["buckets"] = {purpose: bucket.bucket for purpose, bucket in store.buckets.items()}
        outputs["cluster_name"] = eks.cluster.name
        outputs["cluster_endpoint"] = eks.cluster.endpoint
        outputs["kubeconfig"] = eks.kubeconfig
        outputs["node_groups"] = {
            pool: node_pool.node_group.node_group_name for pool, node_pool in eks.node_pools.items()
        }
        return outputs

    def _identities(
        self,
        platform: ResolvedPlatform,
        store: ObjectStore,
        bootstrap_bucket: aws.s3.Bucket,
        munge_key: aws.ssm.Parameter,
        vpc_arn: pulumi.Output[str],
        tags: dict[str, str],
    ) -> dict[str, NodeIdentity]:
        """One identity per pool role. Every role reads the bootstrap bundle; only the roles whose nodes
        run munged read the MUNGE key (infra/nodes/munge.py); the controllers' role manages the training nodes
        (iam.cluster_manager_statements), with the spot service-linked role when a training pool is spot and
        CreateFleet when one has alternate instance types or zones."""
        bucket_arns = {purpose: bucket.arn for purpose, bucket in store.buckets.items()}
        readers = munge_roles(platform)
        scope = pulumi.Output.all(
            aws.get_partition_output().partition, aws.get_caller_identity_output().account_id
        ).apply(lambda parts: AccountScope(parts[0], str(platform.spec.region), parts[1]))
        spot = any(p.spec.capacity == "spot" for p in platform.pools_with_role("train"))
        fleet_pools = {
            p.name: [p.node_type.name, *p.spec.alternate_instance_types]
            for p in platform.pools_with_role("train")
            if launched_through_fleet(platform, p)
        }
        controller_role = platform.controller_pool.role
        roles = sorted({p.role for p in platform.pools})
        identities: dict[str, NodeIdentity] = {}
        for role in sorted(roles, key=lambda r: r == controller_role):  # the controllers pass the train role
            parts: list[pulumi.Output[list[dict[str, Any]]]] = [
                bootstrap_bucket.arn.apply(bootstrap_statements)
            ]
            if role in readers:
                parts.append(munge_key.arn.apply(munge_key_statements))
            else:
                parts.append(munge_key.arn.apply(munge_key_denied_statements))
            if role == "infer":
                parts.append(pulumi.Output.from_input(inference_node_statements(platform.name)))
            if platform.spec.serving is not None:
                parts.append(scope.apply(functools.partial(_version_record_policy, platform.name, role)))
            if role == controller_role and "train" in identities:
                parts.append(
                    pulumi.Output.all(identities["train"].role.arn, scope, vpc_arn).apply(
                        lambda values: cluster_manager_statements(
                            platform.name,
                            [values[0]],
                            values[1],
                            values[2],
                            spot=spot,
                            fleet_pools=fleet_pools,
                        )
                    )
                )
            document = pulumi.Output.all(*parts).apply(
                lambda groups: policy_document([statement for group in groups for statement in group])
            )
            identities[role] = NodeIdentity(
                f"{platform.name}-{role}", NodeIdentityArgs(role, bucket_arns, tags, platform_policy=document)
            )
        return identities
