"""The whole Kubernetes layer of a stack: the operators' Helm releases and every object, in the order
they are applied (namespaces first, custom resources after the charts that install their CRDs)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.k8s.facts import ClusterFacts
from infra.k8s.isolation import isolation_objects
from infra.k8s.nodes import node_patches
from infra.k8s.objects import HelmRelease, Manifest, k8s_object
from infra.k8s.operators import releases
from infra.k8s.queues import queue_objects
from infra.k8s.serving import serving_objects
from infra.k8s.shared_dirs import team_directory_objects
from infra.k8s.tenancy import team_objects
from infra.platform.resolve import ResolvedPlatform

# Namespaces every cluster has: never declared (and so never deleted) by the platform.
BUILT_IN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


@dataclass(frozen=True)
class KubernetesLayer:
    releases: list[HelmRelease]
    node_patches: list[Manifest]
    objects: list[Manifest]

    def namespaces(self) -> set[str]:
        return {o["metadata"]["name"] for o in self.objects if o["kind"] == "Namespace"}


def _release_namespaces(charts: list[HelmRelease], declared: set[str]) -> list[Manifest]:
    wanted = sorted({r.namespace for r in charts} - declared - BUILT_IN_NAMESPACES)
    return [k8s_object("v1", "Namespace", name) for name in wanted]


def _apply_order(manifest: Manifest) -> int:
    kind = manifest["kind"]
    if kind == "Namespace":
        return 0
    return 1 if "namespace" not in manifest["metadata"] else 2


def kubernetes_layer(platform: ResolvedPlatform, facts: ClusterFacts) -> KubernetesLayer:
    charts = releases(platform, facts)
    objects = [
        *team_objects(platform, facts),
        *team_directory_objects(platform, facts),
        *queue_objects(platform),
        *isolation_objects(platform),
        *serving_objects(platform, facts),
    ]
    declared = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    objects = _release_namespaces(charts, declared) + objects
    objects.sort(key=_apply_order)
    k8s = platform.spec.kubernetes
    patches = node_patches(platform) if k8s is not None and k8s.distribution == "existing" else []
    return KubernetesLayer(releases=charts, node_patches=patches, objects=objects)
