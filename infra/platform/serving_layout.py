"""Model-server layout on an inference node: tensor-parallel degree and one replica per GPU group.

Inference memory per replica (vLLM): the weights (params x bytes per param) plus the KV cache the
replica needs, both split over its tensor-parallel GPUs, plus a fixed per-GPU overhead (CUDA context,
CUDA graphs, activations of one forward pass). vLLM claims gpu_memory_fraction of each GPU, so a
degree fits when

    (weights + kv_cache) / tp + overhead  <=  gpu_memory x gpu_memory_fraction      (all in GiB)

kv_cache is the larger of what the stack declares for its concurrency (kv_cache_gib) and vLLM's own
floor: the KV cache of one sequence of max_model_len tokens, which vLLM must fit or it refuses to start
(vllm-project/vllm, vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory). The GPU memory is the
catalog's marketed GB converted to GiB (infra.data.models.NodeType.gpu_memory_gib).

The degree is the smallest power of two that fits and divides the node's GPU count; the node then
runs gpus / tp replicas, replica i on GPUs [i*tp, (i+1)*tp) and on port base + i. Engines that do
not use GPUs (cpu-reference) and nodes whose GPUs are simulated run one replica without devices.

A model too large for one node runs across several where the platform can launch a replica on a group
of nodes (Kubernetes: a LeaderWorkerSet): tensor parallel over the node's GPUs, pipeline parallel over
the smallest number of nodes it fits, as vLLM's guide to distributed serving prescribes
(https://github.com/vllm-project/vllm/blob/main/docs/serving/parallelism_scaling.md, "Multi-node
multi-GPU"). The Slurm roles run one node per replica and keep refusing such a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from infra.data.models import GIB, NodeType
from infra.spec.models import Serving

# Per-GPU memory vLLM uses besides weights and KV cache (CUDA context, CUDA graphs, activations):
# an estimate, conservative for models up to ~70B at the default max batch.
OVERHEAD_GIB_PER_GPU = 2.0

# How long a replica may take to start, before it counts as failed. Reading the weights is bounded by a
# worst-case sustained read of one replica (a single stream from a shared filesystem under training
# load, or from the object store); the engine's own start (torch.compile, CUDA graph capture, KV-cache
# profiling, a multi-node group's Ray cluster) adds a fixed time. Both are estimates, not measurements:
# a budget set too long only delays noticing a replica that hangs.
WORST_CASE_LOAD_MIB_PER_S = 250
ENGINE_START_S = 600
MIN_STARTUP_BUDGET_S = 20 * 60

Problem = tuple[str, str]
CanaryGpus = Literal["beside", "spare", "borrow"]


@dataclass(frozen=True)
class ServingLayout:
    tensor_parallel: int
    replicas: int
    devices: tuple[str, ...]
    """CUDA_VISIBLE_DEVICES of each replica ("" where the engine uses no GPU)."""
    gib_per_gpu: float | None
    """Memory one GPU of a replica needs (None where the model size is not given)."""
    nodes: int = 1
    """Nodes one replica spans; above 1 the replica is pipeline parallel over them, tensor parallel over
    every GPU of each node (replicas and devices then describe each node of the group)."""
    canary: CanaryGpus = "beside"
    """Where a canary release runs on each node (Slurm stacks, `gpuplat serve`): beside the replicas (no GPU:
    the CPU engine, simulated GPUs), on the GPU group the node keeps spare for it, or on the GPUs of one
    stable replica it borrows (serving.canary.gpus)."""
    canary_devices: str = ""
    """CUDA_VISIBLE_DEVICES of the canary's spare GPU group ("" unless canary is spare)."""

    @property
    def pipeline_parallel(self) -> int:
        return self.nodes

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel * self.nodes

    def ports(self, base: int) -> list[int]:
        return [base + i for i in range(self.replicas)]


def weights_gib(serving: Serving) -> float | None:
    if serving.model_params_b is None:
        return None
    return serving.model_params_b * 1e9 * serving.weight_bytes_per_param / GIB


def kv_cache_floor_gib(serving: Serving) -> float:
    """The KV cache of one max_model_len sequence, below which vLLM does not start (0 when the model's
    bytes per token are not given)."""
    if serving.kv_cache_bytes_per_token is None:
        return 0.0
    return serving.max_model_len * serving.kv_cache_bytes_per_token / GIB


def kv_cache_needed_gib(serving: Serving) -> float:
    return max(serving.kv_cache_gib, kv_cache_floor_gib(serving))


def replica_gib_per_gpu(serving: Serving, gpus: int) -> float | None:
    """Memory each of a replica's `gpus` GPUs needs (tensor x pipeline parallel)."""
    weights = weights_gib(serving)
    if weights is None:
        return None
    return (weights + kv_cache_needed_gib(serving)) / gpus + OVERHEAD_GIB_PER_GPU


def startup_budget_s(serving: Serving, layout: ServingLayout, node_type: NodeType) -> int:
    """Seconds a replica may take from start to serving: its weights at the worst-case read rate plus
    the engine's start, at least 20 minutes. Without a model size, the weights are taken as large as
    the replica's GPUs could hold (their usable memory), an upper bound."""
    weights = weights_gib(serving)
    if weights is None:
        usable = node_type.gpu_memory_gib * serving.gpu_memory_fraction
        weights = usable * layout.gpus_per_replica
    read_s = weights * 1024 / WORST_CASE_LOAD_MIB_PER_S
    return max(MIN_STARTUP_BUDGET_S, math.ceil(read_s + ENGINE_START_S))


def _powers_of_two_dividing(count: int) -> list[int]:
    return [tp for tp in (1 << k for k in range(count.bit_length())) if count % tp == 0]


def _multi_node_layout(
    serving: Serving, node_type: NodeType, usable: float, pool_nodes: int, path: str
) -> tuple[ServingLayout | None, list[Problem]]:
    """Tensor parallel over each node's GPUs, pipeline parallel over the fewest nodes the model fits."""
    gpus = node_type.gpu_count
    nodes = next(
        (n for n in range(2, pool_nodes + 1) if (replica_gib_per_gpu(serving, gpus * n) or 0.0) <= usable),
        None,
    )
    if nodes is None:
        need = replica_gib_per_gpu(serving, gpus * pool_nodes) or 0.0
        return None, [
            (
                f"{path}.model_params_b",
                f"a {serving.model_params_b}B-parameter model (+ {kv_cache_needed_gib(serving):.1f} GiB KV "
                f"cache) does not fit even all {pool_nodes} {node_type.name} nodes of pool {serving.pool!r}: "
                f"{need:.1f} GiB per GPU over their {gpus * pool_nodes} GPUs, {usable:.1f} GiB usable; add "
                "nodes to the pool, use a node type with more GPU memory or a smaller model",
            )
        ]
    if serving.max_replicas * nodes > pool_nodes:
        return None, [
            (
                f"{path}.max_replicas",
                f"{serving.max_replicas} replicas of {nodes} {node_type.name} nodes each (the "
                f"{serving.model_params_b}B-parameter model spans {nodes} nodes) need "
                f"{serving.max_replicas * nodes} nodes; pool {serving.pool!r} has {pool_nodes}: set "
                f"max_replicas to at most {pool_nodes // nodes} or add nodes to the pool",
            )
        ]
    layout = ServingLayout(
        tensor_parallel=gpus,
        replicas=1,
        devices=(",".join(str(g) for g in range(gpus)),),
        gib_per_gpu=replica_gib_per_gpu(serving, gpus * nodes),
        nodes=nodes,
    )
    return layout, []


def serving_layout(
    serving: Serving,
    node_type: NodeType,
    *,
    simulated: bool,
    path: str,
    multi_node: bool = False,
    pool_nodes: int = 1,
    pool_min_nodes: int | None = None,
) -> tuple[ServingLayout | None, list[Problem]]:
    """The replica layout of one node of the serving pool, or the problems (path: the spec's serving).

    multi_node: a replica may span several nodes of the pool (pool_nodes: its most nodes) where it does
    not fit one (Kubernetes). pool_min_nodes: the pool's fewest nodes, which a canary that borrows a
    replica's GPUs must leave a stable replica on (None: the replicas alone, no canary's GPUs placed)."""
    gpus = node_type.gpu_count
    if serving.engine != "vllm" or simulated or gpus == 0:
        return ServingLayout(tensor_parallel=1, replicas=1, devices=("",), gib_per_gpu=None), []
    usable = node_type.gpu_memory_gib * serving.gpu_memory_fraction
    degrees = _powers_of_two_dividing(gpus)
    if serving.tensor_parallel is not None:
        tp = serving.tensor_parallel
        if tp not in degrees:
            return None, [
                (
                    f"{path}.tensor_parallel",
                    f"{tp} is not a power of two dividing the {gpus} GPUs of {node_type.name}; "
                    f"use one of {', '.join(map(str, degrees))}",
                )
            ]
        need = replica_gib_per_gpu(serving, tp)
        if need is not None and need > usable:
            if multi_node and tp == gpus:
                return _multi_node_layout(serving, node_type, usable, pool_nodes, path)
            return None, [
                (
                    f"{path}.tensor_parallel",
                    f"a {serving.model_params_b}B-parameter model needs {need:.1f} GiB per GPU at tensor "
                    f"parallel {tp}, more than {usable:.1f} GiB ({node_type.gpu_memory_gib} GiB x "
                    f"gpu_memory_fraction {serving.gpu_memory_fraction}) of {node_type.name}",
                )
            ]
    else:
        fitting = [d for d in degrees if (replica_gib_per_gpu(serving, d) or 0.0) <= usable]
        if not fitting and multi_node:
            return _multi_node_layout(serving, node_type, usable, pool_nodes, path)
        if not fitting:
            need = replica_gib_per_gpu(serving, gpus) or 0.0
            kv_cache = kv_cache_needed_gib(serving)
            return None, [
                (
                    f"{path}.model_params_b",
                    f"a {serving.model_params_b}B-parameter model (+ {kv_cache:.1f} GiB KV cache) does not "
                    f"fit one {node_type.name} node: {need:.1f} GiB per GPU over all {gpus} GPUs, "
                    f"{usable:.1f} GiB usable; use a node type with more GPU memory or a smaller model",
                )
            ]
        tp = fitting[0]
    groups = tuple(",".join(str(g) for g in range(i * tp, (i + 1) * tp)) for i in range(gpus // tp))
    layout = ServingLayout(
        tensor_parallel=tp, replicas=len(groups), devices=groups, gib_per_gpu=replica_gib_per_gpu(serving, tp)
    )
    if multi_node and "gpus" in serving.canary.model_fields_set:
        return None, [
            (
                f"{path}.canary.gpus",
                "on Kubernetes a canary is a workload of its own whose pods the scheduler places on free "
                "GPUs (infra/k8s/serving_versions.py); serving.canary.gpus places a Slurm stack's canary: "
                "drop it",
            )
        ]
    if multi_node or pool_min_nodes is None:  # Kubernetes: a canary's pods are placed by the scheduler
        return layout, []
    return _with_canary(serving, layout, node_type, pool_min_nodes, path)


def _with_canary(
    serving: Serving, layout: ServingLayout, node_type: NodeType, pool_min_nodes: int, path: str
) -> tuple[ServingLayout | None, list[Problem]]:
    """Where a canary release's GPUs come from on a Slurm stack (serving.canary.gpus): a GPU group each node
    keeps spare (one replica fewer per node), or one stable replica's GPUs borrowed on one node while the
    canary runs (one replica fewer in the pool during a release). Refused where the choice leaves the
    stable version no replica."""
    groups, tp = layout.replicas, layout.tensor_parallel
    where = f"{path}.canary.gpus"
    if serving.canary.gpus == "spare":
        if groups < 2:
            return None, [
                (
                    where,
                    f"spare keeps one GPU group of each node free for the canary, but a {node_type.name} "
                    f"node has {groups} group of {tp} GPU(s) (tensor parallel {tp} of its "
                    f"{node_type.gpu_count}), "
                    "none left for a stable replica: "
                    + _other_choice(groups, pool_min_nodes, "borrow", serving.pool),
                )
            ]
        return replace(
            layout,
            replicas=groups - 1,
            devices=layout.devices[:-1],
            canary="spare",
            canary_devices=layout.devices[-1],
        ), []
    if groups * pool_min_nodes < 2:
        return None, [
            (
                where,
                f"borrow runs the canary on the GPUs of one stable replica, but pool {serving.pool!r} runs "
                f"{groups * pool_min_nodes} replica(s) at its smallest ({pool_min_nodes} node(s) of "
                f"{groups}): none would be left for the stable version while the canary runs; "
                + _other_choice(groups, pool_min_nodes, "spare", serving.pool),
            )
        ]
    return replace(layout, canary="borrow"), []


def _other_choice(groups: int, pool_min_nodes: int, other: str, pool: str) -> str:
    """What to change where one choice of serving.canary.gpus does not fit: the other, where it fits."""
    if other == "spare" and groups >= 2:
        return "set serving.canary.gpus to spare (each node keeps one of its GPU groups for the canary)"
    if other == "borrow" and groups * pool_min_nodes >= 2:
        return "set serving.canary.gpus to borrow (the canary takes one stable replica's GPUs meanwhile)"
    return (
        f"neither choice fits: give pool {pool!r} at least 2 nodes at its smallest (min, count or hosts), or "
        "a smaller tensor_parallel so that a node holds 2 replicas"
    )
