"""Names, labels and the object shape every builder of the Kubernetes layer shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.platform.resolve import ResolvedPlatform, ResolvedPool

Manifest = dict[str, Any]

LABEL_POOL = "gpuplat/pool"
LABEL_ROLE = "gpuplat/role"
LABEL_CAPACITY = "gpuplat/capacity"
LABEL_TEAM = "gpuplat/team"
LABEL_COMPONENT = "gpuplat/component"
LABEL_STACK = "gpuplat/stack"
GPU_RESOURCE = "nvidia.com/gpu"
# The quota-only resource a team's cap across flavors is counted in (Kueue's resource transformation adds
# one per GPU requested: infra.k8s.operators); a qualified name outside kubernetes.io, which is reserved.
TEAM_GPU_RESOURCE = "gpuplat/team-gpus"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
SYSTEM_NAMESPACE = "gpuplat-system"
MONITORING_NAMESPACE = "monitoring"
# The label the Kubernetes API server sets on every namespace (1.22+): selects a namespace by name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def monitoring_peer() -> dict[str, Any]:
    """A NetworkPolicy peer: every pod of the monitoring namespace (Prometheus scrapes)."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE}}}


def team_namespace(team: str) -> str:
    return f"team-{team}"


def serving_namespace(platform: ResolvedPlatform) -> str:
    k8s = platform.spec.kubernetes
    return k8s.serving_namespace if k8s is not None else "serving"


def capacity_label(pool: ResolvedPool) -> str:
    return "spot" if pool.spec.capacity == "spot" else "on-demand"


def node_labels(pool: ResolvedPool) -> dict[str, str]:
    """Labels every node of a pool carries (EKS node group labels, NodePatch on existing clusters):
    the spec's labels, then the platform's, which win."""
    return {
        **pool.spec.labels,
        LABEL_POOL: pool.name,
        LABEL_ROLE: pool.role,
        LABEL_CAPACITY: capacity_label(pool),
    }


def tolerations(pool: ResolvedPool) -> list[dict[str, str]]:
    """Tolerations that let a pod onto every taint of `pool`, and no other."""
    return [
        {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
        if t.value
        else {"key": t.key, "operator": "Exists", "effect": t.effect}
        for t in pool.spec.taints
    ]


def k8s_object(
    api_version: str,
    kind: str,
    name: str,
    namespace: str | None = None,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **body: Any,
) -> Manifest:
    """One Kubernetes object; `body` holds its top-level fields besides metadata (spec, data, ...)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


def identity(manifest: Manifest) -> str:
    """`Kind namespace/name` (or `Kind name` for cluster-scoped objects), as messages name an object."""
    meta = manifest.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{manifest.get('kind')} {where}{meta.get('name')}"


# A chart's CRDs applied from a URL are the resources `<release>-crd-<n>` (infra/k8s/resources.py), which
# `gpuplat manifests` reads back (infra/cli/commands/manifests.py).
CRD_SUFFIX = "-crd-"


@dataclass(frozen=True)
class HelmRelease:
    """One operator installed from its Helm chart, at a version pinned in infra/data/kubernetes.yaml."""

    name: str
    chart: str
    """Chart name in `repository`, or a full `oci://` reference (then `repository` is None)."""
    version: str
    repository: str | None
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)
    provides: tuple[str, ...] = ()
    """API groups whose CRDs the chart installs: custom resources of these groups wait for it."""
    source: str = ""
    crd_urls: tuple[str, ...] = ()
    """CRDs the chart needs but does not install: applied from these pinned URLs before it."""
