"""Model serving on the Kueue platform: the stack's `serving:` section as Kubernetes objects.

- the serving namespace, without the gpuplat/team label: Kueue manages team namespaces only, so it
  never holds an inference pod back;
- the model servers on the infer pool: a Deployment of vLLM pods, or a LeaderWorkerSet where one replica
  spans nodes (infra.platform.serving_layout.ServingLayout.nodes), each replica's API pod listed by a
  headless Service;
- a PodDisruptionBudget, and a KEDA ScaledObject that keeps serving.min_replicas..max_replicas replicas
  on vLLM's waiting requests, the gateway's queue and the p95 time to first token;
- the gateway on its service pool: HAProxy configured by the inference_gateway role's own template (the
  same bounded queue, 503 when full, maxconn per replica as on the Slurm platform);
- network policies: only the gateway and the monitoring namespace reach the model servers' port.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from infra.errors.problems import spec_error
from infra.k8s.facts import MODEL_SERVER_ACCOUNT, ClusterFacts
from infra.k8s.objects import (
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_POOL,
    Manifest,
    k8s_object,
    monitoring_peer,
    serving_namespace,
    tolerations,
)
from infra.k8s.operators import PROMETHEUS_URL
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.k8s.tenancy import shared_volume_objects
from infra.k8s.training import POD_INTERFACE, SHARED_CLAIM, nccl_environment
from infra.nodes.role_templates import ROLES_DIR, render_role_template, role_defaults, role_vars
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.platform.serving_layout import ServingLayout, startup_budget_s
from infra.spec.load import CONFIG_KEY
from infra.spec.models import Serving

MODEL_SERVER = "model-server"
# The model as the server reads it (a path, a hub id, or an s3:// URI of the platform's bucket).
MODEL_ENV = "GPUPLAT_MODEL"
# One DNS record per ready replica's API pod, for the gateway. Not named like the workload: a
# LeaderWorkerSet creates a headless Service of its own name for all pods of its groups.
MODEL_SERVER_REPLICAS = "model-server-replicas"
# The registered version a model-server pod runs (ServedVersion.slug), where `gpuplat serve` put it there.
LABEL_MODEL_VERSION = "gpuplat/model-version"
GATEWAY = "gateway"
GATEWAY_CONFIG = "gateway-haproxy"
MODEL_SERVER_PORT = 8000
GATEWAY_PORT = 8080
GATEWAY_METRICS_PORT = 8404
# The gateway resolves the headless Service by its full name (HAProxy's resolvers use no search list);
# cluster.local is the default cluster domain of kubeadm and the one EKS uses.
CLUSTER_DOMAIN = "cluster.local"

# https://hub.docker.com/r/vllm/vllm-openai: one tag per vLLM release, v<version>.
VLLM_IMAGE = "docker.io/vllm/vllm-openai"
# The Docker official image, LTS branch 3.2 (github.com/docker-library/haproxy versions.json at
# ec437dd2a365: 3.2 -> 3.2.21): runs as user haproxy (uid and gid 99), built with the Prometheus
# exporter (USE_PROMEX=1), reads /usr/local/etc/haproxy/haproxy.cfg.
HAPROXY_IMAGE = "docker.io/library/haproxy:3.2.21"
HAPROXY_UID = 99
HAPROXY_CONFIG_DIR = "/usr/local/etc/haproxy"
HAPROXY_RUN_DIR = "/run/haproxy"

LWS_API = "leaderworkerset.x-k8s.io/v1"
# The LeaderWorkerSet controller labels a group's leader with worker index 0
# (api/leaderworkerset/v1/leaderworkerset_types.go, WorkerIndexLabelKey, at lws v0.10.0).
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# vLLM's helper that starts (leader) or joins (worker) a group's Ray cluster; the vllm-openai image
# carries vLLM's examples in /vllm-workspace (docker/Dockerfile, `COPY examples examples`), and vLLM's
# LeaderWorkerSet guide runs it so (docs/deployment/frameworks/lws.md).
MULTI_NODE_LAUNCHER = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"
# How long the leader waits for its workers to join (the helper's default is 300 s): a worker may
# still be pulling the image, several GB, when its leader starts.
RAY_CLUSTER_WAIT_S = 900

KEDA_API = "keda.sh/v1alpha1"
# Requests waiting inside one vLLM replica (the gateway already caps what it sends at max_num_seqs, so
# these wait for KV cache) above which it counts as saturated: a quarter of its batch.
WAITING_SHARE_OF_BATCH = 4
LATENCY_WINDOW = "5m"
# A replica takes 20 minutes or more to start: do not give one up on a short lull.
SCALE_DOWN_STABILIZATION_S = 600

# A model-server pod requests this share of its part of the node (its GPUs' share of the CPUs and
# memory), leaving the rest to the kubelet's reservations and the node's daemonsets.
NODE_SHARE_REQUESTED = 0.75
# Time for the cluster autoscaler to add a GPU node and for the kubelet to pull the vLLM image, on top
# of the replica's own start, before a rollout counts as stuck.
NODE_AND_IMAGE_S = 900
STARTUP_PROBE_PERIOD_S = 10
# The pulumi-kubernetes provider waits this long for a workload to become ready
# (github.com/pulumi/pulumi-kubernetes/pull/457); its default, 10 minutes, is shorter than a model load.
PULUMI_TIMEOUT_ANNOTATION = "pulumi.com/timeoutSeconds"

SCRAPE = "prometheus.io/scrape"
# The backend of the inference_gateway role's haproxy.cfg.j2 (`backend inference`).
GATEWAY_BACKEND = "inference"
# The backend of a canary version's pods (the role's vars/main.yml names it for every platform).
CANARY_BACKEND = str(role_vars("inference_gateway")["__inference_gateway_canary_backend"])


@dataclass(frozen=True)
class _Track:
    """One version's model servers: its workload, the headless Service listing its API pods, their labels."""

    workload: str
    service: str
    labels: dict[str, str]
    model: Any
    replicas: int | None
    """None: the ScaledObject owns the count (the stable version's)."""


def _stack_model_track(serving: Serving, facts: ClusterFacts) -> _Track:
    """The stack's own `serving.model`, before any `gpuplat serve` release."""
    model = serving.model if facts.model_uri is None else facts.model_uri
    return _Track(MODEL_SERVER, MODEL_SERVER_REPLICAS, _selector(MODEL_SERVER), model, None)


def version_track_names(version: ServedVersion) -> tuple[str, str]:
    """The workload and the headless Service of a registered version's model servers."""
    workload = f"{MODEL_SERVER}-{version.slug}"
    return workload, f"{workload}-replicas"


def _version_track(version: ServedVersion, replicas: int | None, own: _Track, serving: Serving) -> _Track:
    workload, service = version_track_names(version)
    labels = {**_selector(MODEL_SERVER), LABEL_MODEL_VERSION: version.slug}
    # The stack's own files (what a take-over registers) are read where the stack's own servers read them:
    # on EKS `s3://<purpose>/...` names the purpose's bucket, whose generated name only facts.model_uri has.
    model = own.model if version.model == serving.model else version.model
    return _Track(workload, service, labels, model, replicas)


def _tracks(
    serving: Serving, facts: ClusterFacts, release: ServingRelease | None
) -> tuple[_Track, _Track | None, list[_Track]]:
    """The stable track (the gateways' `inference` backend, KEDA's target), the canary's, and the tracks
    that run named by no gateway."""
    own = _stack_model_track(serving, facts)
    if release is None:
        return own, None, []
    versioned = _version_track(release.stable, release.stable_replicas, own, serving)
    canary = (
        None
        if release.canary is None
        else _version_track(release.canary, release.canary_replicas, own, serving)
    )
    idle = (
        []
        if release.retiring is None
        else [_version_track(release.retiring, release.retiring_replicas, own, serving)]
    )
    if release.stack_model == "serving":
        return own, canary, [versioned, *idle]
    return versioned, canary, idle + ([own] if release.stack_model == "retiring" else [])


def serving_objects(
    platform: ResolvedPlatform, facts: ClusterFacts, release: ServingRelease | None = None
) -> list[Manifest]:
    """The serving section's objects: the stack's `serving.model`, or, with `release`, a workload and a
    headless Service per version it names, the gateways sending the canary its share of the requests."""
    serving = platform.spec.serving
    if serving is None:
        return []
    version = _vllm_version(platform, serving)
    layout = platform.serving_layout
    if layout is None:
        raise ValueError(f"{platform.name}: resolve() gives every platform with serving its layout")
    namespace = serving_namespace(platform)
    gateways = _gateway_count(platform)
    stable, canary, others = _tracks(serving, facts, release)
    share = release.canary_percent if release is not None else 0
    config = _gateway_config(platform, serving, namespace, gateways, stable, canary, share)
    tracks = [stable, *([canary] if canary else []), *others]
    return [
        k8s_object("v1", "Namespace", namespace),
        *shared_volume_objects(platform, facts.shared_volume, namespace, read_only=True),
        k8s_object("v1", "ServiceAccount", MODEL_SERVER_ACCOUNT, namespace),
        *(_model_server(platform, serving, layout, namespace, version, facts, t) for t in tracks),
        *(_model_server_service(layout, namespace, t) for t in tracks),
        _disruption_budget(serving, layout, namespace),
        _scaled_object(serving, layout, namespace, stable),
        k8s_object("v1", "ConfigMap", GATEWAY_CONFIG, namespace, data={"haproxy.cfg": config}),
        _gateway(platform, namespace, gateways, config),
        _gateway_service(namespace),
        _model_server_policy(layout, namespace),
        _gateway_policy(namespace),
    ]


def _vllm_version(platform: ResolvedPlatform, serving: Serving) -> str:
    if serving.engine == "vllm" and platform.software.serving is not None:
        return platform.software.serving.version
    raise spec_error(
        platform.source,
        [
            (
                f"{CONFIG_KEY}.serving.engine",
                f"{serving.engine!r} runs on the local Slurm platform only; the Kueue platform serves "
                "with vLLM's image: set engine: vllm",
            )
        ],
    )


def served_model_name(model: str) -> str:
    """The name clients send as `model`, as the inference_server role derives it (its vars/main.yml):
    the last two path components of an object-store or filesystem path, else the model id itself."""
    if model.startswith(("s3://", "/")):
        return "/".join(model.split("/")[-2:])
    return model


# -- model servers ----------------------------------------------------------------------------------


def _selector(component: str) -> dict[str, str]:
    return {LABEL_COMPONENT: component}


def _api_pods(layout: ServingLayout, track: _Track) -> dict[str, str]:
    """The pods that serve the OpenAI API: every model-server pod of the track, or each group's leader."""
    if layout.nodes == 1:
        return dict(track.labels)
    return {**track.labels, LWS_WORKER_INDEX_LABEL: "0"}


def _vllm_args(serving: Serving, layout: ServingLayout) -> list[str]:
    args = [
        # kubelet expands $(VAR) from the container's environment, in args and in `sh -c` strings alike.
        f"$({MODEL_ENV})",
        "--served-model-name",
        served_model_name(serving.model),
        "--host",
        "0.0.0.0",
        "--port",
        str(MODEL_SERVER_PORT),
        "--tensor-parallel-size",
        str(layout.tensor_parallel),
        "--gpu-memory-utilization",
        str(serving.gpu_memory_fraction),
        "--max-num-seqs",
        str(serving.max_inflight_per_replica),
        "--max-model-len",
        str(serving.max_model_len),
    ]
    if layout.nodes > 1:
        args += [
            "--pipeline-parallel-size",
            str(layout.pipeline_parallel),
            "--distributed-executor-backend",
            "ray",
        ]
    if serving.model.startswith("s3://"):
        # Streams the weights from the object store (vllm-openai ships runai-model-streamer[s3];
        # https://docs.vllm.ai/en/stable/models/extensions/runai_model_streamer/).
        args += ["--load-format", "runai_streamer"]
    return args


def _environment(
    platform: ResolvedPlatform, serving: Serving, pool: ResolvedPool, layout: ServingLayout, model: Any
) -> list[dict[str, Any]]:
    values: dict[str, Any] = {MODEL_ENV: model}
    if serving.model.startswith("/"):
        # The model is on the shared filesystem: never reach for a model hub (as the role does).
        values["HF_HUB_OFFLINE"] = "1"
    if layout.nodes > 1:
        # Between the nodes of a replica NCCL runs as the nccl role sets it up on the pool's hosts.
        values.update(nccl_environment(platform, pool, {"nccl_socket_ifname": POD_INTERFACE}))
    return [{"name": key, "value": value} for key, value in values.items()]


def _requested_share(pool: ResolvedPool, layout: ServingLayout) -> tuple[int, int]:
    """CPUs and GiB of memory one model-server pod requests: its GPUs' share of the node's."""
    node = pool.node_type
    share = layout.tensor_parallel / node.gpu_count * NODE_SHARE_REQUESTED
    return max(1, math.floor(node.vcpus * share)), max(1, math.floor(node.memory_gib * share))


def _resources(pool: ResolvedPool, layout: ServingLayout) -> dict[str, Any]:
    cpus, memory_gib = _requested_share(pool, layout)
    return {
        "requests": {GPU_RESOURCE: layout.tensor_parallel, "cpu": str(cpus), "memory": f"{memory_gib}Gi"},
        "limits": {GPU_RESOURCE: layout.tensor_parallel},
    }


def _probes(budget_s: int) -> dict[str, Any]:
    """vLLM answers /health once the engine runs. The startup probe allows the whole start budget
    (infra.platform.serving_layout.startup_budget_s); after it, readiness takes a replica out of the
    gateway's DNS records within 15 s and liveness restarts one that stopped answering for a minute."""

    def health() -> dict[str, Any]:
        return {"path": _gateway_defaults()["inference_gateway_health_path"], "port": "http"}

    return {
        "startupProbe": {
            "httpGet": health(),
            "periodSeconds": STARTUP_PROBE_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(budget_s / STARTUP_PROBE_PERIOD_S),
        },
        "readinessProbe": {
            "httpGet": health(),
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": health(),
            "periodSeconds": 10,
            "timeoutSeconds": 10,
            "failureThreshold": 6,
        },
    }


def _model_server_container(
    platform: ResolvedPlatform,
    serving: Serving,
    layout: ServingLayout,
    version: str,
    *,
    name: str,
    command: list[str],
    serves_api: bool,
    model: Any,
) -> dict[str, Any]:
    pool = platform.pool(serving.pool)
    container: dict[str, Any] = {
        "name": name,
        "image": f"{VLLM_IMAGE}:v{version}",
        "command": command,
        "resources": _resources(pool, layout),
        # The shared filesystem at its path on the nodes: a model path of the stack is the same here.
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            # Read only: the model server reads weights; no team's files are its to change.
            {
                "name": SHARED_CLAIM,
                "mountPath": platform.spec.storage.parallel_fs.mount_path,
                "readOnly": True,
            },
        ],
    }
    container["env"] = _environment(platform, serving, pool, layout, model)
    if serves_api:
        container["ports"] = [{"name": "http", "containerPort": MODEL_SERVER_PORT, "protocol": "TCP"}]
        container.update(_probes(startup_budget_s(serving, layout, pool.node_type)))
    return container


def _model_server_pod(
    platform: ResolvedPlatform,
    serving: Serving,
    layout: ServingLayout,
    container: dict[str, Any],
    identity: bool,
    labels: dict[str, str],
) -> dict[str, Any]:
    pool = platform.pool(serving.pool)
    _, memory_gib = _requested_share(pool, layout)
    annotations = (
        {SCRAPE: "true", "prometheus.io/port": str(MODEL_SERVER_PORT), "prometheus.io/path": "/metrics"}
        if "ports" in container
        else {SCRAPE: "false"}
    )
    spec: dict[str, Any] = {
        "nodeSelector": {LABEL_POOL: pool.name},
        # Its own identity for the object store (EKS Pod Identity, which needs the service account's
        # token mounted); the account has no Kubernetes permissions, and vLLM never calls the API.
        "serviceAccountName": MODEL_SERVER_ACCOUNT,
        "automountServiceAccountToken": identity,
        # Room for requests in flight to finish: the gateway gives none more than gateway_timeout_s.
        "terminationGracePeriodSeconds": math.ceil(serving.gateway_timeout_s),
        "containers": [container],
        "volumes": [
            # NCCL and Ray keep their buffers in /dev/shm: in memory, a quarter of the pod's at most.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(1, memory_gib // 4)}Gi"}},
            {"name": SHARED_CLAIM, "persistentVolumeClaim": {"claimName": SHARED_CLAIM, "readOnly": True}},
        ],
    }
    pool_tolerations = tolerations(pool)
    if pool_tolerations:
        spec["tolerations"] = pool_tolerations
    return {"metadata": {"labels": dict(labels), "annotations": annotations}, "spec": spec}


def _model_server(
    platform: ResolvedPlatform,
    serving: Serving,
    layout: ServingLayout,
    namespace: str,
    version: str,
    facts: ClusterFacts,
    track: _Track,
) -> Manifest:
    """A Deployment of single-node replicas, or a LeaderWorkerSet of multi-node groups. The stable
    version's has no replica count (the ScaledObject owns it); a canary's or a retiring version's has."""
    wait_s = startup_budget_s(serving, layout, platform.pool(serving.pool).node_type) + NODE_AND_IMAGE_S
    annotations = {PULUMI_TIMEOUT_ANNOTATION: str(wait_s)}
    model = track.model
    replicas = {} if track.replicas is None else {"replicas": track.replicas}
    if layout.nodes == 1:
        server = _model_server_container(
            platform,
            serving,
            layout,
            version,
            name="vllm",
            command=["vllm", "serve", *_vllm_args(serving, layout)],
            serves_api=True,
            model=model,
        )
        return k8s_object(
            "apps/v1",
            "Deployment",
            track.workload,
            namespace,
            labels=track.labels,
            annotations=annotations,
            spec={
                **replicas,
                "selector": {"matchLabels": dict(track.labels)},
                # A new replica loads before an old one leaves: capacity never drops during a rollout.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "progressDeadlineSeconds": wait_s,
                "template": _model_server_pod(
                    platform, serving, layout, server, facts.pod_identity, track.labels
                ),
            },
        )
    # The leader starts the group's Ray cluster, waits for every worker, then serves over all of them
    # (kubelet expands $(LWS_...), which the LeaderWorkerSet controller sets in every container).
    lead = (
        f"bash {MULTI_NODE_LAUNCHER} leader --ray_cluster_size=$(LWS_GROUP_SIZE) "
        f"--ray_init_timeout={RAY_CLUSTER_WAIT_S} && "
        f"exec vllm serve {shlex.join(_vllm_args(serving, layout))}"
    )
    join = f"bash {MULTI_NODE_LAUNCHER} worker --ray_address=$(LWS_LEADER_ADDRESS)"
    leader = _model_server_container(
        platform,
        serving,
        layout,
        version,
        name="vllm",
        command=["sh", "-c", lead],
        serves_api=True,
        model=model,
    )
    worker = _model_server_container(
        platform, serving, layout, version, name="ray-worker", command=["sh", "-c", join], serves_api=False,
        model=model,
    )  # fmt: skip
    return k8s_object(
        LWS_API,
        "LeaderWorkerSet",
        track.workload,
        namespace,
        labels=track.labels,
        annotations=annotations,
        spec={
            **replicas,
            # Workers start with their leader: the leader is ready only once they have joined.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": layout.nodes,
                # A pod lost anywhere breaks the pipeline: the whole group restarts.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _model_server_pod(
                    platform, serving, layout, leader, facts.pod_identity, track.labels
                ),
                "workerTemplate": _model_server_pod(
                    platform, serving, layout, worker, facts.pod_identity, track.labels
                ),
            },
        },
    )


def _model_server_service(layout: ServingLayout, namespace: str, track: _Track) -> Manifest:
    """Headless: one record per ready API pod, so that the gateway holds one server (with its own
    maxconn) per replica rather than one address balanced behind its back."""
    return k8s_object(
        "v1",
        "Service",
        track.service,
        namespace,
        labels=track.labels,
        spec={
            "clusterIP": "None",
            "selector": _api_pods(layout, track),
            "ports": [{"name": "http", "port": MODEL_SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    )


def _disruption_budget(serving: Serving, layout: ServingLayout, namespace: str) -> Manifest:
    """Voluntary disruptions (node drains, node-group upgrades, the cluster autoscaler removing a node)
    evict one model-server pod at a time: a drain always makes progress, and at most one replica is down
    (a multi-node replica loses its group with any of its pods) while the rest serve. A floor at KEDA's
    minimum (minAvailable = min_replicas) would allow no eviction at all while the servers run at their
    minimum, and every drain would stall. Pods that are not ready (still loading, or broken) may always be
    evicted, so that they never block a drain."""
    return k8s_object(
        "policy/v1",
        "PodDisruptionBudget",
        MODEL_SERVER,
        namespace,
        spec={
            "maxUnavailable": 1,
            "selector": {"matchLabels": _selector(MODEL_SERVER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    )


@cache
def _vllm_metrics() -> dict[str, str]:
    """vLLM's metric names, as the monitoring role records them for the Slurm platform."""
    values = yaml.safe_load((ROLES_DIR / "monitoring" / "vars" / "main.yml").read_text())
    return dict(values["__monitoring_engine_metrics"]["vllm"])


def _trigger(name: str, query: str, threshold: float, metric_type: str) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": metric_type,
        "metadata": {"serverAddress": PROMETHEUS_URL, "query": query, "threshold": f"{threshold:g}"},
    }


def _scaled_object(serving: Serving, layout: ServingLayout, namespace: str, stable: _Track) -> Manifest:
    """Replicas between the spec's bounds. The HPA KEDA drives takes the most replicas any trigger asks:
    - waiting: requests waiting inside vLLM per replica (AverageValue): above a quarter of a batch the
      replicas' KV cache is full;
    - queue: requests in the gateway's queue per replica (AverageValue): a batch's worth waiting;
    - ttft: the replicas' p95 time to first token against serving.ttft_p95_target_ms (Value: replicas
      grow in proportion to how far it is over); not the whole answer's latency, which grows with its
      length, not with the load. No traffic gives no quantile (NaN): counted as 0."""
    metrics = _vllm_metrics()
    model = f'model_name="{served_model_name(serving.model)}"'
    batch = serving.max_inflight_per_replica
    latency = (
        f"(histogram_quantile(0.95, sum by (le) (rate({metrics['ttft_histogram']}_bucket{{{model}}}"
        f"[{LATENCY_WINDOW}]))) > 0) or vector(0)"
    )
    target = (
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": stable.workload}
        if layout.nodes == 1
        else {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": stable.workload}
    )
    return k8s_object(
        KEDA_API,
        "ScaledObject",
        MODEL_SERVER,
        namespace,
        spec={
            "scaleTargetRef": target,
            "minReplicaCount": serving.min_replicas,
            "maxReplicaCount": serving.max_replicas,
            "pollingInterval": 15,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}}
                }
            },
            "triggers": [
                _trigger(
                    "vllm-waiting",
                    f"sum({metrics['waiting']}{{{model}}})",
                    max(1, batch // WAITING_SHARE_OF_BATCH),
                    "AverageValue",
                ),
                _trigger(
                    "gateway-queue",
                    f'sum(haproxy_backend_current_queue{{proxy="{GATEWAY_BACKEND}"}})',
                    batch,
                    "AverageValue",
                ),
                _trigger("p95-ttft", latency, serving.ttft_p95_target_ms / 1000, "Value"),
            ],
        },
    )


# -- gateway ------------------------------------------------------------------------------------------


@cache
def _gateway_defaults() -> dict[str, Any]:
    return role_defaults("inference_gateway")


def _gateway_count(platform: ResolvedPlatform) -> int:
    """Two gateways where the gateway pool always has two nodes (one survives a node), else one. The
    count is fixed: each gateway takes its share of the per-replica and queue limits (the template)."""
    return 2 if platform.gateway_pool.spec.min_nodes >= 2 else 1


def _service_dns(track: _Track, namespace: str) -> str:
    return f"{track.service}.{namespace}.svc.{CLUSTER_DOMAIN}"


def _gateway_config(
    platform: ResolvedPlatform,
    serving: Serving,
    namespace: str,
    gateways: int,
    stable: _Track,
    canary: _Track | None,
    canary_percent: int,
) -> str:
    dns: dict[str, Any] = {"name": _service_dns(stable, namespace), "slots": serving.max_replicas}
    if canary is not None:
        dns["canary"] = {
            "name": _service_dns(canary, namespace),
            "slots": serving.max_replicas,
            "percent": canary_percent,
        }
    return render_role_template(
        "inference_gateway",
        "haproxy.cfg.j2",
        {
            "inference_max_inflight_per_replica": serving.max_inflight_per_replica,
            "inference_gateway_timeout_s": serving.gateway_timeout_s,
            "inference_gateway_max_queue": serving.max_queue,
            "inference_gateway_queue_timeout_s": serving.queue_timeout_s,
            "inference_gateway_instances": gateways,
            "inference_gateway_port": GATEWAY_PORT,
            "inference_gateway_metrics_port": GATEWAY_METRICS_PORT,
            "inference_gateway_server_port": MODEL_SERVER_PORT,
            "inference_gateway_server_dns": dns,
            "inference_gateway_log_target": "stdout format raw",
            "gpuplat_stack": platform.name,
            "__inference_gateway_admin_socket": f"{HAPROXY_RUN_DIR}/admin.sock",
            "__inference_gateway_slot_prefix": "replica-",
            "__inference_gateway_canary_backend": CANARY_BACKEND,
        },
    )


# The haproxy.cfg.j2 template's `timeout http-keep-alive`: how long an idle keep-alive connection stays open.
GATEWAY_KEEP_ALIVE_S = 10
# How long a stopping gateway pod keeps listening before HAProxy's graceful stop. The control plane takes
# a stopping pod out of the Service's EndpointSlices at the same time as the kubelet stops it (Kubernetes
# docs, concepts/workloads/pods/pod-lifecycle.md, "Termination of Pods"), and every node's kube-proxy
# follows later; HAProxy's graceful stop first unbinds its listening ports (HAProxy management.txt,
# "Stopping and restarting HAProxy"), so a connection still sent to the pod meanwhile would be refused.
GATEWAY_ENDPOINTS_SETTLE_S = 5


def _gateway_stop_s(platform: ResolvedPlatform) -> int:
    """How long a gateway pod may take to stop: its preStop wait for the endpoints to settle, then the
    image stops HAProxy with SIGUSR1, its graceful stop (docker-library/haproxy 3.2/Dockerfile, STOPSIGNAL
    SIGUSR1; containerd's CRI sends the image's stop signal: internal/cri/server/container_stop.go,
    stopContainer), which ends once its requests in flight are answered. A request may wait in the queue,
    then run, and an idle keep-alive connection closes after its timeout; a rollout of the gateways (a
    canary's share changed) then cuts no request. The grace period counts the preStop hook's time too."""
    serving = platform.spec.serving
    assert serving is not None
    in_flight_s = math.ceil(serving.queue_timeout_s + serving.gateway_timeout_s) + GATEWAY_KEEP_ALIVE_S
    return GATEWAY_ENDPOINTS_SETTLE_S + in_flight_s


def _gateway(platform: ResolvedPlatform, namespace: str, gateways: int, config: str) -> Manifest:
    pool = platform.gateway_pool
    container = {
        "name": "haproxy",
        "image": HAPROXY_IMAGE,
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 3},
        # The image is Debian's (trixie-slim): /bin/sleep is there.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(GATEWAY_ENDPOINTS_SETTLE_S)]}}},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": HAPROXY_CONFIG_DIR, "readOnly": True},
            {"name": "run", "mountPath": HAPROXY_RUN_DIR},
        ],
    }
    spec: dict[str, Any] = {
        "nodeSelector": {LABEL_POOL: pool.name},
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": _gateway_stop_s(platform),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": HAPROXY_UID,
            "runAsGroup": HAPROXY_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": _selector(GATEWAY)},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": GATEWAY_CONFIG}},
            {"name": "run", "emptyDir": {}},
        ],
    }
    pool_tolerations = tolerations(pool)
    if pool_tolerations:
        spec["tolerations"] = pool_tolerations
    annotations = {
        SCRAPE: "true",
        "prometheus.io/port": str(GATEWAY_METRICS_PORT),
        "prometheus.io/path": "/metrics",
        # A changed configuration rolls the gateways (a ConfigMap change alone restarts nothing).
        "gpuplat/config-sha256": hashlib.sha256(config.encode()).hexdigest(),
    }
    return k8s_object(
        "apps/v1",
        "Deployment",
        GATEWAY,
        namespace,
        labels=_selector(GATEWAY),
        spec={
            "replicas": gateways,
            "selector": {"matchLabels": _selector(GATEWAY)},
            "template": {
                "metadata": {"labels": _selector(GATEWAY), "annotations": annotations},
                "spec": spec,
            },
        },
    )


def _gateway_service(namespace: str) -> Manifest:
    return k8s_object(
        "v1",
        "Service",
        GATEWAY,
        namespace,
        labels=_selector(GATEWAY),
        spec={
            "selector": _selector(GATEWAY),
            "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    )


# -- network policies -----------------------------------------------------------------------------------


def _model_server_policy(layout: ServingLayout, namespace: str) -> Manifest:
    """Only the gateway pods and the monitoring namespace reach the model servers' port; the pods of a
    multi-node group reach each other on every port (Ray, NCCL)."""
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": _selector(GATEWAY)}}, monitoring_peer()],
            "ports": [{"protocol": "TCP", "port": MODEL_SERVER_PORT}],
        }
    ]
    if layout.nodes > 1:
        ingress.append({"from": [{"podSelector": {"matchLabels": _selector(MODEL_SERVER)}}]})
    return k8s_object(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        MODEL_SERVER,
        namespace,
        spec={
            "podSelector": {"matchLabels": _selector(MODEL_SERVER)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    )


def _gateway_policy(namespace: str) -> Manifest:
    """The gateway's API port is open to every pod of the cluster, its metrics to monitoring."""
    return k8s_object(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        GATEWAY,
        namespace,
        spec={
            "podSelector": {"matchLabels": _selector(GATEWAY)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": GATEWAY_PORT}]},
                {"from": [monitoring_peer()], "ports": [{"protocol": "TCP", "port": GATEWAY_METRICS_PORT}]},
            ],
        },
    )
