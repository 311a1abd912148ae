"""The operators of the Kubernetes layer, as Helm releases pinned in infra/data/kubernetes.yaml.

`releases` lists the ones a stack needs, in install order: node-level plugins and the autoscaler
first, then metrics, then the controllers whose custom resources the layer's objects are.
Controllers run on the service pool; node daemonsets tolerate the taints of the pools they serve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from infra.data.load import DATA_DIR, load_data_file
from infra.data.models import Sourced
from infra.errors.problems import spec_error
from infra.k8s.facts import AUTOSCALER_NAMESPACE, AUTOSCALER_SERVICE_ACCOUNT, ClusterFacts
from infra.k8s.objects import (
    GPU_RESOURCE,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TEAM,
    MONITORING_NAMESPACE,
    TEAM_GPU_RESOURCE,
    HelmRelease,
    tolerations,
)
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.spec.load import CONFIG_KEY
from infra.spec.models import Kubernetes

KUBERNETES_FILE = DATA_DIR / "kubernetes.yaml"

KUEUE_NAMESPACE = "kueue-system"
JOBSET_NAMESPACE = "jobset-system"
LWS_NAMESPACE = "lws-system"
KEDA_NAMESPACE = "keda"
GPU_OPERATOR_NAMESPACE = "gpu-operator"
KUBE_SYSTEM_NAMESPACE = "kube-system"

# The prometheus chart names its server Service `<release>-server` when the release name contains
# "prometheus" (templates/_helpers.tpl, prometheus.server.fullname, chart 29.27.0).
PROMETHEUS_RELEASE = "prometheus"
PROMETHEUS_PORT = 80
PROMETHEUS_URL = f"http://{PROMETHEUS_RELEASE}-server.{MONITORING_NAMESPACE}.svc:{PROMETHEUS_PORT}"

KUEUE_RELEASE = "kueue"
KUEUE_CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
# Kueue 0.19 labels a job that names no queue with its namespace's LocalQueue of this name, if one
# exists (LocalQueueDefaulting: GA and locked in 0.17, gate removed in 0.19;
# pkg/controller/constants/constants.go, DefaultLocalQueueName, at v0.19.2).
DEFAULT_LOCAL_QUEUE = "default"
# `pod`, `deployment` and `statefulset` too: a bare Pod, Deployment or StatefulSet in a team namespace
# that asks for GPUs waits for its queue like a Job, so nothing a member can create skips the quota and
# fair sharing (apis/config/v1beta2/configuration_types.go:540-557; pkg/controller/jobs/pod,
# deployment, statefulset at v0.19.2: the last two need pod's integration, which they enable).
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset", "pod", "deployment", "statefulset")
# Quota is checked only for the resources a ClusterQueue covers (infra.k8s.queues covers GPUs only);
# feature gate QuotaCheckStrategy is beta and on by default in 0.19 (pkg/features/kube_features.go).
KUEUE_QUOTA_CHECK_STRATEGY = "IgnoreUndeclared"

PROVISIONING_REQUEST_CRD_URL = (
    "https://raw.githubusercontent.com/kubernetes/autoscaler/cluster-autoscaler-{version}/"
    "cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml"
)

_SERVICE_NODES = {LABEL_ROLE: "service"}
_GPU_ROLES = ("train", "infer")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Chart(Sourced):
    repository: str | None = Field(description="Helm repository URL; null where `chart` is an oci:// ref")
    chart: str = Field(min_length=1)
    version: str = Field(pattern=r"^v?\d+\.\d+\.\d+$")


class Charts(_Strict):
    kueue: Chart
    jobset: Chart
    leaderworkerset: Chart
    keda: Chart
    gpu_operator: Chart
    efa_device_plugin: Chart
    cluster_autoscaler: Chart
    fsx_csi_driver: Chart
    prometheus: Chart


class AutoscalerImage(Sourced):
    tag: str = Field(pattern=r"^v1\.\d+\.\d+$")


class KubernetesData(_Strict):
    charts: Charts
    cluster_autoscaler_images: dict[str, AutoscalerImage] = Field(
        description="cluster-autoscaler image per Kubernetes minor (the stack's kubernetes.version)"
    )


def load_kubernetes_data(path: Path) -> KubernetesData:
    return load_data_file(path, KubernetesData)


@cache
def kubernetes_data() -> KubernetesData:
    return load_kubernetes_data(KUBERNETES_FILE)


def releases(platform: ResolvedPlatform, facts: ClusterFacts) -> list[HelmRelease]:
    """The Helm releases the platform's Kubernetes layer needs, in install order."""
    k8s = platform.spec.kubernetes
    if k8s is None:
        raise ValueError(f"{platform.name}: the Kubernetes layer needs the kubernetes section")
    charts = kubernetes_data().charts
    found: list[HelmRelease | None] = [
        _cluster_autoscaler(platform, k8s, facts, charts.cluster_autoscaler),
        _fsx_csi_driver(platform, facts, charts.fsx_csi_driver),
        _efa_device_plugin(platform, charts.efa_device_plugin),
        _gpu_operator(platform, charts.gpu_operator),
        _prometheus(platform, charts.prometheus),
        _keda(platform, charts.keda),
        _jobset(platform, charts.jobset),
        _leaderworkerset(platform, charts.leaderworkerset),
        _kueue(platform, charts.kueue),
    ]
    return [release for release in found if release is not None]


def _release(
    name: str,
    chart: Chart,
    namespace: str,
    values: dict[str, Any],
    provides: tuple[str, ...] = (),
) -> HelmRelease:
    return HelmRelease(
        name=name,
        chart=chart.chart,
        version=chart.version,
        repository=chart.repository,
        namespace=namespace,
        values=values,
        provides=provides,
        source=chart.source,
    )


def _tolerating(pools: Iterable[ResolvedPool]) -> list[dict[str, str]]:
    """Tolerations for every taint of `pools`, each once."""
    unique: list[dict[str, str]] = []
    for pool in pools:
        unique += [t for t in tolerations(pool) if t not in unique]
    return unique


def _joined(*lists: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """One list of fresh copies: a values tree shares no object (YAML would write it as an alias)."""
    return [dict(item) for items in lists for item in items]


# kubeadm taints its control-plane nodes (cmd/kubeadm/app/constants/constants.go, ControlPlaneTaint;
# `node-role.kubernetes.io/master` until 1.24). On an existing cluster the service pool's hosts are
# often those nodes, and a controller that does not tolerate it stays Pending.
CONTROL_PLANE_TOLERATION = {
    "key": "node-role.kubernetes.io/control-plane",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def _on_service_pool(platform: ResolvedPlatform) -> dict[str, Any]:
    """nodeSelector and tolerations that place a controller on the service pool."""
    placement: dict[str, Any] = {"nodeSelector": dict(_SERVICE_NODES)}
    service_tolerations = _tolerating(platform.pools_with_role("service"))
    k8s = platform.spec.kubernetes
    if k8s is not None and k8s.distribution == "existing":
        service_tolerations = [*service_tolerations, dict(CONTROL_PLANE_TOLERATION)]
    if service_tolerations:
        placement["tolerations"] = service_tolerations
    return placement


def _region(platform: ResolvedPlatform, facts: ClusterFacts) -> str | None:
    return facts.region or platform.spec.region


def _cluster_autoscaler(
    platform: ResolvedPlatform, k8s: Kubernetes, facts: ClusterFacts, chart: Chart
) -> HelmRelease | None:
    """Scales the EKS node groups it discovers by the cluster's name (their Auto Scaling group tags).

    Its IAM role comes from an EKS Pod Identity association for AUTOSCALER_SERVICE_ACCOUNT, so the
    service account carries no IRSA annotation.
    """
    if k8s.distribution != "eks" or k8s.scaler != "cluster-autoscaler":
        return None
    images = kubernetes_data().cluster_autoscaler_images
    image = images.get(k8s.version)
    if image is None:
        raise spec_error(
            platform.source,
            [
                (
                    f"{CONFIG_KEY}.kubernetes.version",
                    f"no cluster-autoscaler image is pinned for Kubernetes {k8s.version} in "
                    f"{KUBERNETES_FILE} (pinned: {', '.join(sorted(images))}); use one of those or set "
                    "kubernetes.autoscaler: none",
                )
            ],
        )
    values: dict[str, Any] = {
        "cloudProvider": "aws",
        "autoDiscovery": {"clusterName": facts.cluster_name},
        "awsRegion": _region(platform, facts),
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SERVICE_ACCOUNT}},
        "image": {"tag": image.tag},
        # ProvisioningRequests, which Kueue's admission check on autoscaled pools creates (infra.k8s.queues):
        # the flag and the JSON content type its client needs (cluster-autoscaler/FAQ.md, "How can I use
        # ProvisioningRequest to run batch workloads", at cluster-autoscaler-1.34.5). The chart's
        # ClusterRole already grants provisioningrequests (templates/clusterrole.yaml:219-229 at
        # cluster-autoscaler-chart-9.59.0); the CRD is not in the chart: applied from the image's tag.
        "extraArgs": {
            "enable-provisioning-requests": True,
            "kube-api-content-type": "application/json",
        },
        **_on_service_pool(platform),
    }
    release = _release("cluster-autoscaler", chart, AUTOSCALER_NAMESPACE, values)
    crd = PROVISIONING_REQUEST_CRD_URL.format(version=image.tag.removeprefix("v"))
    return dataclasses.replace(release, crd_urls=(crd,), provides=("autoscaling.x-k8s.io",))


def _fsx_csi_driver(platform: ResolvedPlatform, facts: ClusterFacts, chart: Chart) -> HelmRelease | None:
    """Mounts the FSx for Lustre file system through a static PersistentVolume.

    Static provisioning needs no AWS API call: the controller calls FSx only for CreateVolume,
    DeleteVolume and ControllerExpandVolume (its only capabilities, pkg/driver/controller.go at
    helm-chart-aws-fsx-csi-driver-1.17.0), which a pre-created volume never reaches, and the node
    plugin mounts with the Lustre client. So neither gets IAM. The region is given so that neither
    reads it from the instance metadata service.
    """
    if facts.shared_volume.kind != "fsx-csi":
        return None
    region = _region(platform, facts)
    values: dict[str, Any] = {"controller": {"region": region, **_on_service_pool(platform)}}
    values["node"] = {"region": region}
    return _release("aws-fsx-csi-driver", chart, KUBE_SYSTEM_NAMESPACE, values)


def _efa_pools(platform: ResolvedPlatform) -> list[ResolvedPool]:
    return [pool for pool in platform.pools if platform.uses_efa(pool)]


def _efa_device_plugin(platform: ResolvedPlatform, chart: Chart) -> HelmRelease | None:
    """Advertises the EFA interfaces (vpc.amazonaws.com/efa) on the EFA training pools, and only there."""
    pools = _efa_pools(platform)
    if not pools:
        return None
    values = {
        "nodeSelector": {LABEL_ROLE: "train"},
        # The chart requires one of these node labels (its affinity); the pool label narrows it to EFA pools.
        "supportedInstanceLabels": {"keys": [LABEL_POOL], "values": [pool.name for pool in pools]},
        "tolerations": _tolerating(pools),
    }
    return _release("aws-efa-k8s-device-plugin", chart, KUBE_SYSTEM_NAMESPACE, values)


# Chart defaults that replacing a toleration list would drop (values.yaml at v26.7.0).
_GPU_OPERATOR_DEFAULT_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
_CONTROL_PLANE_TOLERATION = {
    "key": "node-role.kubernetes.io/control-plane",
    "operator": "Equal",
    "value": "",
    "effect": "NoSchedule",
}
_NFD_WORKER_DEFAULT_TOLERATIONS = [_CONTROL_PLANE_TOLERATION, *_GPU_OPERATOR_DEFAULT_TOLERATIONS]


def _device_plugin(platform: ResolvedPlatform) -> dict[str, Any]:
    """On hosts the container_runtime role configures, the GPUs a pod was allocated reach the runtime as
    volume mounts: that toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers (config.toml.j2,
    NVIDIA's "preventing unprivileged access to GPUs" setting), so the plugin's default (envvar) would give
    pods no GPU (NVIDIA/k8s-device-plugin: DEVICE_LIST_STRATEGY envvar | volume-mounts). EKS's AMI brings
    its own toolkit with NVIDIA's default configuration, which reads the variable: the default stays."""
    if platform.spec.backend == "aws":
        return {"enabled": True}
    return {"enabled": True, "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]}


def _gpu_operator(platform: ResolvedPlatform, chart: Chart) -> HelmRelease:
    """Device plugin, GPU feature discovery and DCGM exporter on every GPU node.

    The driver and the container toolkit are the node's: the EKS-optimized AL2023 NVIDIA AMI ships
    both (https://docs.aws.amazon.com/eks/latest/userguide/ml-eks-optimized-ami.html;
    templates/al2023/provisioners/install-nvidia-driver.sh in github.com/awslabs/amazon-eks-ami
    installs the driver and nvidia-container-toolkit), and on listed hosts the gpu_driver and
    container_runtime roles install them. driver.enabled/toolkit.enabled false is NVIDIA's setting
    for pre-installed drivers and toolkit
    (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/install-gpu-operator.html).
    """
    pool_tolerations = _tolerating(pool for pool in platform.pools if pool.role in _GPU_ROLES)
    values = {
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "devicePlugin": _device_plugin(platform),
        # The ServiceMonitor CRD (Prometheus operator) is not installed; Prometheus finds the exporter itself.
        "dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": False}},
        "daemonsets": {"tolerations": _joined(_GPU_OPERATOR_DEFAULT_TOLERATIONS, pool_tolerations)},
        "operator": _on_service_pool(platform),
        # Node Feature Discovery labels the GPU nodes the operator's daemonsets select: it must reach them.
        "node-feature-discovery": {
            "worker": {"tolerations": _joined(_NFD_WORKER_DEFAULT_TOLERATIONS, pool_tolerations)},
            "master": _on_service_pool(platform),
            "gc": _on_service_pool(platform),
        },
    }
    return _release(
        "gpu-operator",
        chart,
        GPU_OPERATOR_NAMESPACE,
        values,
        provides=("nvidia.com", "resource.nvidia.com", "nfd.k8s-sigs.io"),
    )


def _prometheus(platform: ResolvedPlatform, chart: Chart) -> HelmRelease | None:
    """Scrapes the pods annotated prometheus.io/scrape (the chart's kubernetes-pods job) for KEDA."""
    if platform.spec.serving is None:
        return None
    values = {
        "server": {
            **_on_service_pool(platform),
            "service": {"servicePort": PROMETHEUS_PORT},
            # Autoscaling reads minutes of data; an emptyDir needs no StorageClass, which neither an
            # EKS cluster without the EBS CSI driver nor an arbitrary existing cluster is sure to have.
            "persistentVolume": {"enabled": False},
        },
        "alertmanager": {"enabled": False},
        "prometheus-pushgateway": {"enabled": False},
        "kube-state-metrics": {"enabled": False},
        # Listed hosts run node_exporter from the node_exporter role on the host port this one would take.
        "prometheus-node-exporter": {"enabled": False},
    }
    return _release(PROMETHEUS_RELEASE, chart, MONITORING_NAMESPACE, values)


def _keda(platform: ResolvedPlatform, chart: Chart) -> HelmRelease | None:
    """Scales the model servers on the serving metrics it reads from PROMETHEUS_URL."""
    if platform.spec.serving is None:
        return None
    return _release(
        "keda", chart, KEDA_NAMESPACE, _on_service_pool(platform), provides=("keda.sh", "eventing.keda.sh")
    )


def _jobset(platform: ResolvedPlatform, chart: Chart) -> HelmRelease:
    """Multi-node training jobs (one Job per role), admitted by Kueue as one workload."""
    values = {"controller": _on_service_pool(platform)}
    return _release("jobset", chart, JOBSET_NAMESPACE, values, provides=("jobset.x-k8s.io",))


def _leaderworkerset(platform: ResolvedPlatform, chart: Chart) -> HelmRelease | None:
    """Model servers that span nodes (one leader, its workers), only where a replica needs more than one."""
    if platform.serving_layout is None or platform.serving_layout.nodes <= 1:
        return None
    return _release(
        "lws",
        chart,
        LWS_NAMESPACE,
        _on_service_pool(platform),
        provides=("leaderworkerset.x-k8s.io", "disaggregatedset.x-k8s.io"),
    )


# The chart's own base configuration (charts/kueue/values.yaml at v0.19.2): a given
# controllerManagerConfigYaml replaces it whole.
_KUEUE_BASE_CONFIG: dict[str, Any] = {
    "health": {"healthProbeBindAddress": ":8081"},
    "metrics": {"bindAddress": ":8443"},
    "webhook": {"port": 9443},
    "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
    "controller": {
        "groupKindConcurrency": {
            "Job.batch": 5,
            "Pod": 5,
            "Workload.kueue.x-k8s.io": 10,
            "LocalQueue.kueue.x-k8s.io": 5,
            "ClusterQueue.kueue.x-k8s.io": 5,
            "ResourceFlavor.kueue.x-k8s.io": 1,
        }
    },
    "clientConnection": {"qps": 300, "burst": 500},
}


# All or nothing: an admitted workload whose pods are not all ready within the timeout is evicted and
# requeued (with exponential back-off from 60 s), so a half-started multi-node job does not hold its
# nodes and quota. The timeout covers a GPU node group scaling out from zero (boot, join, device plugin)
# and pulling a training image; a job that loses a pod while running gets the same time to replace it.
# Presence enables it in v1beta2; `timeout` is required (pkg/config/validation.go, v0.19.2).
KUEUE_WAIT_FOR_PODS_READY: dict[str, Any] = {
    "timeout": "20m",
    "blockAdmission": False,
    "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60},
}


# Every GPU a workload requests also counts one TEAM_GPU_RESOURCE (the GPU itself is kept: Retain), the
# quota-only resource a ClusterQueue's cap across flavors is written in (infra.k8s.queues).
# apis/config/v1beta2/configuration_types.go:597-632 at v0.19.2.
KUEUE_TEAM_GPU_TRANSFORMATION: dict[str, Any] = {
    "input": GPU_RESOURCE,
    "strategy": "Retain",
    "outputs": {TEAM_GPU_RESOURCE: "1"},
}


def kueue_manager_config() -> dict[str, Any]:
    """Kueue's Configuration (apis/config/v1beta2/configuration_types.go at v0.19.2).

    Only team namespaces are managed, so Kueue never holds back the serving namespace's pods; in
    them every Job and JobSet waits for its queue, a queue-less one in the LocalQueue
    DEFAULT_LOCAL_QUEUE. Fair sharing is on when the section is present (v1beta2 dropped `enable`);
    the strategies are v1beta1's default order (one of the sets pkg/config/validation.go accepts).
    """
    return {
        "apiVersion": KUEUE_CONFIG_API_VERSION,
        "kind": "Configuration",
        **_KUEUE_BASE_CONFIG,
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": LABEL_TEAM, "operator": "Exists"}]},
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        "waitForPodsReady": KUEUE_WAIT_FOR_PODS_READY,
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        "resources": {
            "quotaCheckStrategy": KUEUE_QUOTA_CHECK_STRATEGY,
            "transformations": [KUEUE_TEAM_GPU_TRANSFORMATION],
        },
    }


def _kueue(platform: ResolvedPlatform, chart: Chart) -> HelmRelease:
    config = yaml.safe_dump(kueue_manager_config(), sort_keys=False)
    values = {
        "controllerManager": _on_service_pool(platform),
        "managerConfig": {"controllerManagerConfigYaml": config},
    }
    return _release(KUEUE_RELEASE, chart, KUEUE_NAMESPACE, values, provides=("kueue.x-k8s.io",))
