"""The operators' Helm releases: pinned to the CRDs' release tags, placed where their pods must run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.errors import SpecError
from infra.k8s.facts import AUTOSCALER_SERVICE_ACCOUNT, host_path_facts
from infra.k8s.objects import (
    LABEL_COMPONENT,
    LABEL_TEAM,
    NAMESPACE_NAME_LABEL,
    HelmRelease,
    node_labels,
    serving_namespace,
    team_namespace,
)
from infra.k8s.operators import (
    DEFAULT_LOCAL_QUEUE,
    KUBERNETES_FILE,
    KUEUE_NAMESPACE,
    PROMETHEUS_URL,
    kueue_manager_config,
    load_kubernetes_data,
    releases,
)
from infra.k8s.queues import queue_objects
from infra.platform.resolve import ResolvedPlatform, ResolvedPool, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.upstream import CRDS

REPO = Path(__file__).resolve().parents[2]
# The CRDs copied from their release tags (tests/data/upstream/k8s-crds/SOURCES.md).
CRD_SOURCES = CRDS / "SOURCES.md"

# Fields of Kueue's Configuration (apis/config/v1beta2/configuration_types.go at v0.19.2), the
# ControllerManager fields inlined.
KUEUE_CONFIGURATION_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "webhook",
    "leaderElection",
    "metrics",
    "health",
    "pprofBindAddress",
    "controller",
    "tls",
    "manageJobsWithoutQueueName",
    "managedJobsNamespaceSelector",
    "internalCertManagement",
    "waitForPodsReady",
    "clientConnection",
    "integrations",
    "multiKueue",
    "fairSharing",
    "admissionFairSharing",
    "resources",
    "featureGates",
    "objectRetentionPolicies",
    "visibilityServer",
}


class _Output:
    """Stands in for a Pulumi output: the builders must place it, never read it."""


CLUSTER_NAME = _Output()
# API groups of the CRDs in SOURCES.md that charts of the layer install.
CRD_CHART_GROUPS = ("kueue.x-k8s.io", "jobset.x-k8s.io", "leaderworkerset.x-k8s.io", "keda.sh", "nvidia.com")


@pytest.fixture(scope="module")
def aws_k8s() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


@pytest.fixture(scope="module")
def onprem_k8s() -> ResolvedPlatform:
    """An existing cluster on listed hosts; its 405B model spans two nodes per replica."""
    return load_platform(stack_file("onprem-k8s"))


def by_name(found: list[HelmRelease]) -> dict[str, HelmRelease]:
    return {release.name: release for release in found}


def crd_tags() -> dict[str, str]:
    """API group -> release tag its CRDs were copied from, read from SOURCES.md."""
    path = CRD_SOURCES
    tags: dict[str, str] = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].endswith(".yaml"):
            tags[cells[0].split("_")[0]] = cells[2]
    return tags


def tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' rule: same key (an empty key with Exists matches all), same effect (empty: any),
    and Exists or an equal value."""
    if toleration.get("key", "") not in ("", taint["key"]):
        return False
    if toleration.get("effect", "") not in ("", taint["effect"]):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def taints(pool: ResolvedPool) -> list[dict[str, str]]:
    return [{"key": t.key, "value": t.value or "", "effect": t.effect} for t in pool.spec.taints]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) applied to `labels`."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def kueue_config(found: list[HelmRelease]) -> dict[str, Any]:
    text = by_name(found)["kueue"].values["managerConfig"]["controllerManagerConfigYaml"]
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def test_crd_providing_charts_match_the_crd_release_tags(
    aws_k8s: ResolvedPlatform, onprem_k8s: ResolvedPlatform
) -> None:
    tags = crd_tags()
    found = releases(aws_k8s, fsx_facts(CLUSTER_NAME)) + releases(onprem_k8s, host_path_facts(onprem_k8s))
    checked = set()
    for release in found:
        for group in release.provides:
            if group in tags:
                version, tag = release.version.removeprefix("v"), tags[group].removeprefix("v")
                assert version == tag, (release.name, group)
                checked.add(group)
    assert set(CRD_CHART_GROUPS) <= checked


def test_gpu_operator_daemonsets_tolerate_every_gpu_pool_taint(aws_k8s: ResolvedPlatform) -> None:
    values = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["gpu-operator"].values
    gpu_taints = [t for pool in aws_k8s.pools if pool.role in ("train", "infer") for t in taints(pool)]
    assert len(gpu_taints) == 3  # every GPU pool is tainted in aws-k8s
    lists = {
        "daemonsets": values["daemonsets"]["tolerations"],
        "node-feature-discovery worker": values["node-feature-discovery"]["worker"]["tolerations"],
    }
    for where, found in lists.items():
        for taint in gpu_taints:
            assert any(tolerates(t, taint) for t in found), (where, taint)


def test_gpu_operator_leaves_driver_and_toolkit_to_the_nodes(aws_k8s: ResolvedPlatform) -> None:
    values = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["gpu-operator"].values
    assert values["driver"]["enabled"] is False
    assert values["toolkit"]["enabled"] is False
    assert values["devicePlugin"]["enabled"] is True
    assert values["dcgmExporter"]["enabled"] is True
    assert values["dcgmExporter"]["serviceMonitor"]["enabled"] is False


def test_efa_plugin_on_the_efa_pools_of_aws_only(
    aws_k8s: ResolvedPlatform, onprem_k8s: ResolvedPlatform
) -> None:
    efa = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["aws-efa-k8s-device-plugin"].values
    (key,) = efa["supportedInstanceLabels"]["keys"]
    wanted = efa["supportedInstanceLabels"]["values"]
    assert wanted == ["train", "train-spot"]
    for pool in aws_k8s.pools:
        labels = node_labels(pool)
        placed = efa["nodeSelector"].items() <= labels.items() and labels.get(key) in wanted
        assert placed == (pool.name in wanted), pool.name
        if placed:
            assert all(any(tolerates(t, taint) for t in efa["tolerations"]) for taint in taints(pool))
    assert "aws-efa-k8s-device-plugin" not in by_name(releases(onprem_k8s, host_path_facts(onprem_k8s)))


def test_cluster_autoscaler_on_eks_with_the_cluster_name_placed(aws_k8s: ResolvedPlatform) -> None:
    autoscaler = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["cluster-autoscaler"]
    assert autoscaler.values["autoDiscovery"]["clusterName"] is CLUSTER_NAME
    assert autoscaler.values["awsRegion"] == "us-east-1"
    assert autoscaler.values["rbac"]["serviceAccount"]["name"] == AUTOSCALER_SERVICE_ACCOUNT
    assert "annotations" not in autoscaler.values["rbac"]["serviceAccount"]  # Pod Identity, not IRSA
    assert autoscaler.values["image"]["tag"].startswith("v1.34.")  # aws-k8s runs Kubernetes 1.34


def test_no_cluster_autoscaler_when_autoscaler_none(
    write_stack: Callable[..., Path], onprem_k8s: ResolvedPlatform
) -> None:
    def mutate(platform: dict[str, Any]) -> None:
        platform["kubernetes"]["autoscaler"] = "none"

    platform = load_platform(write_stack("aws-k8s", mutate))
    assert "cluster-autoscaler" not in by_name(releases(platform, fsx_facts(CLUSTER_NAME)))
    assert "cluster-autoscaler" not in by_name(releases(onprem_k8s, host_path_facts(onprem_k8s)))


def test_unpinned_kubernetes_minor_names_the_stack_field(write_stack: Callable[..., Path]) -> None:
    def mutate(platform: dict[str, Any]) -> None:
        platform["kubernetes"]["version"] = "1.20"

    platform = load_platform(write_stack("aws-k8s", mutate))
    with pytest.raises(SpecError) as raised:
        releases(platform, fsx_facts(CLUSTER_NAME))
    assert "kubernetes.version" in raised.value.message
    assert "1.20" in raised.value.message


def test_kueue_manages_team_namespaces_only(aws_k8s: ResolvedPlatform) -> None:
    config = kueue_config(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["kind"] == "Configuration"
    assert set(config) <= KUEUE_CONFIGURATION_FIELDS
    selector = config["managedJobsNamespaceSelector"]
    serving = serving_namespace(aws_k8s)
    assert not selects(selector, {NAMESPACE_NAME_LABEL: serving, LABEL_COMPONENT: "serving"})
    for system in ("kube-system", KUEUE_NAMESPACE):  # Kueue refuses a selector matching these
        assert not selects(selector, {NAMESPACE_NAME_LABEL: system})
    for team in aws_k8s.spec.scheduler.teams:
        assert selects(selector, {NAMESPACE_NAME_LABEL: team_namespace(team.name), LABEL_TEAM: team.name})


def test_kueue_queues_every_team_job_with_fair_sharing(aws_k8s: ResolvedPlatform) -> None:
    config = kueue_config(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))
    assert config["manageJobsWithoutQueueName"] is True
    assert config["fairSharing"]["preemptionStrategies"]
    # Bare Pods, Deployments and StatefulSets too (issue 51, item 7): nothing skips the quota.
    assert config["integrations"]["frameworks"] == [
        "batch/job",
        "jobset.x-k8s.io/jobset",
        "pod",
        "deployment",
        "statefulset",
    ]
    assert config["resources"]["quotaCheckStrategy"] == "IgnoreUndeclared"
    assert DEFAULT_LOCAL_QUEUE == "default"


def test_kueue_admits_all_or_nothing(aws_k8s: ResolvedPlatform) -> None:
    """waitForPodsReady (Kueue's Configuration, v1beta2: present = on, timeout required): an admitted
    workload whose pods do not all become ready in time is evicted and requeued."""
    ready = kueue_config(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["waitForPodsReady"]
    assert ready["timeout"] == "20m" and ready["blockAdmission"] is False
    assert ready["requeuingStrategy"]["timestamp"] == "Eviction"


def test_no_queue_sets_what_fair_sharing_ignores(aws_k8s: ResolvedPlatform) -> None:
    """borrowWithinCohort "only works with Classical Preemption, not with Fair Sharing" (Kueue v0.19.2,
    apis/kueue/v1beta2/clusterqueue_types.go)."""
    assert "fairSharing" in kueue_config(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))
    for queue in (o for o in queue_objects(aws_k8s) if o["kind"] == "ClusterQueue"):
        assert "borrowWithinCohort" not in queue["spec"]["preemption"], queue["metadata"]["name"]


def test_leaderworkerset_only_for_multi_node_replicas(
    aws_k8s: ResolvedPlatform, onprem_k8s: ResolvedPlatform
) -> None:
    assert aws_k8s.serving_layout is not None and aws_k8s.serving_layout.nodes == 1
    assert "lws" not in by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))
    assert onprem_k8s.serving_layout is not None and onprem_k8s.serving_layout.nodes == 2
    assert "lws" in by_name(releases(onprem_k8s, host_path_facts(onprem_k8s)))


def test_fsx_driver_only_with_an_fsx_volume(aws_k8s: ResolvedPlatform, onprem_k8s: ResolvedPlatform) -> None:
    fsx = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["aws-fsx-csi-driver"]
    assert fsx.values["controller"]["region"] == fsx.values["node"]["region"] == "us-east-1"
    assert "aws-fsx-csi-driver" not in by_name(releases(onprem_k8s, host_path_facts(onprem_k8s)))


def test_prometheus_url_is_the_chart_server_service(aws_k8s: ResolvedPlatform) -> None:
    prometheus = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))["prometheus"]
    # The chart's server Service is `<release>-server` when the release name contains "prometheus".
    assert "prometheus" in prometheus.name
    port = prometheus.values["server"]["service"]["servicePort"]
    service_url = f"http://{prometheus.name}-server.{prometheus.namespace}.svc:{port}"
    assert service_url == PROMETHEUS_URL


def test_controllers_run_on_the_service_pool(aws_k8s: ResolvedPlatform) -> None:
    found = by_name(releases(aws_k8s, fsx_facts(CLUSTER_NAME)))
    selectors = {
        "kueue": found["kueue"].values["controllerManager"]["nodeSelector"],
        "jobset": found["jobset"].values["controller"]["nodeSelector"],
        "keda": found["keda"].values["nodeSelector"],
        "prometheus": found["prometheus"].values["server"]["nodeSelector"],
        "gpu-operator": found["gpu-operator"].values["operator"]["nodeSelector"],
    }
    for pool in aws_k8s.pools:
        for name, selector in selectors.items():
            on_pool = selector.items() <= node_labels(pool).items()
            assert on_pool == (pool.role == "service"), (name, pool.name)


def test_controllers_on_an_existing_cluster_tolerate_its_control_plane(
    aws_k8s: ResolvedPlatform, onprem_k8s: ResolvedPlatform
) -> None:
    """kubeadm taints control-plane nodes node-role.kubernetes.io/control-plane:NoSchedule; onprem-k8s's
    service pool is such a node, and controllers that do not tolerate it stay Pending."""
    taint = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}

    def tolerated(platform: ResolvedPlatform) -> dict[str, bool]:
        found = by_name(releases(platform, fsx_facts(CLUSTER_NAME)))
        placements = {
            "kueue": found["kueue"].values["controllerManager"],
            "jobset": found["jobset"].values["controller"],
            "prometheus": found["prometheus"].values["server"],
            "gpu-operator": found["gpu-operator"].values["operator"],
        }
        return {
            name: any(
                t.get("key") == taint["key"]
                and t.get("effect") == taint["effect"]
                and t.get("operator") == "Exists"
                for t in placement.get("tolerations", [])
            )
            for name, placement in placements.items()
        }

    assert all(tolerated(onprem_k8s).values()), tolerated(onprem_k8s)
    assert not any(tolerated(aws_k8s).values())  # EKS has no control-plane nodes of its own


def test_every_release_is_complete_and_ordered(aws_k8s: ResolvedPlatform) -> None:
    found = releases(aws_k8s, fsx_facts(CLUSTER_NAME))
    names = [release.name for release in found]
    assert names.index("jobset") < names.index("kueue")  # Kueue's JobSet integration needs its CRD
    assert names.index("prometheus") < names.index("keda")
    for release in found:
        assert release.namespace, release.name
        assert release.source.startswith("https://"), release.name
        assert not [s for s in strings(release.values) if "latest" in s.lower()], release.name


def test_data_file_with_a_missing_field_names_file_and_field(tmp_path: Path) -> None:
    document = yaml.safe_load(KUBERNETES_FILE.read_text())
    del document["charts"]["kueue"]["version"]
    broken = tmp_path / "kubernetes.yaml"
    broken.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecError) as raised:
        load_kubernetes_data(broken)
    assert str(broken) in raised.value.message
    assert "charts.kueue.version" in raised.value.message


def test_kueue_counts_every_gpu_once_more_in_the_team_cap_resource() -> None:
    """The cap across flavors (infra.k8s.queues) is written in TEAM_GPU_RESOURCE: Kueue's transformation
    must add one per GPU and keep the GPU itself."""
    (transformation,) = kueue_manager_config()["resources"]["transformations"]
    assert transformation == {
        "input": "nvidia.com/gpu",
        "strategy": "Retain",
        "outputs": {"gpuplat/team-gpus": "1"},
    }
