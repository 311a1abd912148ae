"""A node pool: its launch template, and who launches from it.

- Training pools are launched by Slurm (power saving, as AWS ParallelCluster does): the resume program
  on the controller calls RunInstances on the pool's launch template for the node names pending jobs
  need (an instant CreateFleet with instance type and subnet overrides where the pool has alternate
  instance types or zones; with several zones the template's interfaces name no subnet, the overrides
  do, as ParallelCluster's CreateFleet templates: aws-parallelcluster v3.11.0,
  cli/src/pcluster/templates/queues_stack.py:161), and terminates them after the pool's idle time.
  So a training pool is a launch template and a placement group, no Auto Scaling group: an ASG would
  replace and scale nodes Slurm does not know. The template carries everything a launch needs: the
  pool's subnet (EFA and cluster placement work within one zone), one EFA interface on every network
  card of EFA-capable types (the first on device index 0, the rest on 1: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html),
  the placement group of `fabric.placement`, the spot market, the reservation or Capacity Block.
- Inference and other service pools are Auto Scaling groups. Capacity: on-demand; spot (a mixed
  instances policy with no on-demand part); an On-Demand Capacity Reservation or Capacity Block (the
  template targets it; nothing spills to spot); inference on-demand pools run their minimum on-demand
  and only the burst above it on spot. Target tracking on KV-cache use and requests per second per
  instance (custom CloudWatch metrics the node agent publishes, namespace GpuPlatform/Inference) owns
  the desired capacity: the group sets none, so `pulumi up` never resets what the policies scaled to.
- No launch waits for capacity during `pulumi up` (wait_for_capacity_timeout 0): GPU capacity can take
  hours; nodes join by themselves when they come (see infra/backends/aws/bootstrap.py).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, replace
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.data.models import NodeType
from infra.nodes.inventory import TAG_MAX_NODES, TAG_MIN_NODES
from infra.spec.models import NodePool, Placement

INFERENCE_METRICS_NAMESPACE = "GpuPlatform/Inference"
# Load, as the scaling agent on each inference node publishes it: vLLM's KV-cache use (device memory is
# no load signal: vLLM pre-allocates ~90% of it at idle) and the request rate per instance.
INFERENCE_TARGETS = {"KVCacheUtilization": 75.0, "RequestsPerSecond": 20.0}
# Published by the gateways (gpuplat_gateway_targets.py sync): the requests they queue because every
# replica is at its limit, per running instance of the group. vLLM's own queue stays near empty behind
# a gateway that caps each replica at --max-num-seqs, so this is where a shortage shows; its target is
# one queued request per replica of a node.
GATEWAY_BACKLOG_METRIC = "GatewayBacklogPerInstance"
# The termination hook of inference groups: a leaving instance waits in Terminating:Wait until its
# scaling agent completes the action once the gateways drained it (roles/inference_server,
# gpuplat_scaling_agent.py --lifecycle-hook; the role's inference_server_lifecycle_hook).
DRAIN_HOOK = "gpuplat-drain"
# Auto Scaling's bounds on a hook's heartbeat timeout (API reference, PutLifecycleHook HeartbeatTimeout:
# "The range is from 30 to 7200 seconds").
HOOK_TIMEOUT_BOUNDS_S = (30, 7200)


@dataclass(frozen=True)
class GpuNodePoolArgs:
    pool: NodePool
    node_type: NodeType
    image_id: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]
    security_group_id: pulumi.Input[str]
    instance_profile_arn: pulumi.Input[str]
    root_volume_gib: int
    efa: bool
    placement: Placement
    tags: dict[str, str]
    user_data: pulumi.Input[str] | None = None
    # What the boot script fetches: an Auto Scaling group launches at once, so it waits for them.
    boot_after: list[pulumi.Resource] = field(default_factory=list)
    # The image's root device (Canonical's Ubuntu images: /dev/sda1; others differ): the volume mapped
    # there is the root volume, resized; under another name it would be a second, unused volume.
    root_device: pulumi.Input[str] = "/dev/sda1"
    # Seconds from InService until a new instance's metrics mean something (an inference node: its boot,
    # then its model loading): Auto Scaling counts it neither as capacity nor in the metrics before.
    instance_warmup_s: int | None = None
    # Model-server replicas per node of an inference pool: the gateway backlog's target per instance.
    replicas_per_node: int = 1
    # Seconds a terminating instance may take to finish its requests (an inference node: drained by the
    # gateways, then its requests in flight); None: no termination hook.
    drain_timeout_s: int | None = None


def efa_interfaces(
    node_type: NodeType, security_group_ids: list[pulumi.Input[str]], subnet_id: pulumi.Input[str] | None
) -> list[dict[str, Any]]:
    """One EFA interface on every network card. No subnet where the launcher picks it (an EKS managed
    node group launches into its own subnets and refuses templates that name one)."""
    interfaces: list[dict[str, Any]] = []
    for card in range(node_type.network.nics):
        interface: dict[str, Any] = {
            "network_card_index": card,
            "device_index": 0 if card == 0 else 1,
            "interface_type": "efa",
            "delete_on_termination": "true",
            "security_groups": list(security_group_ids),
        }
        if subnet_id is not None:
            interface["subnet_id"] = subnet_id
        interfaces.append(interface)
    return interfaces


def encode_user_data(script: pulumi.Input[str]) -> pulumi.Output[str]:
    return pulumi.Output.from_input(script).apply(lambda text: base64.b64encode(text.encode()).decode())


# IMDSv2's PUT response hop limit: how many network hops the session token travels. "If the hop limit is
# 1 in a container environment, the call might not receive a response at all because going to the
# container is considered an additional network hop" (EC2 User Guide, "Instance metadata access
# considerations"). 1: only the host's own network namespace gets a token. Nothing containerised on the
# platform's Slurm nodes needs the instance profile, and roles/imds_guard limits the host's users. On
# EKS, pods in their own network namespace get no token either: the ones that call AWS have their own
# identities (EKS Pod Identity: the model server, the cluster autoscaler), and the node agents that
# use the node's role (vpc-cni, kube-proxy, the Pod Identity agent) run in the host's network.
HOST_ONLY_HOP_LIMIT = 1


def metadata_options(hop_limit: int = HOST_ONLY_HOP_LIMIT) -> dict[str, Any]:
    """IMDSv2 only; instance tags readable from the node (its bootstrap reads its gpuplat:node name)."""
    return {
        "http_tokens": "required",
        "http_endpoint": "enabled",
        "http_put_response_hop_limit": hop_limit,
        "instance_metadata_tags": "enabled",
    }


def instance_template(
    pool: NodePool,
    node_type: NodeType,
    root_device: pulumi.Input[str],
    root_volume_gib: int,
    tags: dict[str, str],
    metadata_hop_limit: int = HOST_ONLY_HOP_LIMIT,
) -> dict[str, Any]:
    """What every node of the platform launches with, whoever launches it and whatever image it boots:
    its type, IMDSv2, an encrypted gp3 root volume on the image's root device, tags, the reservation."""
    template: dict[str, Any] = {
        "instance_type": node_type.name,
        "metadata_options": metadata_options(metadata_hop_limit),
        "block_device_mappings": [{
            "device_name": root_device,
            "ebs": {"volume_size": root_volume_gib, "volume_type": "gp3", "encrypted": "true",
                    "delete_on_termination": "true"},
        }],
        "tag_specifications": [
            {"resource_type": kind, "tags": tags} for kind in ("instance", "volume", "network-interface")
        ],
        "tags": tags,
    }  # fmt: skip
    reservation = pool.reservation
    if reservation is not None:
        template["capacity_reservation_specification"] = {
            "capacity_reservation_target": {"capacity_reservation_id": reservation.id}
        }
        if reservation.kind == "capacity-block":
            template["instance_market_options"] = {"market_type": "capacity-block"}
    return template


def base_template(args: GpuNodePoolArgs) -> dict[str, Any]:
    """A node the platform boots itself: the stack's image on its root device, its instance profile and
    bootstrap."""
    template = instance_template(args.pool, args.node_type, args.root_device, args.root_volume_gib, args.tags)
    template["image_id"] = args.image_id
    template["iam_instance_profile"] = {"arn": args.instance_profile_arn}
    if args.user_data is not None:
        template["user_data"] = encode_user_data(args.user_data)
    return template


def slurm_pool_template(args: GpuNodePoolArgs, placement_group: pulumi.Input[str] | None) -> dict[str, Any]:
    """A training pool's template: complete enough for RunInstances with no other parameter (several
    zones: with the subnet of a fleet override)."""
    pool = args.pool
    sizes = {TAG_MIN_NODES: str(pool.min_nodes), TAG_MAX_NODES: str(pool.max_nodes)}
    template = base_template(replace(args, tags={**args.tags, **sizes}))
    # Several zones: the instant fleet's overrides name each launch's subnet, and the interfaces none,
    # as ParallelCluster's CreateFleet templates (aws-parallelcluster v3.11.0,
    # cli/src/pcluster/templates/queues_stack.py:161, a subnet only for a SlurmComputeResource, the
    # RunInstances one; aws/aws-parallelcluster#4521).
    subnet = args.subnet_ids[0] if len(args.subnet_ids) == 1 else None
    if args.efa:
        template["network_interfaces"] = efa_interfaces(args.node_type, [args.security_group_id], subnet)
    else:
        interface = {"device_index": 0, "security_groups": [args.security_group_id],
                     "delete_on_termination": "true"}  # fmt: skip
        template["network_interfaces"] = [{**interface, "subnet_id": subnet} if subnet else interface]
    if placement_group is not None:
        template["placement"] = {"group_name": placement_group}
    # Its boot script powers a node off when the bootstrap fails (bootstrap.py): gone, not stopped.
    template["instance_initiated_shutdown_behavior"] = "terminate"
    if pool.capacity == "spot":
        template["instance_market_options"] = {
            "market_type": "spot",
            "spot_options": {"spot_instance_type": "one-time", "instance_interruption_behavior": "terminate"},
        }
    return template


# Amazon Linux 2023 EKS AMIs boot from /dev/xvda (awslabs/amazon-eks-ami, templates/al2023/template.pkr.hcl,
# launch_block_device_mappings): a mapping on another device would add a volume, not size the root.
EKS_ROOT_DEVICE = "/dev/xvda"


def eks_pool_template(
    pool: NodePool,
    node_type: NodeType,
    security_group_ids: list[pulumi.Input[str]],
    placement_group: pulumi.Input[str] | None,
    root_volume_gib: int,
    efa: bool,
    tags: dict[str, str],
) -> dict[str, Any]:
    """An EKS managed node group's template. EKS refuses templates that set what the node group owns
    (https://docs.aws.amazon.com/eks/latest/userguide/launch-templates.html, "Launch template
    configuration basics": subnets, the IAM instance profile, shutdown and hibernate behaviour), and the
    spot market is the node group's capacity type: none of them appear here. No image either: EKS boots
    the optimized AMI of the node group's AMI type and joins it to the cluster itself."""
    template = instance_template(pool, node_type, EKS_ROOT_DEVICE, root_volume_gib, tags)
    if efa:
        template["network_interfaces"] = efa_interfaces(node_type, security_group_ids, None)
    else:
        template["vpc_security_group_ids"] = list(security_group_ids)
    if placement_group is not None:
        template["placement"] = {"group_name": placement_group}
    return template


def group_capacity(pool: NodePool, template: aws.ec2.LaunchTemplate) -> dict[str, Any]:
    """Where an Auto Scaling group's instances come from: only spot pools and the burst of on-demand
    inference pools use spot; reserved capacity never spills."""
    reference = {"id": template.id, "version": template.latest_version}
    if pool.capacity == "reserved":
        return {"launch_template": reference}
    burst = pool.role == "infer" and pool.capacity == "on-demand" and pool.max_nodes > pool.min_nodes
    if pool.capacity != "spot" and not burst:
        return {"launch_template": reference}
    return {
        "mixed_instances_policy": {
            "launch_template": {"launch_template_specification": {
                "launch_template_id": template.id, "version": template.latest_version,
            }},
            "instances_distribution": {
                "on_demand_base_capacity": pool.min_nodes if burst else 0,
                "on_demand_percentage_above_base_capacity": 0,
                "spot_allocation_strategy": "price-capacity-optimized",
            },
        },
        "capacity_rebalance": True,
    }  # fmt: skip


def drain_hooks(drain_timeout_s: int | None) -> list[aws.autoscaling.GroupInitialLifecycleHookArgs] | None:
    """The termination hook that holds a leaving instance until it has drained; CONTINUE at the timeout
    (the instance is then terminated, as without a hook)."""
    if drain_timeout_s is None:
        return None
    low, high = HOOK_TIMEOUT_BOUNDS_S
    return [
        aws.autoscaling.GroupInitialLifecycleHookArgs(
            name=DRAIN_HOOK,
            lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
            default_result="CONTINUE",
            heartbeat_timeout=min(max(drain_timeout_s, low), high),
        )
    ]


class GpuNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:GpuNodePool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pool = args.pool
        slurm_managed = pool.role == "train"
        self.placement_group = (
            aws.ec2.PlacementGroup(f"{name}-placement", strategy=args.placement, tags=args.tags, opts=child)
            if slurm_managed and args.placement != "none"
            else None
        )
        self.group: aws.autoscaling.Group | None = None
        if slurm_managed:
            template = slurm_pool_template(
                args, self.placement_group.name if self.placement_group is not None else None
            )
            self.launch_template = aws.ec2.LaunchTemplate(f"{name}-lt", **template, opts=child)
        else:
            template = {**base_template(args), "vpc_security_group_ids": [args.security_group_id]}
            self.launch_template = aws.ec2.LaunchTemplate(f"{name}-lt", **template, opts=child)
            self.group = self._group(name, args, child)
        self.register_outputs(
            {
                "launch_template_id": self.launch_template.id,
                "group_name": self.group.name if self.group is not None else None,
                "placement_group": self.placement_group.name if self.placement_group is not None else None,
            }
        )

    def _group(
        self, name: str, args: GpuNodePoolArgs, child: pulumi.ResourceOptions
    ) -> aws.autoscaling.Group:
        pool = args.pool
        group = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=pool.min_nodes,
            max_size=pool.max_nodes,
            vpc_zone_identifiers=args.subnet_ids,
            health_check_type="EC2",
            wait_for_capacity_timeout="0",
            default_instance_warmup=args.instance_warmup_s,
            initial_lifecycle_hooks=drain_hooks(args.drain_timeout_s),
            tags=[{"key": k, "value": v, "propagate_at_launch": True} for k, v in sorted(args.tags.items())],
            **group_capacity(pool, self.launch_template),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=args.boot_after)),
        )
        if pool.role == "infer" and pool.max_nodes > pool.min_nodes:
            targets = {**INFERENCE_TARGETS, GATEWAY_BACKLOG_METRIC: float(args.replicas_per_node)}
            for metric, target in targets.items():
                aws.autoscaling.Policy(
                    f"{name}-track-{metric.lower()}",
                    autoscaling_group_name=group.name,
                    policy_type="TargetTrackingScaling",
                    estimated_instance_warmup=args.instance_warmup_s,
                    target_tracking_configuration={
                        "target_value": target,
                        "customized_metric_specification": {
                            "metric_name": metric,
                            "namespace": INFERENCE_METRICS_NAMESPACE,
                            "statistic": "Average",
                            "metric_dimensions": [{"name": "AutoScalingGroupName", "value": group.name}],
                        },
                    },
                    opts=child,
                )
        return group
