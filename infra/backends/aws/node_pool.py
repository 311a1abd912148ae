"""A GPU node pool: launch template and Auto Scaling group, shaped by the pool's role and capacity.

- Training pools get one EFA interface on every network card of the instance type (the first on
  device index 0, the rest on device index 1, as AWS documents for multi-card instances:
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), and a cluster
  placement group: EFA traffic between nodes needs them in one placement group in one zone.
- Capacity: on-demand; spot (a mixed instances policy with no on-demand part); an On-Demand Capacity
  Reservation (the launch template targets it); or a Capacity Block for ML (market type
  `capacity-block` in the launch template, and the block's reservation id as target).
- Inference pools: on-demand base capacity equals the pool minimum, spot only above it, and target
  tracking on GPU memory use and requests per second per instance, custom CloudWatch metrics the node
  agent publishes (namespace GpuPlatform/Inference).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.data.models import NodeType
from infra.spec.models import NodePool

INFERENCE_METRICS_NAMESPACE = "GpuPlatform/Inference"
# Load, as the scaling agent on each inference node publishes it: vLLM's KV-cache use (device memory is
# no load signal: vLLM pre-allocates ~90% of it at idle) and the request rate per instance.
INFERENCE_TARGETS = {"KVCacheUtilization": 75.0, "RequestsPerSecond": 20.0}


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
    tags: dict[str, str]
    user_data: str = ""


def efa_interfaces(node_type: NodeType, security_group_id: pulumi.Input[str]) -> list[dict[str, Any]]:
    return [
        {
            "network_card_index": card,
            "device_index": 0 if card == 0 else 1,
            "interface_type": "efa",
            "delete_on_termination": "true",
            "security_groups": [security_group_id],
        }
        for card in range(node_type.network.nics)
    ]


class GpuNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:GpuNodePool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pool = args.pool
        training = pool.role == "train"

        self.placement_group = (
            aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster", tags=args.tags, opts=child)
            if training
            else None
        )
        template: dict[str, Any] = {
            "image_id": args.image_id,
            "instance_type": args.node_type.name,
            "iam_instance_profile": {"arn": args.instance_profile_arn},
            "metadata_options": {"http_tokens": "required", "http_endpoint": "enabled",
                                 "http_put_response_hop_limit": 2},
            "block_device_mappings": [{
                "device_name": "/dev/sda1",
                "ebs": {"volume_size": args.root_volume_gib, "volume_type": "gp3", "encrypted": "true",
                        "delete_on_termination": "true"},
            }],
            "tag_specifications": [
                {"resource_type": kind, "tags": args.tags}
                for kind in ("instance", "volume", "network-interface")
            ],
            "tags": args.tags,
        }  # fmt: skip
        if args.user_data:
            template["user_data"] = base64.b64encode(args.user_data.encode()).decode()
        if args.efa:
            template["network_interfaces"] = efa_interfaces(args.node_type, args.security_group_id)
        else:
            template["vpc_security_group_ids"] = [args.security_group_id]
        if pool.reservation is not None:
            template["capacity_reservation_specification"] = {
                "capacity_reservation_target": {"capacity_reservation_id": pool.reservation.id}
            }
            if pool.reservation.kind == "capacity-block":
                template["instance_market_options"] = {"market_type": "capacity-block"}
        self.launch_template = aws.ec2.LaunchTemplate(f"{name}-lt", **template, opts=child)

        lt_ref = {"id": self.launch_template.id, "version": self.launch_template.latest_version}
        group: dict[str, Any] = {
            "min_size": pool.min_nodes,
            "max_size": pool.max_nodes,
            "desired_capacity": pool.min_nodes,
            "vpc_zone_identifiers": args.subnet_ids[:1] if training else args.subnet_ids,
            "placement_group": self.placement_group.id if self.placement_group else None,
            "health_check_type": "EC2",
            "protect_from_scale_in": training,
            "tags": [
                {"key": k, "value": v, "propagate_at_launch": True} for k, v in sorted(args.tags.items())
            ],
        }
        spot_above = pool.role == "infer" or pool.capacity == "spot"
        if spot_above:
            base = pool.min_nodes if pool.role == "infer" and pool.capacity != "spot" else 0
            group["mixed_instances_policy"] = {
                "launch_template": {"launch_template_specification": {
                    "launch_template_id": self.launch_template.id,
                    "version": self.launch_template.latest_version,
                }},
                "instances_distribution": {
                    "on_demand_base_capacity": base,
                    "on_demand_percentage_above_base_capacity": 0,
                    "spot_allocation_strategy": "price-capacity-optimized",
                },
            }  # fmt: skip
            group["capacity_rebalance"] = True
        else:
            group["launch_template"] = lt_ref
        self.group = aws.autoscaling.Group(f"{name}-asg", **group, opts=child)

        if pool.role == "infer" and pool.max_nodes > pool.min_nodes:
            for metric, target in INFERENCE_TARGETS.items():
                aws.autoscaling.Policy(
                    f"{name}-track-{metric.lower()}",
                    autoscaling_group_name=self.group.name,
                    policy_type="TargetTrackingScaling",
                    target_tracking_configuration={
                        "target_value": target,
                        "customized_metric_specification": {
                            "metric_name": metric,
                            "namespace": INFERENCE_METRICS_NAMESPACE,
                            "statistic": "Average",
                            "metric_dimensions": [{"name": "AutoScalingGroupName", "value": self.group.name}],
                        },
                    },
                    opts=child,
                )
        self.register_outputs(
            {
                "launch_template_id": self.launch_template.id,
                "group_name": self.group.name,
                "placement_group": self.placement_group.id if self.placement_group else None,
            }
        )
