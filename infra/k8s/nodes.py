"""On an existing cluster the pools' hosts are Kubernetes nodes already: the platform labels and taints
them (server-side apply patches of the Node objects, owned by the platform's field manager). EKS node
groups get the same labels and taints when their nodes are created (infra/backends/aws/eks.py)."""

from __future__ import annotations

from infra.k8s.objects import Manifest, k8s_object, node_labels
from infra.resolve import ResolvedPlatform


def node_patches(platform: ResolvedPlatform) -> list[Manifest]:
    patches: list[Manifest] = []
    for pool in platform.pools:
        taints = [t.model_dump(exclude_defaults=False) for t in pool.spec.taints]
        for host in pool.spec.hosts:
            patch = k8s_object("v1", "Node", host.name, labels=node_labels(pool))
            if taints:
                patch["spec"] = {"taints": taints}
            patches.append(patch)
    return patches
