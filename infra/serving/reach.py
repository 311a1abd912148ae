"""How `gpuplat serve` reaches a stack: its nodes (one `Nodes` per backend, chosen here), its Prometheus."""

from __future__ import annotations

from infra.nodes.addresses import http_url
from infra.nodes.reach import host_addresses
from infra.nodes.remote import SshNodes, SshSettings
from infra.nodes.role_templates import role_defaults
from infra.platform.resolve import ResolvedPlatform
from infra.serving.release import Nodes

PROMETHEUS_PORT = int(role_defaults("monitoring")["monitoring_prometheus_port"])


def stack_nodes(platform: ResolvedPlatform) -> Nodes:
    """The local platform's containers (podman exec), or an on-premises stack's hosts over ssh at the
    addresses its stack file lists, with the user, key and port Ansible would use."""
    if platform.spec.backend == "onprem":
        return SshNodes(host_addresses(platform), SshSettings.of_ansible())
    from infra.backends.local.cluster import LocalCluster

    return LocalCluster(platform)


def prometheus_url(platform: ResolvedPlatform, given: str | None) -> str | None:
    """The stack's Prometheus (roles/monitoring, on the controller pool's first node, on every interface):
    given, found on the local platform, or at an on-premises controller's listed address."""
    if given:
        return given
    monitor = platform.controller_pool.node_names()[0]
    if platform.spec.backend == "onprem":
        return http_url(host_addresses(platform)[monitor], PROMETHEUS_PORT)
    if platform.spec.backend == "local":
        from infra.backends.local.cluster import LocalCluster

        return LocalCluster(platform).prometheus_url()
    return None
