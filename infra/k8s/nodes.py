"""On an existing cluster the pools' hosts are Kubernetes nodes already: the platform labels and taints
them (server-side apply patches of the Node objects, owned by the platform's field manager). EKS node
groups get the same labels and taints when their nodes are created (infra/backends/aws/eks.py).

A Node's `spec.taints` is one atomic list under server-side apply (the Kubernetes OpenAPI schema
marks NodeSpec.taints `x-kubernetes-list-type: atomic`; v1.31 as kubernetes-validate ships it):
applying the pool's taints alone conflicts with every taint another manager set (kubeadm's
control-plane taint, an operator's), and forcing it would remove them. So the patch carries the
merged list, built at deploy time from the live node (`merged_taints`), and takes ownership of it
(`pulumi.com/patchForce`; pulumi-kubernetes' Patch resources: "Conflicts will result in an error by
default, but can be forced using the pulumi.com/patchForce annotation"). An annotation records which
taints are the platform's, so one dropped from the spec is removed next time while the others stay.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from infra.k8s.objects import Manifest, k8s_object, node_labels
from infra.platform.resolve import ResolvedPlatform

MANAGED_TAINTS_ANNOTATION = "gpuplat/managed-taints"
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"
# The node lifecycle controller's own taints (not-ready, unreachable, ...): they come and go with the
# node's condition, and a patch that kept them would keep them after the condition cleared.
TRANSIENT_TAINT_PREFIX = "node.kubernetes.io/"


def _key(taint: Mapping[str, Any]) -> str:
    return f"{taint.get('key')}:{taint.get('effect')}"


def merged_taints(
    live: Sequence[Mapping[str, Any]], annotations: Mapping[str, str], ours: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The node's taints with the platform's: every live taint of another manager, then the pool's."""
    previous = set(json.loads(annotations.get(MANAGED_TAINTS_ANNOTATION, "[]")))
    mine = {_key(t) for t in ours}
    others = [
        dict(t)
        for t in live
        if _key(t) not in mine | previous and not str(t.get("key", "")).startswith(TRANSIENT_TAINT_PREFIX)
    ]
    return others + [dict(t) for t in ours]


def node_patches(platform: ResolvedPlatform) -> list[Manifest]:
    """A patch per listed host: the pool's labels; its taints, which the Kubernetes layer merges with the
    live node's (infra/k8s/resources.py) under MANAGED_TAINTS_ANNOTATION."""
    patches: list[Manifest] = []
    for pool in platform.pools:
        taints = [t.model_dump(exclude_defaults=False) for t in pool.spec.taints]
        # Every host, tainted or not: a pool whose taints were dropped from the spec has them removed.
        annotations = {
            MANAGED_TAINTS_ANNOTATION: json.dumps(sorted(_key(t) for t in taints)),
            PATCH_FORCE_ANNOTATION: "true",
        }
        for host in pool.spec.hosts:
            patch = k8s_object(
                "v1", "Node", host.name, labels=node_labels(pool), annotations=dict(annotations)
            )
            patch["spec"] = {"taints": taints}
            patches.append(patch)
    return patches
