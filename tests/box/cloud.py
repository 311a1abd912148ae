"""What `pulumi up` creates for an AWS Slurm stack, recreated in the emulator from the builders the
Pulumi components use: the boot script (BootScript), the bundle (bundle_zip of bundle_files), the group
vars (node_group_vars), the training pools' launch templates (slurm_pool_template), the controllers'
fixed names and addresses (controller_addresses). The only translation is from pulumi_aws's argument
names to the EC2 API's (`launch_template_data`).

What the box cannot have, it states in BOX_SUBSTITUTES (group vars the box overrides): no FSx (a podman
volume at the same mount path), no GPUs (device files, as on the local platform), and timers short
enough for a test.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.backends.aws.bootstrap import (
    GROUP_VARS_KEY,
    BootScript,
    bundle_key,
    bundle_zip,
    munge_parameter,
    node_group_vars,
    node_inventory,
    settings_digest,
)
from infra.backends.aws.controller_nodes import controller_addresses
from infra.backends.aws.node_pool import GpuNodePoolArgs, metadata_options, slurm_pool_template
from infra.backends.aws.tags import pool_tags
from infra.nodes.inventory import TAG_NODE
from infra.nodes.munge import runs_munge
from infra.platform.resolve import ResolvedPlatform
from infra.spec.defaults import os_release
from infra.spec.load import PROJECT_ROOT

MUNGE_KEY_BYTES = 1024


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


_RENAMED = {"security_groups": "Groups", "group_name": "GroupName"}
_BOOLEAN_STRINGS = {"true": True, "false": False}


def api_value(value: Any, key: str = "") -> Any:
    """pulumi_aws launch template arguments (snake_case, booleans as strings) -> EC2 API values."""
    if isinstance(value, dict):
        if key == "tags":
            return [{"Key": k, "Value": v} for k, v in value.items()]
        return {_RENAMED.get(k, camel(k)): api_value(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [api_value(item, key) for item in value]
    if isinstance(value, str) and value in _BOOLEAN_STRINGS:
        return _BOOLEAN_STRINGS[value]
    return value


def launch_template_data(template: dict[str, Any]) -> dict[str, Any]:
    """The LaunchTemplateData of CreateLaunchTemplate for a pulumi_aws.ec2.LaunchTemplate's arguments."""
    data = {k: v for k, v in template.items() if k != "tags"}
    converted: dict[str, Any] = api_value(data)
    if "IamInstanceProfile" in converted:
        converted["IamInstanceProfile"] = {"Arn": template["iam_instance_profile"]["arn"]}
    return converted


@dataclass
class BoxStack:
    platform: ResolvedPlatform
    image_id: str
    vpc_id: str
    subnet_id: str
    subnet_cidr: str
    security_group_id: str
    bucket: str
    profiles: dict[str, str]  # pool role -> instance profile ARN
    templates: dict[str, str]  # training pool -> launch template id
    controllers: dict[str, str]  # controller node -> instance id


def zone_subnet(vpc_cidr: str) -> str:
    """The first zone's subnet, as infra/backends/aws/network.py splits the VPC."""
    network = ipaddress.ip_network(vpc_cidr)
    return str(next(network.subnets(new_prefix=min(network.prefixlen + 4, 28))))


def declare(
    client: Callable[[str], Any], platform: ResolvedPlatform, image_id: str, substitutes: dict[str, Any]
) -> BoxStack:
    """Create the stack's cloud resources in the emulator; launch the controllers."""
    spec = platform.spec
    ec2 = client("ec2")
    vpc_id = ec2.create_vpc(CidrBlock=spec.aws.vpc_cidr)["Vpc"]["VpcId"]
    zone = spec.zones[0]
    subnet_cidr = zone_subnet(spec.aws.vpc_cidr)
    subnet_id = ec2.create_subnet(VpcId=vpc_id, CidrBlock=subnet_cidr, AvailabilityZone=zone)["Subnet"][
        "SubnetId"
    ]
    group_id = ec2.create_security_group(GroupName=f"{platform.name}-nodes", Description="box", VpcId=vpc_id)[
        "GroupId"
    ]
    profiles = _profiles(client, platform)
    bucket = f"{platform.name}-bootstrap-{secrets.token_hex(4)}"
    s3 = client("s3")
    s3.create_bucket(Bucket=bucket)
    key = bundle_key(PROJECT_ROOT)
    s3.put_object(Bucket=bucket, Key=key, Body=bundle_zip(PROJECT_ROOT))
    client("ssm").put_parameter(
        Name=munge_parameter(platform.name),
        Type="SecureString",
        Value=base64.b64encode(secrets.token_bytes(MUNGE_KEY_BYTES)).decode(),
    )

    def boot_script(pool_name: str, node: str = "") -> str:
        return node_boot_script(platform, bucket, key, pool_name, node)

    templates: dict[str, str] = {}
    for pool in platform.pools_with_role("train"):
        args = GpuNodePoolArgs(
            pool=pool.spec,
            node_type=pool.node_type,
            image_id=image_id,
            subnet_ids=[subnet_id],
            security_group_id=group_id,
            instance_profile_arn=profiles["train"],
            root_volume_gib=spec.aws.root_volume_gib,
            efa=platform.uses_efa(pool),
            placement="none",
            tags=pool_tags(platform, pool),
            user_data=boot_script(pool.name),
        )
        template = slurm_pool_template(args, None)
        template["user_data"] = base64.b64encode(str(args.user_data).encode()).decode()
        created = ec2.create_launch_template(
            LaunchTemplateName=f"{platform.name}-{pool.name}",
            LaunchTemplateData=launch_template_data(template),
            # The template's own tags, as Pulumi gives them (the resource's `tags`): what the controllers'
            # IAM policy and the fleet's stop (`gpuplat down`) find the stack's training templates by.
            TagSpecifications=[
                {
                    "ResourceType": "launch-template",
                    "Tags": [{"Key": k, "Value": v} for k, v in args.tags.items()],
                }
            ],
        )
        templates[pool.name] = created["LaunchTemplate"]["LaunchTemplateId"]

    controller = platform.controller_pool
    addresses = controller_addresses(controller.node_names(), [zone], {zone: subnet_cidr})
    group_vars = {**node_group_vars(platform, "", addresses, templates, {}, key), **substitutes}
    s3.put_object(Bucket=bucket, Key=GROUP_VARS_KEY, Body=json.dumps(group_vars, indent=1).encode())

    controllers: dict[str, str] = {}
    for node, address in addresses.items():
        tags = {**pool_tags(platform, controller), TAG_NODE: node, "Name": f"{platform.name}-{node}"}
        reply = ec2.run_instances(
            ImageId=image_id,
            InstanceType=controller.node_type.name,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet_id,
            PrivateIpAddress=address,
            SecurityGroupIds=[group_id],
            IamInstanceProfile={"Arn": profiles["service"]},
            MetadataOptions=api_value(metadata_options()),
            UserData=boot_script(controller.name, node),
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        )  # fmt: skip
        controllers[node] = reply["Instances"][0]["InstanceId"]
    return BoxStack(
        platform, image_id, vpc_id, subnet_id, subnet_cidr, group_id, bucket, profiles, templates, controllers
    )


def node_boot_script(platform: ResolvedPlatform, bucket: str, key: str, pool: str, node: str = "") -> str:
    """A node's user data; a controller's (`node` given) names no bundle: it boots from the group vars'
    (infra/backends/aws/__init__.py)."""
    resolved = platform.pool(pool)
    return BootScript(
        stack=platform.name,
        region=str(platform.spec.region),
        bucket=bucket,
        bundle_key="" if node else key,
        inventory=node_inventory(platform, resolved),
        os_release=os_release(platform.spec),
        node_name=node,
        fetch_munge_key=runs_munge(platform, resolved),
        power_off_on_failure=resolved.role == "train",
        settings_digest=settings_digest(platform) if resolved.role == "train" else "",
    ).render()


def _profiles(client: Callable[[str], Any], platform: ResolvedPlatform) -> dict[str, str]:
    iam = client("iam")
    trust = json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    })  # fmt: skip
    arns = {}
    for role in sorted({p.role for p in platform.pools}):
        name = re.sub(r"[^A-Za-z0-9+=,.@_-]", "-", f"{platform.name}-{role}")
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)
        profile = iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        arns[role] = profile["Arn"]
    return arns


def user_data(ec2: Any, instance_id: str) -> str:
    value = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    encoded = value.get("UserData", {}).get("Value", "")
    return base64.b64decode(encoded).decode() if encoded else ""
