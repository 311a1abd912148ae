"""Model serving on the Kueue platform: vLLM on the infer pool only (a LeaderWorkerSet where a replica
spans nodes), scaled by KEDA on load and time to first token, behind the inference_gateway role's HAProxy, and
reachable only through it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import SpecError
from infra.k8s.facts import host_path_facts
from infra.k8s.objects import Manifest, tolerations
from infra.k8s.operators import PROMETHEUS_URL
from infra.k8s.serving import serving_objects
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts

INFERENCE_TAINT = {"key": "gpuplat/inference", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.fixture(scope="module")
def onprem() -> ResolvedPlatform:
    return load_platform(stack_file("onprem-k8s"))


@pytest.fixture(scope="module")
def aws() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


def objects_of(platform: ResolvedPlatform) -> list[Manifest]:
    facts = fsx_facts() if platform.spec.backend == "aws" else host_path_facts(platform)
    return serving_objects(platform, facts)


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def model_server(objects: list[Manifest]) -> Manifest:
    workloads = ("Deployment", "LeaderWorkerSet")
    [found] = [o for o in objects if o["metadata"]["name"] == "model-server" and o["kind"] in workloads]
    return found


def pod_templates(workload: Manifest) -> list[dict[str, Any]]:
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]]
    group = workload["spec"]["leaderWorkerTemplate"]
    return [group["leaderTemplate"], group["workerTemplate"]]


def gateway_config(objects: list[Manifest]) -> str:
    return str(find(objects, "ConfigMap", "gateway-haproxy")["data"]["haproxy.cfg"])


def test_onprem_k8s_runs_each_replica_as_a_two_node_leader_worker_set(onprem: ResolvedPlatform) -> None:
    objects = objects_of(onprem)
    group = model_server(objects)
    assert (group["apiVersion"], group["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert "replicas" not in group["spec"]
    template = group["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    [leader] = template["leaderTemplate"]["spec"]["containers"]
    lead = leader["command"][-1]
    assert "multi-node-serving.sh leader --ray_cluster_size=$(LWS_GROUP_SIZE)" in lead
    assert "exec vllm serve '$(GPUPLAT_MODEL)' " in lead
    assert {"name": "GPUPLAT_MODEL", "value": "/lustre/models/Llama-3.1-405B-Instruct"} in leader["env"]
    assert "--tensor-parallel-size 8 " in lead and "--pipeline-parallel-size 2 " in lead
    assert "--distributed-executor-backend ray" in lead
    [worker] = template["workerTemplate"]["spec"]["containers"]
    assert worker["command"][-1].endswith("multi-node-serving.sh worker --ray_address=$(LWS_LEADER_ADDRESS)")
    assert "ports" not in worker and "startupProbe" not in worker
    assert not [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "model-server"]


def test_aws_k8s_runs_a_deployment_whose_replicas_keda_owns(aws: ResolvedPlatform) -> None:
    deployment = model_server(objects_of(aws))
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert "replicas" not in deployment["spec"]
    [vllm] = deployment["spec"]["template"]["spec"]["containers"]
    assert aws.software.serving is not None
    assert vllm["image"] == f"docker.io/vllm/vllm-openai:v{aws.software.serving.version}"
    command = vllm["command"]
    # kubelet puts the model's location (GPUPLAT_MODEL) in place; offline it is the spec's URI.
    assert command[:3] == ["vllm", "serve", "$(GPUPLAT_MODEL)"]
    assert {"name": "GPUPLAT_MODEL", "value": "s3://models/meta-llama/Llama-3.1-8B-Instruct"} in vllm["env"]

    def arg(flag: str) -> str:
        return str(command[command.index(flag) + 1])

    assert arg("--served-model-name") == "meta-llama/Llama-3.1-8B-Instruct"
    assert arg("--max-num-seqs") == "32"
    assert arg("--gpu-memory-utilization") == "0.9"
    assert arg("--tensor-parallel-size") == "1"
    assert arg("--load-format") == "runai_streamer"
    assert "--pipeline-parallel-size" not in command


@pytest.mark.parametrize("stack", ["onprem", "aws"])
def test_model_server_pods_select_only_the_infer_pool_and_tolerate_only_its_taints(
    stack: str, request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    pool = platform.pool("infer")
    templates = pod_templates(model_server(objects_of(platform)))
    assert templates
    for template in templates:
        assert template["spec"]["nodeSelector"] == {"gpuplat/pool": "infer"}
        assert template["spec"]["tolerations"] == tolerations(pool) == [INFERENCE_TAINT]


@pytest.mark.parametrize(("stack", "gpus"), [("onprem", 8), ("aws", 1)])
def test_each_model_server_pod_gets_its_tensor_parallel_gpus(
    stack: str, gpus: int, request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    assert platform.serving_layout is not None and platform.serving_layout.tensor_parallel == gpus
    for template in pod_templates(model_server(objects_of(platform))):
        [container] = template["spec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus}
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus


def test_gateway_runs_on_the_service_pool_without_gpus(aws: ResolvedPlatform) -> None:
    gateway = find(objects_of(aws), "Deployment", "gateway")
    spec = gateway["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpuplat/pool": "system"}
    assert "tolerations" not in spec
    assert "nvidia.com/gpu" not in str(spec["containers"])


@pytest.mark.parametrize(
    ("stack", "kind", "api", "bounds"),
    [
        ("onprem", "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", (1, 1)),
        ("aws", "Deployment", "apps/v1", (2, 8)),
    ],
)
def test_scaled_object_scales_the_model_server_within_the_spec_bounds(
    stack: str, kind: str, api: str, bounds: tuple[int, int], request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    spec = find(objects_of(platform), "ScaledObject", "model-server")["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": api, "kind": kind, "name": "model-server"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == bounds
    assert all(t["type"] == "prometheus" for t in spec["triggers"])
    assert {t["metadata"]["serverAddress"] for t in spec["triggers"]} == {PROMETHEUS_URL}


def test_scaling_triggers_read_vllm_waiting_requests_and_p95_ttft_against_the_target(
    aws: ResolvedPlatform,
) -> None:
    triggers = {
        t["name"]: t for t in find(objects_of(aws), "ScaledObject", "model-server")["spec"]["triggers"]
    }
    model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    waiting = triggers["vllm-waiting"]
    assert waiting["metricType"] == "AverageValue"
    assert waiting["metadata"]["query"] == f"sum(vllm:num_requests_waiting{{{model}}})"
    assert waiting["metadata"]["threshold"] == "8"  # a quarter of max_inflight_per_replica 32
    latency = triggers["p95-ttft"]
    assert latency["metricType"] == "Value"
    assert "histogram_quantile(0.95, sum by (le) (rate(" in latency["metadata"]["query"]
    assert f"vllm:time_to_first_token_seconds_bucket{{{model}}}" in latency["metadata"]["query"]
    assert latency["metadata"]["threshold"] == "1.5"  # ttft_p95_target_ms 1500
    queue = triggers["gateway-queue"]
    assert queue["metadata"]["query"] == 'sum(haproxy_backend_current_queue{proxy="inference"})'
    assert queue["metadata"]["threshold"] == "32"


def test_only_the_gateway_and_monitoring_reach_the_model_server_port(aws: ResolvedPlatform) -> None:
    objects = objects_of(aws)
    policy = find(objects, "NetworkPolicy", "model-server")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"gpuplat/component": "model-server"}}
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"gpuplat/component": "gateway"}}}, MONITORING]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    gateway = find(objects, "NetworkPolicy", "gateway")["spec"]
    assert gateway["podSelector"] == {"matchLabels": {"gpuplat/component": "gateway"}}
    assert gateway["ingress"][0] == {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }


def test_a_multi_node_group_also_reaches_itself(onprem: ResolvedPlatform) -> None:
    policy = find(objects_of(onprem), "NetworkPolicy", "model-server")["spec"]
    api, group = policy["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert group == {"from": [{"podSelector": {"matchLabels": {"gpuplat/component": "model-server"}}}]}


@pytest.mark.parametrize(("stack", "at_least_s"), [("aws", 20 * 60), ("onprem", 3690)])
def test_startup_probe_allows_the_model_load(
    stack: str, at_least_s: int, request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    [api] = pod_templates(model_server(objects_of(platform)))[0]["spec"]["containers"]
    probe = api["startupProbe"]
    assert probe["httpGet"]["path"] == "/health"
    assert probe["failureThreshold"] * probe["periodSeconds"] >= at_least_s >= 20 * 60
    assert {"readinessProbe", "livenessProbe"} <= set(api)


def test_serving_namespace_is_no_team_namespace(aws: ResolvedPlatform) -> None:
    namespace = find(objects_of(aws), "Namespace", "serving")
    assert "gpuplat/team" not in namespace["metadata"].get("labels", {})


@pytest.mark.parametrize(
    ("stack", "gateways", "per_server", "queue", "slots"),
    # aws-k8s: max_inflight 32, max_queue 128, 2 gateways (system pool min 2); onprem-k8s: 16, 64, 1.
    [("aws", 2, 16, 64, 8), ("onprem", 1, 16, 64, 1)],
)
def test_gateway_is_the_roles_haproxy_with_the_spec_limits(
    stack: str, gateways: int, per_server: int, queue: int, slots: int, request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    objects = objects_of(platform)
    config = gateway_config(objects)
    assert f"default-server check inter 2s fall 3 rise 2 maxconn {per_server}\n" in config
    assert f"acl queue_full queue(inference) ge {queue}\n" in config
    assert "http-request return status 503" in config
    assert "timeout queue 2000ms" in config
    servers = re.findall(r"^\s+server-template (\S+) 1-(\d+) (\S+) (.*)$", config, re.MULTILINE)
    assert servers == [
        ("replica-", str(slots), "model-server-replicas.serving.svc.cluster.local:8000", servers[0][3])
    ]
    assert "resolvers cluster" in servers[0][3] and "init-addr none" in servers[0][3]
    assert "\nresolvers cluster\n    parse-resolv-conf\n" in config
    assert not re.search(r"^\s+server ", config, re.MULTILINE)
    deployment = find(objects, "Deployment", "gateway")
    assert deployment["spec"]["replicas"] == gateways
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gpuplat/config-sha256"] == hashlib.sha256(config.encode()).hexdigest()


@pytest.mark.parametrize(
    ("stack", "selector"),
    [
        ("aws", {"gpuplat/component": "model-server"}),
        ("onprem", {"gpuplat/component": "model-server", "leaderworkerset.sigs.k8s.io/worker-index": "0"}),
    ],
)
def test_headless_service_lists_each_replicas_api_pod(
    stack: str, selector: dict[str, str], request: pytest.FixtureRequest
) -> None:
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    service = find(objects_of(platform), "Service", "model-server-replicas")["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == selector


def test_fsx_is_a_read_only_static_volume_bound_to_a_claim_in_the_serving_namespace(
    aws: ResolvedPlatform,
) -> None:
    objects = objects_of(aws)
    volume = find(objects, "PersistentVolume", "aws-k8s-serving-shared")["spec"]
    assert volume["csi"] == {
        "driver": "fsx.csi.aws.com",
        "volumeHandle": "fs-0123456789abcdef0",
        "readOnly": True,
        "volumeAttributes": {"dnsname": "fs-0123.fsx.example", "mountname": "abcdef"},
    }
    assert volume["accessModes"] == ["ReadOnlyMany"]
    claim = find(objects, "PersistentVolumeClaim", "shared")
    assert claim["metadata"]["namespace"] == "serving"
    assert claim["spec"]["volumeName"] == "aws-k8s-serving-shared"
    pod = pod_templates(model_server(objects))[0]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "shared", "readOnly": True}} in pod[
        "volumes"
    ]
    assert {"name": "shared", "mountPath": "/fsx", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"


def test_host_path_filesystem_is_the_nodes_mount(onprem: ResolvedPlatform) -> None:
    objects = objects_of(onprem)
    volume = find(objects, "PersistentVolume", "onprem-k8s-serving-shared")["spec"]
    assert volume["hostPath"] == {"path": "/lustre", "type": "Directory"}
    for template in pod_templates(model_server(objects)):
        assert {"name": "shared", "mountPath": "/lustre", "readOnly": True} in template["spec"]["containers"][
            0
        ]["volumeMounts"]


@pytest.mark.parametrize(("stack", "pods"), [("aws", 2), ("onprem", 2)])
def test_disruption_budget_allows_one_eviction_at_the_minimum_replicas(
    stack: str, pods: int, request: pytest.FixtureRequest
) -> None:
    """Issue 51, item 9: minAvailable at KEDA's minimum allowed no eviction, so drains stalled. The
    disruptions a PDB allows (the disruption controller): maxUnavailable - unavailable pods, with every
    pod healthy at the minimum replica count."""
    platform: ResolvedPlatform = request.getfixturevalue(stack)
    budget = find(objects_of(platform), "PodDisruptionBudget", "model-server")["spec"]
    # aws-k8s: 2 replicas of 1 pod; onprem-k8s: 1 replica of 2 pods (leader and worker).
    healthy_at_minimum = pods
    if "minAvailable" in budget:
        allowed = healthy_at_minimum - budget["minAvailable"]
    else:
        allowed = budget["maxUnavailable"]
    assert allowed == 1
    assert budget["selector"] == {"matchLabels": {"gpuplat/component": "model-server"}}
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_no_serving_section_no_objects(write_stack: Callable[..., Path]) -> None:
    def without_serving(platform: dict[str, Any]) -> None:
        del platform["serving"]

    platform = load_platform(write_stack("aws-k8s", without_serving))
    assert serving_objects(platform, fsx_facts()) == []


def test_cpu_reference_engine_is_refused_naming_the_field(write_stack: Callable[..., Path]) -> None:
    def cpu_reference(platform: dict[str, Any]) -> None:
        platform["serving"]["engine"] = "cpu-reference"

    platform = load_platform(write_stack("aws-k8s", cpu_reference))
    with pytest.raises(SpecError) as raised:
        serving_objects(platform, fsx_facts())
    assert "serving.engine" in raised.value.message and "vllm" in raised.value.message


def test_every_object_is_valid_against_the_schemas(onprem: ResolvedPlatform, aws: ResolvedPlatform) -> None:
    schemas = pytest.importorskip("tests.k8s_schemas")
    for platform in (onprem, aws):
        assert platform.spec.kubernetes is not None
        for manifest in objects_of(platform):
            assert manifest["metadata"]["name"]
            report = schemas.validate(manifest, platform.spec.kubernetes.version)
            assert not report.errors, (manifest["kind"], manifest["metadata"]["name"], report.errors)
