"""How `gpuplat serve` reaches a stack: its nodes (one `Nodes` per backend, chosen here), its Prometheus."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.nodes.addresses import http_url
from infra.nodes.reach import RunningInstance, host_addresses, ssm_nodes, stack_instances
from infra.nodes.remote import SshNodes, SshSettings
from infra.nodes.role_templates import role_defaults
from infra.platform.resolve import ResolvedPlatform
from infra.serving.release import Nodes
from infra.serving.version_record import VersionRecord

PROMETHEUS_PORT = int(role_defaults("monitoring")["monitoring_prometheus_port"])


@dataclass(frozen=True)
class StackReach:
    """What a release of the stack works through (`Release`'s arguments besides the registry)."""

    nodes: Nodes
    instances: list[RunningInstance] | None = None
    """an AWS stack's running instances (its serving and gateway nodes among them); None elsewhere"""
    version_record: VersionRecord | None = None
    """an AWS stack's record of the stable version, for instances its serving pool starts later"""
    relist: Callable[[], list[RunningInstance]] | None = None
    """an AWS stack's running instances listed again, `nodes` then reaching each (None elsewhere)"""


def stack_reach(platform: ResolvedPlatform, ec2: Any = None, ssm: Any = None) -> StackReach:
    """The local platform's containers (podman exec); an on-premises stack's hosts over ssh at the addresses
    its stack file lists, with the user, key and port Ansible would use; an AWS stack's running instances
    through SSM Run Command, as Ansible's aws_ssm connection reaches them, and its version record."""
    if platform.spec.backend == "onprem":
        return StackReach(SshNodes(host_addresses(platform), SshSettings.of_ansible()))
    if platform.spec.backend == "aws":
        import boto3

        region = str(platform.spec.region)
        ec2 = ec2 or boto3.client("ec2", region_name=region)
        ssm = ssm or boto3.client("ssm", region_name=region)
        instances = _listed(platform, ec2)
        nodes = ssm_nodes(platform, instances, ssm)

        def relist() -> list[RunningInstance]:
            fresh = _listed(platform, ec2)
            nodes.instances = {instance.node: instance.instance_id for instance in fresh}
            return fresh

        return StackReach(nodes, instances, VersionRecord(platform.name, ssm), relist)
    from infra.backends.local.cluster import LocalCluster

    return StackReach(LocalCluster(platform))


def _listed(platform: ResolvedPlatform, ec2: Any) -> list[RunningInstance]:
    from botocore.exceptions import BotoCoreError, ClientError

    from infra.errors import GpuPlatError

    try:
        return stack_instances(platform, ec2)
    except (BotoCoreError, ClientError) as error:
        raise GpuPlatError(
            f"cannot list the running instances of stack {platform.name} ({error}): `gpuplat serve` finds an "
            "AWS stack's nodes by its gpuplat:stack tag, as Ansible's inventory does; your credentials need "
            "ec2:DescribeInstances in its region"
        ) from None


def prometheus_url(platform: ResolvedPlatform, given: str | None) -> str | None:
    """The stack's Prometheus (roles/monitoring, on the controller pool's first node, on every interface):
    given, found on the local platform, or at an on-premises controller's listed address. On aws none is
    found (the controllers have private addresses only): the analysis reads the model servers' own
    histograms through SSM instead, and `serve status` shows no p95 unless one is given."""
    if given:
        return given
    monitor = platform.controller_pool.node_names()[0]
    if platform.spec.backend == "onprem":
        return http_url(host_addresses(platform)[monitor], PROMETHEUS_PORT)
    if platform.spec.backend == "local":
        from infra.backends.local.cluster import LocalCluster

        return LocalCluster(platform).prometheus_url()
    return None
