"""What the Kubernetes layer needs to know about the cluster it runs on, besides the platform.

Values may be Pulumi outputs where the cluster is created in the same program (EKS): the builders
only place them in objects and chart values, never inspect them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.platform.resolve import ResolvedPlatform

SharedVolumeKind = Literal["fsx-csi", "host-path"]

# The cluster autoscaler's service account; on EKS a Pod Identity association gives it its IAM role.
AUTOSCALER_NAMESPACE = "kube-system"
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"
# The model server's service account (serving namespace); on EKS a Pod Identity association gives it
# the models bucket, and nothing reaches the node's role from a pod (instance metadata hop limit 1).
MODEL_SERVER_ACCOUNT = "model-server"


@dataclass(frozen=True)
class SharedVolume:
    """How pods reach the parallel filesystem.

    - `fsx-csi` (EKS): a static PersistentVolume of the FSx for Lustre CSI driver; `attributes` holds
      `file_system_id`, `dns_name` and `mount_name`.
    - `host-path`: the nodes mount it themselves (Ansible's shared_fs role on listed hosts); pods use
      the node's `mount_path`.
    """

    kind: SharedVolumeKind
    mount_path: str
    capacity_tib: float
    attributes: dict[str, Any] = field(default_factory=dict)
    join: Callable[..., Any] = field(default=lambda *parts: "".join(parts))
    """Joins attributes and text into one value: `pulumi.Output.concat` where attributes are outputs."""


@dataclass(frozen=True)
class ClusterFacts:
    shared_volume: SharedVolume
    cluster_name: Any = ""
    """EKS: the cluster's name (the autoscaler discovers node groups by it); "" elsewhere."""
    region: str | None = None
    model_uri: Any = None
    """Where the model server reads the model: on EKS `s3://<purpose>/...` with the purpose's bucket
    name in place (generated at deploy time); None: `serving.model` as written."""
    pod_identity: bool = False
    """EKS Pod Identity gives the model server's service account an IAM role (its token is mounted)."""


def host_path_facts(platform: ResolvedPlatform) -> ClusterFacts:
    """An existing cluster whose nodes mount the shared filesystem (onprem)."""
    fs = platform.spec.storage.parallel_fs
    return ClusterFacts(
        shared_volume=SharedVolume("host-path", fs.mount_path, fs.capacity_tib), region=platform.spec.region
    )
