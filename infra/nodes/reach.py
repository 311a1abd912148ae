"""How to reach one node of a stack with a shell: the command `gpuplat ssh NODE` runs.

local: `podman exec` into the node's container; onprem: `ssh` to the host's address from the stack file;
aws: an SSM session (`aws ssm start-session`: the platform's security groups open no SSH port, and
Ansible reaches the nodes through SSM too), to the running instance tagged with the stack and the node's
name (the tags the inventory reads).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.errors import EnvironmentProblem, ExitCode, GpuPlatError, SpecError
from infra.nodes.inventory import TAG_NODE, TAG_POOL, TAG_STACK, container_name
from infra.nodes.remote import SshSettings, SsmNodes, ssh_argv
from infra.platform.resolve import ResolvedPlatform

# SSM's document that runs one command in a session (AWS-managed; its `command` parameter):
# docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-sessions-start.html
SSM_COMMAND_DOCUMENT = "AWS-StartInteractiveCommand"
INSTALL_SSM = (
    "the AWS CLI v2 and the Session Manager plugin "
    "(docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html)"
)


def _known_node(platform: ResolvedPlatform, node: str) -> None:
    names = [name for pool in platform.pools for name in pool.node_names()]
    if node not in names:
        raise SpecError(f"stack {platform.name} has no node {node!r}; its nodes: {', '.join(names)}")


def host_addresses(platform: ResolvedPlatform) -> dict[str, str]:
    """Each listed host of the stack -> its address: what the inventory gives Ansible (ansible_host) and the
    gateways know its model servers by (roles/inference_gateway/tasks/preflight.yml)."""
    return {h.name: h.address for pool in platform.pools for h in pool.spec.hosts}


@dataclass(frozen=True)
class RunningInstance:
    """A running instance of an AWS stack, as its Ansible inventory and its gateways know it."""

    node: str
    """its name in the inventory: the gpuplat:node tag, else the instance id"""
    instance_id: str
    address: str
    """its private IPv4 address (what the gateways' slots and Ansible's ansible_host name), "" for none yet"""
    pool: str
    """its gpuplat:pool tag ("" for none)"""


def stack_instances(platform: ResolvedPlatform, ec2: Any) -> list[RunningInstance]:
    """The stack's running instances (by its gpuplat:stack tag), named as its Ansible inventory names them:
    by their gpuplat:node tag, else their instance id (inventory.aws_ec2_config `hostnames`)."""
    filters = [
        {"Name": f"tag:{TAG_STACK}", "Values": [platform.name]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    found: list[RunningInstance] = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for instance in (i for r in page["Reservations"] for i in r["Instances"]):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            found.append(
                RunningInstance(
                    node=tags.get(TAG_NODE, instance["InstanceId"]),
                    instance_id=instance["InstanceId"],
                    address=instance.get("PrivateIpAddress", ""),
                    pool=tags.get(TAG_POOL, ""),
                )
            )
    return sorted(found, key=lambda instance: instance.node)


def running_instances(platform: ResolvedPlatform, ec2: Any) -> dict[str, str]:
    """The stack's running instances: node name -> instance id (`stack_instances`)."""
    return {instance.node: instance.instance_id for instance in stack_instances(platform, ec2)}


def running_instance(platform: ResolvedPlatform, node: str, ec2: Any) -> str:
    """The id of the running instance of `node` in the stack (by its gpuplat:stack and gpuplat:node tags)."""
    by_node = running_instances(platform, ec2)
    if node not in by_node:
        running = ", ".join(sorted(by_node)) or "none"
        raise GpuPlatError(
            f"no running instance of node {node!r} in stack {platform.name} (running: {running}); an elastic "
            "pool's node runs only while Slurm has work for it",
            exit_code=ExitCode.BAD_INPUT,
        )
    return by_node[node]


def ssm_nodes(platform: ResolvedPlatform, instances: list[RunningInstance], ssm: Any = None) -> SsmNodes:
    """The running nodes of an AWS stack (`stack_instances`), reached through SSM Run Command
    (infra/nodes/remote.py)."""
    if ssm is None:
        import boto3

        ssm = boto3.client("ssm", region_name=str(platform.spec.region))
    return SsmNodes({instance.node: instance.instance_id for instance in instances}, ssm)


def node_command(platform: ResolvedPlatform, node: str, command: Sequence[str], ec2: Any = None) -> list[str]:
    """The argv that opens a shell on `node` (or runs `command` there)."""
    backend = platform.spec.backend
    if backend == "local":
        _known_node(platform, node)
        interactive = ["-it"] if not command else ["-i"]
        return [
            "podman",
            "exec",
            *interactive,
            container_name(platform.name, node),
            *(command or ["bash", "-l"]),
        ]
    if backend == "onprem":
        hosts = host_addresses(platform)
        if node not in hosts:
            raise SpecError(f"stack {platform.name} has no host {node!r}; its hosts: {', '.join(hosts)}")
        return ssh_argv(hosts[node], command, SshSettings.of_ansible().options())
    missing = [tool for tool in ("aws", "session-manager-plugin") if shutil.which(tool) is None]
    if missing:
        raise EnvironmentProblem(f"an SSM session needs {', '.join(missing)}: install {INSTALL_SSM}")
    region = str(platform.spec.region)  # an AWS stack names its region (the spec requires it)
    if ec2 is None:
        import boto3

        ec2 = boto3.client("ec2", region_name=region)
    target = running_instance(platform, node, ec2)
    session = ["aws", "ssm", "start-session", "--region", region, "--target", target]
    if command:
        # As JSON, not the CLI's shorthand `command=...`: shorthand splits a value at commas and refuses a
        # value with `=` after one (`nvidia-smi --query-gpu=name,memory.used` fails to parse), see
        # awscli/shorthand.py ShorthandParser._values/_csv_value (aws-cli 1.45.11) and
        # docs.aws.amazon.com/cli/latest/userguide/cli-usage-shorthand.html; a value that starts with `{`
        # is read as JSON (awscli/argprocess.py ParamShorthandParser._should_parse_as_shorthand).
        parameters = json.dumps({"command": [shlex.join(command)]})
        session += ["--document-name", SSM_COMMAND_DOCUMENT, "--parameters", parameters]
    return session
