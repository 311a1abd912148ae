"""The small interface every backend implements: declare the platform's resources, return outputs."""

from __future__ import annotations

from typing import Any, Protocol

from infra.platform.resolve import ResolvedPlatform


class Backend(Protocol):
    def declare(self, platform: ResolvedPlatform) -> dict[str, Any]:
        """Declare resources (parented components) and return the stack outputs to export."""
        ...


def common_outputs(platform: ResolvedPlatform) -> dict[str, Any]:
    """Outputs every backend exports: what Ansible and users need to find and size the platform."""
    return {
        "backend": platform.spec.backend,
        "pools": {
            pool.name: {
                "role": pool.role,
                "instance_type": pool.node_type.name,
                "nodes": pool.spec.max_nodes,
                "gpus_per_node": pool.gpus_per_node,
                "capacity": pool.spec.capacity,
            }
            for pool in platform.pools
        },
        "software": {
            "driver_version": platform.software.driver_version,
            "cuda": platform.software.cuda,
            "nccl": platform.software.nccl,
        },
        "checkpoint_path": platform.spec.storage.checkpoint_path,
    }
