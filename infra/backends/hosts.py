"""Backends without cloud resources: `onprem` (existing hosts) and `local` (podman containers).

Each pool becomes a component that carries its node list as outputs; Ansible does the rest.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.backends.base import common_outputs
from infra.resolve import ResolvedPlatform, ResolvedPool


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
        return outputs
