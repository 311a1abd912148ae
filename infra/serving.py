"""Model-server layout on an inference node: tensor-parallel degree and one replica per GPU group.

Inference memory per replica (vLLM): the weights (params x bytes per param) plus the KV cache the
replica needs at full concurrency, both split over its tensor-parallel GPUs, plus a fixed per-GPU
overhead (CUDA context, CUDA graphs, activations of one forward pass). vLLM claims
gpu_memory_fraction of each GPU, so a degree fits when

    (weights + kv_cache) / tp + overhead  <=  gpu_memory x gpu_memory_fraction

The degree is the smallest power of two that fits and divides the node's GPU count; the node then
runs gpus / tp replicas, replica i on GPUs [i*tp, (i+1)*tp) and on port base + i. Engines that do
not use GPUs (cpu-reference) and nodes whose GPUs are simulated run one replica without devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.data.models import NodeType
from infra.sizing import GIB
from infra.spec.models import Serving

# Per-GPU memory vLLM uses besides weights and KV cache (CUDA context, CUDA graphs, activations):
# an estimate, conservative for models up to ~70B at the default max batch.
OVERHEAD_GIB_PER_GPU = 2.0

Problem = tuple[str, str]


@dataclass(frozen=True)
class ServingLayout:
    tensor_parallel: int
    replicas: int
    devices: tuple[str, ...]
    """CUDA_VISIBLE_DEVICES of each replica ("" where the engine uses no GPU)."""
    gib_per_gpu: float | None
    """Memory one GPU of a replica needs (None where the model size is not given)."""

    def ports(self, base: int) -> list[int]:
        return [base + i for i in range(self.replicas)]


def replica_gib_per_gpu(serving: Serving, tensor_parallel: int) -> float | None:
    if serving.model_params_b is None:
        return None
    weights_gib = serving.model_params_b * 1e9 * serving.weight_bytes_per_param / GIB
    return (weights_gib + serving.kv_cache_gib) / tensor_parallel + OVERHEAD_GIB_PER_GPU


def _powers_of_two_dividing(count: int) -> list[int]:
    return [tp for tp in (1 << k for k in range(count.bit_length())) if count % tp == 0]


def serving_layout(
    serving: Serving, node_type: NodeType, *, simulated: bool, path: str
) -> tuple[ServingLayout | None, list[Problem]]:
    """The replica layout of one node of the serving pool, or the problems (path: the spec's serving)."""
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
        if not fitting:
            need = replica_gib_per_gpu(serving, gpus) or 0.0
            return None, [
                (
                    f"{path}.model_params_b",
                    f"a {serving.model_params_b}B-parameter model (+ {serving.kv_cache_gib} GiB KV cache) "
                    f"does not fit one {node_type.name} node: {need:.1f} GiB per GPU over all {gpus} GPUs, "
                    f"{usable:.1f} GiB usable; use a node type with more GPU memory or a smaller model",
                )
            ]
        tp = fitting[0]
    replicas = gpus // tp
    devices = tuple(",".join(str(g) for g in range(i * tp, (i + 1) * tp)) for i in range(replicas))
    return ServingLayout(
        tensor_parallel=tp, replicas=replicas, devices=devices, gib_per_gpu=replica_gib_per_gpu(serving, tp)
    ), []
