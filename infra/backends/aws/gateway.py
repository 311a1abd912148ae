"""One address for the inference gateways: an internal Network Load Balancer in front of every gateway
node. Each gateway admits its share of every model server's in-flight limit (roles/inference_gateway
splits the limit by the number of gateways), so the servers never see more than their limit in total.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class GatewayEndpointArgs:
    vpc_id: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]
    port: int
    instance_ids: list[pulumi.Input[str]]  # gateway nodes that are instances (the controller pool)
    group_names: list[pulumi.Input[str]]  # gateway pools that are Auto Scaling groups
    tags: dict[str, str]


class GatewayEndpoint(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: GatewayEndpointArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-platform:aws:GatewayEndpoint", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.balancer = aws.lb.LoadBalancer(
            f"{name}-nlb",
            internal=True,
            load_balancer_type="network",
            subnets=args.subnet_ids,
            enable_cross_zone_load_balancing=True,
            tags=args.tags,
            opts=child,
        )
        targets = aws.lb.TargetGroup(
            f"{name}-targets",
            port=args.port,
            protocol="TCP",
            target_type="instance",
            vpc_id=args.vpc_id,
            health_check={
                "protocol": "TCP",
                "interval": 10,
                "healthy_threshold": 2,
                "unhealthy_threshold": 2,
            },
            tags=args.tags,
            opts=child,
        )
        aws.lb.Listener(
            f"{name}-listener",
            load_balancer_arn=self.balancer.arn,
            port=args.port,
            protocol="TCP",
            default_actions=[{"type": "forward", "target_group_arn": targets.arn}],
            tags=args.tags,
            opts=child,
        )
        for index, instance in enumerate(args.instance_ids):
            aws.lb.TargetGroupAttachment(
                f"{name}-node-{index}",
                target_group_arn=targets.arn,
                target_id=instance,
                port=args.port,
                opts=child,
            )
        for index, group in enumerate(args.group_names):
            aws.autoscaling.Attachment(
                f"{name}-group-{index}",
                autoscaling_group_name=group,
                lb_target_group_arn=targets.arn,
                opts=child,
            )
        self.register_outputs({"dns_name": self.balancer.dns_name})
