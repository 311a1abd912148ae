"""VPC, subnets, NAT egress, the S3 gateway endpoint and the security groups of the platform.

Security groups by role: `train` allows all traffic from itself in and out (EFA requires a group that
allows all inbound and outbound traffic to and from itself: AWS EC2 user guide, "Get started with EFA",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html); `infer` accepts only the model
server port and the scaling agent's agent-check port from the gateway's group (and metrics from
monitoring); `service` accepts the gateway port
from inside the VPC. Nothing accepts 0.0.0.0/0: administration goes through SSM.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

METRICS_PORTS = (9100, 9400)  # node exporter, DCGM exporter
LUSTRE_PORTS = ((988, 988), (1018, 1023))  # FSx for Lustre user guide, "File system access control"
# The infer node's scaling agent answers the gateways' HAProxy agent check here ("drain" once a Spot
# notice or the group's termination says the node is leaving): roles/inference_server
# inference_server_agent_port and roles/inference_gateway inference_gateway_agent_port.
NODE_AGENT_PORT = 8090


@dataclass(frozen=True)
class NetworkArgs:
    cidr: str
    region: str
    zones: list[str]
    gateway_port: int
    model_server_port: int
    tags: dict[str, str]
    model_server_replicas: int = 1
    """replicas per inference node: replica i listens on model_server_port + i (the gateways reach each)"""
    canary_port: int | None = None
    """each inference node's canary slot (`gpuplat serve deploy --canary`), which the gateways route to"""


class GpuNetwork(pulumi.ComponentResource):
    """The platform's VPC with private subnets per zone and one security group per pool role."""

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:GpuNetwork", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        network = ipaddress.ip_network(args.cidr)
        blocks = list(network.subnets(new_prefix=min(network.prefixlen + 4, 28)))

        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={**args.tags, "Name": f"{name}-vpc"},
            opts=child,
        )
        self.private_subnets = [
            aws.ec2.Subnet(
                f"{name}-private-{zone}",
                vpc_id=self.vpc.id,
                cidr_block=str(blocks[index]),
                availability_zone=zone,
                tags={**args.tags, "Name": f"{name}-private-{zone}", "tier": "private"},
                opts=child,
            )
            for index, zone in enumerate(args.zones)
        ]
        self.subnet_by_zone = dict(zip(args.zones, self.private_subnets, strict=True))
        self.subnet_cidrs = {zone: str(blocks[index]) for index, zone in enumerate(args.zones)}
        public = aws.ec2.Subnet(
            f"{name}-public",
            vpc_id=self.vpc.id,
            cidr_block=str(blocks[len(blocks) - 1]),
            availability_zone=args.zones[0],
            map_public_ip_on_launch=False,
            tags={**args.tags, "Name": f"{name}-public", "tier": "public"},
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=args.tags, opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public-rt",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            tags=args.tags,
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public-rta", subnet_id=public.id, route_table_id=public_routes.id, opts=child
        )
        nat_ip = aws.ec2.Eip(f"{name}-nat-ip", domain="vpc", tags=args.tags, opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat", allocation_id=nat_ip.id, subnet_id=public.id, tags=args.tags, opts=child
        )
        private_routes = aws.ec2.RouteTable(
            f"{name}-private-rt",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags=args.tags,
            opts=child,
        )
        for subnet, zone in zip(self.private_subnets, args.zones, strict=True):
            aws.ec2.RouteTableAssociation(
                f"{name}-private-rta-{zone}",
                subnet_id=subnet.id,
                route_table_id=private_routes.id,
                opts=child,
            )
        aws.ec2.VpcEndpoint(
            f"{name}-s3-endpoint",
            vpc_id=self.vpc.id,
            service_name=f"com.amazonaws.{args.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[private_routes.id],
            tags=args.tags,
            opts=child,
        )

        self.security_groups = {
            role: aws.ec2.SecurityGroup(
                f"{name}-{role}-sg",
                vpc_id=self.vpc.id,
                description=f"gpu-platform {role} nodes",
                tags={**args.tags, "gpuplat:role": role},
                opts=child,
            )
            for role in ("train", "infer", "service", "lustre")
        }
        self._rules(name, args, child)
        self.register_outputs(
            {
                "vpc_id": self.vpc.id,
                "private_subnet_ids": [s.id for s in self.private_subnets],
                "security_group_ids": {role: sg.id for role, sg in self.security_groups.items()},
            }
        )

    def _rules(self, name: str, args: NetworkArgs, child: pulumi.ResourceOptions) -> None:
        sg = self.security_groups

        def ingress(
            rule: str,
            group: str,
            source: str | None,
            protocol: str = "-1",
            ports: tuple[int, int] | None = None,
            cidr: str | None = None,
        ) -> None:
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-{rule}",
                security_group_id=sg[group].id,
                referenced_security_group_id=sg[source].id if source else None,
                cidr_ipv4=cidr,
                ip_protocol=protocol,
                from_port=ports[0] if ports else None,
                to_port=ports[1] if ports else None,
                description=rule,
                opts=child,
            )

        def egress(rule: str, group: str, target: str | None, cidr: str | None = None) -> None:
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-{rule}",
                security_group_id=sg[group].id,
                referenced_security_group_id=sg[target].id if target else None,
                cidr_ipv4=cidr,
                ip_protocol="-1",
                description=rule,
                opts=child,
            )

        ingress("train-from-self", "train", "train")
        egress("train-to-self", "train", "train")
        ingress("train-from-service", "train", "service")
        ingress("service-from-train", "service", "train")
        # A high-availability pair: the backup slurmctld and the primary's slurmdbd talk to each other.
        ingress("service-from-self", "service", "service")
        ingress(
            "service-gateway-from-vpc",
            "service",
            None,
            "tcp",
            (args.gateway_port, args.gateway_port),
            args.cidr,
        )
        last_replica = args.model_server_port + max(args.model_server_replicas, 1) - 1
        ingress("infer-from-gateway", "infer", "service", "tcp", (args.model_server_port, last_replica))
        if args.canary_port is not None:
            ingress(
                "infer-canary-from-gateway", "infer", "service", "tcp", (args.canary_port, args.canary_port)
            )
        ingress("infer-agent-from-gateway", "infer", "service", "tcp", (NODE_AGENT_PORT, NODE_AGENT_PORT))
        for port in METRICS_PORTS:
            ingress(f"infer-metrics-{port}", "infer", "service", "tcp", (port, port))
        for low, high in LUSTRE_PORTS:
            for source in ("lustre", "train", "service"):
                ingress(f"lustre-{low}-from-{source}", "lustre", source, "tcp", (low, high))
        for group in ("train", "infer", "service", "lustre"):
            egress(f"{group}-egress", group, None, "0.0.0.0/0")
