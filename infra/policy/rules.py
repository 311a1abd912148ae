"""The platform's rules: plain functions over neutral resource views and the resolved platform.

Each rule has a kebab-case id, a description, an enforcement level (mandatory unless marked advisory)
and remediation text. Resource rules judge one resource at a time; stack rules see every resource of
the stack and, through the context, the resolved platform: the facts that are not resource properties
(a pool's interruptible flag, the budget, the catalog's NIC count, Slurm partitions, checkpoint storage,
the onprem and local backends that declare no cloud resources).

The same functions serve the CrossGuard pack (`infra/policy/pack.py`) and `gpuplat check`
(`infra/policy/check.py`). Nothing here imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from infra.data.load import catalog
from infra.policy.config import PolicyConfig
from infra.policy.view import TAG_POOL, TAG_ROLE, UNKNOWN, ResourceIndex, ResourceView
from infra.resolve import ResolvedPlatform, ResolvedPool
from infra.scheduler import partitions

Severity = Literal["mandatory", "advisory"]

ASG = "aws:autoscaling/group:Group"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INSTANCE = "aws:ec2/instance:Instance"
VOLUME = "aws:ebs/volume:Volume"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
TAGGABLE = (
    "aws:ec2/vpc:Vpc",
    SUBNET,
    SECURITY_GROUP,
    "aws:ec2/internetGateway:InternetGateway",
    "aws:ec2/routeTable:RouteTable",
    "aws:ec2/eip:Eip",
    "aws:ec2/natGateway:NatGateway",
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    ASG,
    INSTANCE,
    VOLUME,
    LUSTRE,
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
    *BUCKETS,
    "aws:iam/role:Role",
    "aws:iam/instanceProfile:InstanceProfile",
)
OPEN_IPV4 = "0.0.0.0/0"
OPEN_IPV6 = "::/0"
SPOT_BACKENDS = ("aws",)  # spot markets exist only on the cloud backend


@dataclass(frozen=True)
class PolicyContext:
    """What rules know besides the resources: the resolved platform (None where it cannot be found)
    and the policy settings."""

    platform: ResolvedPlatform | None
    config: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True)
class Finding:
    resource: str
    message: str
    urn: str | None = None


ResourceCheck = Callable[[ResourceView, PolicyContext], Iterable[str]]
StackCheck = Callable[[ResourceIndex, PolicyContext], Iterable[Finding]]


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    group: str
    description: str
    remediation: str
    severity: Severity = "mandatory"
    options: tuple[str, ...] = ()  # PolicyConfig fields the rule reads
    needs_platform: bool = False


@dataclass(frozen=True, kw_only=True)
class ResourceRule(Rule):
    types: tuple[str, ...]
    check: ResourceCheck
    any_tagged: bool = False  # also judge any resource whose props carry tags


@dataclass(frozen=True, kw_only=True)
class StackRule(Rule):
    check: StackCheck


@dataclass(frozen=True)
class Verdict:
    rule: str
    severity: str
    resource: str
    message: str
    remediation: str
    urn: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "resource": self.resource,
            "message": self.message,
            "remediation": self.remediation,
        }


# ---------------------------------------------------------------------------------------------------
# helpers


def _get(value: Any, *path: str | int) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(value, Sequence) or isinstance(value, str) or key >= len(value):
                return None
            value = value[key]
        else:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
    return value


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _number(value: Any, default: float = 0) -> float:
    if isinstance(value, bool):
        return default
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return default


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


def _stack_label(ctx: PolicyContext) -> str:
    return f"stack {ctx.platform.name}" if ctx.platform else "stack"


def _is_efa(interface: Any) -> bool:
    return bool(_get(interface, "interfaceType") == "efa")


# ---------------------------------------------------------------------------------------------------
# spot


def check_interruptible_on_spot(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    groups = node_groups(index, ctx)
    for pool in platform.pools:
        if not pool.spec.interruptible:
            continue
        label, urn = _pool_target(groups, pool)
        if pool.spec.capacity == "on-demand":
            discount = pool.node_type.price.spot_discount
            saving = f" (about {discount:.0%} less for {pool.node_type.name})" if discount else ""
            yield Finding(
                label,
                f"pool {pool.name!r} is interruptible but runs on on-demand capacity: its work survives "
                f"losing a node, so spot capacity carries it for less{saving}",
                urn,
            )
            continue
        group = _group_of(groups, pool.name)
        on_demand = group is not None and (
            group.on_demand_base > 0 or group.on_demand_percentage_above_base > 0
        )
        if pool.spec.capacity == "spot" and group is not None and on_demand:
            yield Finding(
                label,
                f"pool {pool.name!r} is spot in the stack, but its Auto Scaling group launches "
                f"on-demand instances (base {group.on_demand_base}, "
                f"{group.on_demand_percentage_above_base:g}% above base)",
                urn,
            )


def check_inference_base_capacity(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    groups = node_groups(index, ctx)
    for group in groups:
        if group.role != "infer" or group.reserved:
            continue
        if group.on_demand_base < group.min_size:
            yield Finding(
                group.asg.name,
                f"inference group {group.asg.name!r} keeps {group.on_demand_base} on-demand instances as "
                f"base capacity but needs at least its minimum of {group.min_size}: below that, a spot "
                "interruption takes serving replicas away while latency matters",
                group.asg.urn or None,
            )
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    for pool in platform.pools_with_role("infer"):
        if pool.spec.capacity == "spot" and _group_of(groups, pool.name) is None:
            yield Finding(
                f"pool {pool.name}",
                f"inference pool {pool.name!r} runs on spot capacity: its minimum of "
                f"{pool.spec.min_nodes} nodes must be on-demand or reserved",
            )


def check_spot_training_recovery(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    spot_pools = [p for p in platform.pools_with_role("train") if p.spec.capacity == "spot"]
    if not spot_pools:
        return
    groups = node_groups(index, ctx)
    storage = platform.spec.storage
    fs = storage.parallel_fs
    problems: list[str] = []
    if fs.kind == "local-volume":
        problems.append("the parallel filesystem is a local volume, which does not outlive its node")
    if not PurePosixPath(storage.checkpoint_path).is_relative_to(PurePosixPath(fs.mount_path)):
        problems.append(
            f"checkpoint_path {storage.checkpoint_path} is not on the shared filesystem ({fs.mount_path}), "
            "so a checkpoint dies with the node that wrote it"
        )
    if platform.spec.backend == "aws" and fs.kind == "fsx-lustre":
        lustre = index.of_type(LUSTRE)
        if not lustre:
            problems.append("no FSx for Lustre file system is declared to hold the checkpoints")
        for filesystem in lustre:
            deployment = str(filesystem.props.get("deploymentType", ""))
            if not deployment.startswith("PERSISTENT"):
                problems.append(
                    f"file system {filesystem.name!r} is {deployment or 'SCRATCH_1'}: scratch file systems "
                    "lose data when a server fails"
                )
    by_pool = {p.pool: p for p in partitions(platform)}
    for pool in spot_pools:
        label, urn = _pool_target(groups, pool)
        for problem in problems:
            yield Finding(
                label, f"spot training pool {pool.name!r} needs persistent checkpoints: {problem}", urn
            )
        partition = by_pool.get(pool.name)
        if partition is None or partition.preempt_mode != "REQUEUE":
            mode = partition.preempt_mode if partition else "no partition"
            yield Finding(
                f"partition {partition.name if partition else pool.name}",
                f"spot training pool {pool.name!r} has preempt mode {mode}: jobs on reclaimed nodes are "
                "cancelled instead of requeued and resumed from their checkpoint",
                urn,
            )


def check_spot_training_share(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.backend not in SPOT_BACKENDS:
        return
    if platform.spec.environment == "production":
        return
    total = platform.training_gpus
    spot = sum(p.max_gpus for p in platform.pools_with_role("train") if p.spec.capacity == "spot")
    wanted = ctx.config.min_spot_share
    if total and spot / total < wanted:
        yield Finding(
            _stack_label(ctx),
            f"{spot} of {total} training GPUs ({spot / total:.0%}) are on spot in this "
            f"{platform.spec.environment} stack; at least {wanted:.0%} should be, since non-production "
            "training can be interrupted",
        )


# ---------------------------------------------------------------------------------------------------
# isolation


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
            mark(resource, group.role, group.asg.name)
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
        accepted = "a NoSchedule or NoExecute taint" + (f" or the label {label}" if label else "")
        yield Finding(
            f"pool {pool.name}",
            f"inference pool {pool.name!r} has no {accepted}: nothing keeps training jobs off its nodes",
        )


# ---------------------------------------------------------------------------------------------------
# fabric


def check_multi_node_rdma(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    for group in node_groups(index, ctx):
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
                    f"training group {group.asg.name!r} scales to {group.max_size} nodes on {instance_type}, "
                    f"which has no EFA ({node_type.network.fabric}): NCCL falls back to TCP between nodes",
                    template.urn or None,
                )
            elif len(interfaces) < node_type.network.nics:
                effect = "over TCP" if not interfaces else "at a fraction of the fabric bandwidth"
                yield Finding(
                    template.name,
                    f"training group {group.asg.name!r} scales to {group.max_size} nodes but its launch "
                    f"template attaches {len(interfaces)} of the {node_type.network.nics} EFA interfaces "
                    f"{instance_type} has: NCCL runs {effect}",
                    template.urn or None,
                )
    platform = ctx.platform
    if platform is None or platform.spec.backend != "onprem":
        return  # aws: judged on the resources above; local: simulated GPUs, no fabric to have
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
                group.asg.name,
                f"training group {group.asg.name!r} scales to {group.max_size} nodes with {found}: EFA "
                "traffic between nodes needs them in one cluster placement group",
                group.asg.urn or None,
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


# ---------------------------------------------------------------------------------------------------
# security


def check_imdsv2(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    tokens = _get(resource.props, "metadataOptions", "httpTokens")
    if tokens == UNKNOWN:
        return
    if tokens != "required":
        yield (
            f"metadataOptions.httpTokens is {tokens or 'unset (optional)'}: IMDSv1 lets any SSRF in a "
            "workload read the node's IAM credentials"
        )


def check_ebs_encrypted(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    volumes: list[tuple[str, Any]] = []
    if resource.type == LAUNCH_TEMPLATE:
        for mapping in _items(resource.props.get("blockDeviceMappings")):
            if isinstance(_get(mapping, "ebs"), Mapping):
                volumes.append((str(_get(mapping, "deviceName")), _get(mapping, "ebs", "encrypted")))
    elif resource.type == INSTANCE:
        volumes.append(("root", _get(resource.props, "rootBlockDevice", "encrypted")))
        for device in _items(resource.props.get("ebsBlockDevices")):
            volumes.append((str(_get(device, "deviceName")), _get(device, "encrypted")))
    elif resource.type == VOLUME:
        volumes.append(("volume", resource.props.get("encrypted")))
    for device, encrypted in volumes:
        if encrypted != UNKNOWN and not _truthy(encrypted):
            yield f"EBS volume {device} is not encrypted: node disks hold datasets, checkpoints, credentials"


def check_fsx_encrypted(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    deployment = str(resource.props.get("deploymentType") or "SCRATCH_1")
    if deployment != UNKNOWN and not deployment.startswith("PERSISTENT"):
        yield (
            f"deployment type {deployment}: only PERSISTENT deployments are encrypted at rest under a KMS "
            "key you control (kmsKeyId)"
        )


def _bucket_settings(index: ResourceIndex, types: tuple[str, ...]) -> dict[str, list[ResourceView]]:
    result: dict[str, list[ResourceView]] = {}
    for setting in index.of_type(*types):
        for bucket in index.referenced(setting, "bucket"):
            result.setdefault(bucket.urn or bucket.name, []).append(setting)
    return result


def check_s3_encrypted(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    settings = _bucket_settings(index, BUCKET_SSE)
    for bucket in index.of_type(*BUCKETS):
        configured = [
            _get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for s in settings.get(bucket.urn or bucket.name, [])
            for rule in _items(s.props.get("rules"))
        ]
        configured += [
            _get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for rule in _items(_get(bucket.props, "serverSideEncryptionConfiguration", "rules"))
        ]
        if not any(a in ("aws:kms", "aws:kms:dsse", "AES256", UNKNOWN) for a in configured):
            yield Finding(
                bucket.name,
                f"bucket {bucket.name!r} has no server-side encryption configuration: datasets, models and "
                "checkpoints must be encrypted at rest under a key the platform chooses",
                bucket.urn or None,
            )


_PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def check_s3_public_access(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    blocks = _bucket_settings(index, (BUCKET_PAB,))
    for bucket in index.of_type(*BUCKETS):
        found = blocks.get(bucket.urn or bucket.name, [])
        open_flags = sorted(
            {
                f
                for b in found
                for f in _PAB_FLAGS
                if not _truthy(b.props.get(f)) and b.props.get(f) != UNKNOWN
            }
        )
        if not found or open_flags:
            detail = f"{', '.join(open_flags)} off" if found else "no public access block"
            yield Finding(
                bucket.name,
                f"bucket {bucket.name!r} has {detail}: one wrong ACL or policy publishes training data",
                bucket.urn or None,
            )


def check_open_ingress(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    props = resource.props
    if resource.type == INGRESS_RULE:
        cidrs = [props.get("cidrIpv4"), props.get("cidrIpv6")]
    elif resource.type == SG_RULE:
        if props.get("type") != "ingress":
            return
        cidrs = _items(props.get("cidrBlocks")) + _items(props.get("ipv6CidrBlocks"))
    else:
        cidrs = [
            cidr
            for rule in _items(props.get("ingress"))
            for cidr in _items(_get(rule, "cidrBlocks")) + _items(_get(rule, "ipv6CidrBlocks"))
        ]
    for cidr in cidrs:
        if cidr in (OPEN_IPV4, OPEN_IPV6):
            yield (
                f"ingress from {cidr} exposes GPU nodes to the internet; administration goes through SSM "
                "and serving through the gateway"
            )


def check_required_tags(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    tags = resource.tags()
    tags_all = resource.props.get("tagsAll")
    if isinstance(tags_all, Mapping):
        tags = {**{str(k): str(v) for k, v in tags_all.items()}, **tags}
    missing = [key for key in ctx.config.required_tags if not tags.get(key)]
    if missing:
        yield (
            f"missing tag{'s' if len(missing) > 1 else ''} {', '.join(missing)}: cost reports and owners are "
            "found through them"
        )


# ---------------------------------------------------------------------------------------------------
# budget


def check_budget_gpus(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_gpus
    if platform.total_gpus > limit:
        yield Finding(
            _stack_label(ctx),
            f"the pools hold {platform.total_gpus} GPUs at full size, over the budget of {limit}",
        )


def check_budget_cost(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None:
        return
    limit = platform.spec.budget.max_hourly_usd
    if platform.max_usd_per_hour > limit:
        yield Finding(
            _stack_label(ctx),
            f"the pools cost ${platform.max_usd_per_hour:,.2f} per hour at full size, over the budget of "
            f"${limit:,.2f}",
        )


# ---------------------------------------------------------------------------------------------------
# the rules


RULES: tuple[ResourceRule | StackRule, ...] = (
    StackRule(
        id="spot-interruptible-pools",
        group="spot",
        description="Interruptible pools run on spot capacity (aws; onprem and local have no spot market).",
        remediation="Set `capacity: spot` on the pool (or `reserved` to use capacity already paid for), or "
        "set `interruptible: false` if its work cannot survive losing a node.",
        needs_platform=True,
        check=check_interruptible_on_spot,
    ),
    StackRule(
        id="spot-inference-base-capacity",
        group="spot",
        description="Inference pools keep on-demand or reserved base capacity of at least their minimum.",
        remediation="Give the inference pool `capacity: on-demand` or `reserved`; the node pool then sets "
        "the Auto Scaling group's onDemandBaseCapacity to the pool minimum and uses spot only above it.",
        check=check_inference_base_capacity,
    ),
    StackRule(
        id="spot-training-recovery",
        group="spot",
        description="A spot training pool has persistent checkpoint storage and a requeue partition.",
        remediation="Put `storage.checkpoint_path` under the parallel filesystem's mount path on a "
        "persistent filesystem (fsx-lustre PERSISTENT_2, lustre, nfs) and keep "
        "`scheduler.spot_preempt_mode: requeue`.",
        needs_platform=True,
        check=check_spot_training_recovery,
    ),
    StackRule(
        id="spot-training-share",
        group="spot",
        description="Non-production aws stacks run at least a configured share of training GPUs on spot.",
        remediation="Move training capacity to a pool with `capacity: spot` and `interruptible: true`, or "
        "lower `minSpotShare` in the policy config for this stack.",
        severity="advisory",
        options=("min_spot_share",),
        needs_platform=True,
        check=check_spot_training_share,
    ),
    StackRule(
        id="isolation-shared-resources",
        group="isolation",
        description="No launch template, Auto Scaling group, placement group, security group or (when "
        "configured) subnet serves both training and inference.",
        remediation="Give training and inference pools their own launch templates, placement groups and "
        "security groups (GpuNetwork.security_groups[role]); with `isolateSubnets`, their own subnets.",
        options=("isolate_subnets",),
        check=check_shared_resources,
    ),
    StackRule(
        id="isolation-partitions",
        group="isolation",
        description="No Slurm partition holds a node that also serves inference.",
        remediation="List each host in exactly one pool; inference hosts never join a training pool.",
        needs_platform=True,
        check=check_partitions,
    ),
    StackRule(
        id="isolation-inference-taint",
        group="isolation",
        description="Inference nodes carry the taint (or configured label) keeping training jobs off them.",
        remediation='Add `taints: [{key: gpuplat/inference, value: "true", effect: NoSchedule}]` to the '
        "inference pool (or set `inferenceLabel` in the policy config to a label the scheduler honours).",
        options=("inference_label",),
        needs_platform=True,
        check=check_inference_taint,
    ),
    StackRule(
        id="fabric-multi-node-rdma",
        group="fabric",
        description="A training pool of more than one node has RDMA on every NIC the catalog lists.",
        remediation="aws: use an EFA instance type and `fabric.kind: efa` (one EFA interface per network "
        "card); onprem: `fabric.kind: infiniband` or `roce` on RDMA NICs; or keep the pool to one node.",
        check=check_multi_node_rdma,
    ),
    StackRule(
        id="fabric-cluster-placement",
        group="fabric",
        description="A multi-node training pool on aws sits in a cluster placement group.",
        remediation="Set `fabric.placement: cluster`; the node pool creates a cluster placement group and "
        "puts the Auto Scaling group in it (one zone).",
        check=check_cluster_placement,
    ),
    StackRule(
        id="fabric-efa-security-group",
        group="fabric",
        description="A security group on EFA interfaces allows all traffic to and from itself.",
        remediation="Add ingress and egress rules with ipProtocol -1 referencing the group itself "
        "(GpuNetwork `train-from-self` / `train-to-self`).",
        check=check_efa_security_group,
    ),
    ResourceRule(
        id="security-imdsv2",
        group="security",
        description="Launch templates and instances require IMDSv2 (metadata httpTokens required).",
        remediation='Set metadata_options.http_tokens = "required".',
        types=(LAUNCH_TEMPLATE, INSTANCE),
        check=check_imdsv2,
    ),
    ResourceRule(
        id="security-ebs-encrypted",
        group="security",
        description="EBS volumes (launch template block devices, instances, volumes) are encrypted.",
        remediation='Set ebs.encrypted = "true" on every block device mapping (encrypted = True on volumes).',
        types=(LAUNCH_TEMPLATE, INSTANCE, VOLUME),
        check=check_ebs_encrypted,
    ),
    ResourceRule(
        id="security-fsx-encrypted",
        group="security",
        description="FSx for Lustre file systems are encrypted at rest (a PERSISTENT deployment type).",
        remediation="Use deployment_type PERSISTENT_2 (optionally with kms_key_id).",
        types=(LUSTRE,),
        check=check_fsx_encrypted,
    ),
    StackRule(
        id="security-s3-encrypted",
        group="security",
        description="Every S3 bucket has a server-side encryption configuration (SSE-KMS or SSE-S3).",
        remediation="Declare a BucketServerSideEncryptionConfiguration with sse_algorithm aws:kms.",
        check=check_s3_encrypted,
    ),
    StackRule(
        id="security-s3-public-access-blocked",
        group="security",
        description="Every S3 bucket has a public access block with all four settings on.",
        remediation="Declare a BucketPublicAccessBlock with block_public_acls, block_public_policy, "
        "ignore_public_acls and restrict_public_buckets all True.",
        check=check_s3_public_access,
    ),
    ResourceRule(
        id="security-no-open-ingress",
        group="security",
        description="No security group accepts ingress from 0.0.0.0/0 or ::/0.",
        remediation="Allow ingress from the VPC CIDR or another security group; reach nodes through SSM.",
        types=(INGRESS_RULE, SG_RULE, SECURITY_GROUP),
        check=check_open_ingress,
    ),
    ResourceRule(
        id="security-required-tags",
        group="security",
        description="Taggable cloud resources carry the required tags (default owner, team, cost-center).",
        remediation="Set `tags:` (owner, team, cost-center) in the stack; every component passes them on. "
        "Change the keys with `requiredTags` in the policy config.",
        options=("required_tags",),
        types=TAGGABLE,
        any_tagged=True,
        check=check_required_tags,
    ),
    StackRule(
        id="budget-gpus",
        group="budget",
        description="The pools' GPUs at full size stay within the stack's budget.max_gpus.",
        remediation="Lower pool counts/max, pick smaller node types, or raise budget.max_gpus deliberately.",
        needs_platform=True,
        check=check_budget_gpus,
    ),
    StackRule(
        id="budget-hourly-cost",
        group="budget",
        description="The pools' hourly cost at full size stays within the stack's budget.max_hourly_usd.",
        remediation="Use spot for interruptible training, lower pool sizes, or raise budget.max_hourly_usd "
        "deliberately.",
        needs_platform=True,
        check=check_budget_cost,
    ),
)

RULES_BY_ID = {rule.id: rule for rule in RULES}


def rule(rule_id: str) -> ResourceRule | StackRule:
    return RULES_BY_ID[rule_id]


def applies_to(rule_: ResourceRule, resource: ResourceView) -> bool:
    return resource.type in rule_.types or (rule_.any_tagged and "tags" in resource.props)


def evaluate(
    resources: Iterable[ResourceView],
    ctx: PolicyContext,
    rules: Iterable[ResourceRule | StackRule] = RULES,
) -> list[Verdict]:
    """Run the rules over one stack's resources; enforcement overrides from the config apply."""
    index = resources if isinstance(resources, ResourceIndex) else ResourceIndex(resources)
    verdicts: list[Verdict] = []
    for rule_ in rules:
        level = ctx.config.enforcement.get(rule_.id, rule_.severity)
        if level == "disabled":
            continue
        if isinstance(rule_, ResourceRule):
            for resource in index:
                if applies_to(rule_, resource):
                    verdicts += [
                        Verdict(
                            rule_.id, level, resource.name, message, rule_.remediation, resource.urn or None
                        )
                        for message in rule_.check(resource, ctx)
                    ]
        else:
            if rule_.needs_platform and ctx.platform is None:
                continue
            verdicts += [
                Verdict(rule_.id, level, f.resource, f.message, rule_.remediation, f.urn)
                for f in rule_.check(index, ctx)
            ]
    return verdicts
