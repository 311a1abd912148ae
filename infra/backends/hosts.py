"""Backends without cloud resources: `onprem` (existing hosts) and `local` (podman containers).

Each pool becomes a component that carries its node list as outputs; Ansible does the rest. With
scheduler.kind kueue the hosts are the nodes of an existing Kubernetes cluster, which gets the
Kubernetes layer (infra/k8s) through the stack's kubeconfig.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.backends.base import common_outputs
from infra.platform.resolve import ResolvedPlatform, ResolvedPool


class HostPool(pulumi.ComponentResource):
    """A pool of machines that exist outside Pulumi: listed hosts on-prem, containers locally."""

    def __init__(
        self, name: str, backend: str, pool: ResolvedPool, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(f"gpu-platform:{backend}:HostPool", name, None, opts)
        hosts = {h.name: h.address for h in pool.spec.hosts} or {n: n for n in pool.node_names()}
        self.hosts = pulumi.Output.from_input(hosts)
        self.register_outputs({"hosts": self.hosts, "role": pool.role, "gpus_per_node": pool.gpus_per_node})


class HostBackend:
    def __init__(self, backend: str) -> None:
        self.backend = backend

    def declare(self, platform: ResolvedPlatform) -> dict[str, Any]:
        pools = {pool.name: HostPool(pool.name, self.backend, pool) for pool in platform.pools}
        outputs = common_outputs(platform)
        outputs["hosts"] = {name: component.hosts for name, component in pools.items()}
        if platform.spec.scheduler.kind == "kueue":
            from infra.k8s.facts import host_path_facts
            from infra.k8s.resources import declare_layer, existing_cluster_provider

            outputs |= declare_layer(platform, existing_cluster_provider(platform), host_path_facts(platform))
        return outputs
