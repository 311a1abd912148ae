"""The Slurm controller pool: one EC2 instance per controller node, each with its name and fixed address.

slurm.conf names its controllers (`SlurmctldHost=head-0(10.64.0.10)`) and every node's slurmd finds
them there, so a controller's name and address must hold across a replacement. An Auto Scaling group
cannot promise either (it cannot attach a fixed interface); an instance with a fixed private IP and
EC2 automatic recovery can: a recovered instance keeps its id, private address and volumes
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-recover.html). A high-availability
pair puts its two nodes in different zones.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.backends.aws.node_pool import encode_user_data, metadata_options
from infra.nodes.inventory import TAG_NODE

# Host part of the first controller's address in its zone's subnet (AWS reserves .0-.3).
FIRST_HOST = 10


@dataclass(frozen=True)
class ControllerNodesArgs:
    node_names: list[str]
    instance_type: str
    image_id: pulumi.Input[str]
    zones: list[str]
    subnet_by_zone: dict[str, pulumi.Input[str]]
    subnet_cidrs: dict[str, str]
    security_group_id: pulumi.Input[str]
    instance_profile_name: pulumi.Input[str]
    root_volume_gib: int
    tags: dict[str, str]
    user_data: dict[str, pulumi.Input[str]]  # node name -> its bootstrap script
    # What the boot script fetches (bundle, group vars): an instance launched before them fails its boot.
    boot_after: list[pulumi.Resource] = field(default_factory=list)


def controller_addresses(
    node_names: list[str], zones: list[str], subnet_cidrs: dict[str, str]
) -> dict[str, str]:
    """Node name -> fixed private IP: node i in zone i mod len(zones)."""
    result = {}
    for index, node in enumerate(node_names):
        zone = zones[index % len(zones)]
        network = ipaddress.ip_network(subnet_cidrs[zone])
        result[node] = str(network.network_address + FIRST_HOST + index)
    return result


def controller_zones(node_names: list[str], zones: list[str]) -> dict[str, str]:
    return {node: zones[index % len(zones)] for index, node in enumerate(node_names)}


class ControllerNodes(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: ControllerNodesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-platform:aws:ControllerNodes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=args.boot_after)
        addresses = controller_addresses(args.node_names, args.zones, args.subnet_cidrs)
        zones = controller_zones(args.node_names, args.zones)
        self.instances = {
            node: aws.ec2.Instance(
                f"{name}-{node}",
                ami=args.image_id,
                instance_type=args.instance_type,
                subnet_id=args.subnet_by_zone[zones[node]],
                private_ip=addresses[node],
                vpc_security_group_ids=[args.security_group_id],
                iam_instance_profile=args.instance_profile_name,
                # As every node (node_pool.instance_template): IMDSv2, host only, tags readable.
                metadata_options=aws.ec2.InstanceMetadataOptionsArgs(**metadata_options()),
                root_block_device={
                    "volume_size": args.root_volume_gib,
                    "volume_type": "gp3",
                    "encrypted": True,
                },
                maintenance_options={"auto_recovery": "default"},
                user_data_base64=encode_user_data(args.user_data[node]),
                tags={**args.tags, TAG_NODE: node, "Name": f"{args.tags.get('Name', name)}-{node}"},
                opts=child,
            )
            for node in args.node_names
        }
        self.addresses = addresses
        self.register_outputs({node: instance.id for node, instance in self.instances.items()})
