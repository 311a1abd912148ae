"""How long one training step takes on a pool, for `gpuplat size --stack` and its $ per step.

Three parts, added (no overlap assumed: an upper bound; frameworks overlap some communication with
compute, and the order of pools holds while no part is hidden):

- compute: 6 x params x tokens per step (forward and backward, Kaplan et al. 2020, "Scaling Laws for
  Neural Language Models", section 2.1), spread over the GPUs, at the dense Tensor Core throughput of the
  run's precision (fp8: FP8, bf16/fp16: BF16, fp32: TF32; a GPU without the precision's figure, such as
  the A100 for FP8, runs it at its BF16 rate: Ampere has no FP8 Tensor Cores, so FP8 gains nothing there);
- memory: the optimizer step, which reads and writes every model state byte a GPU holds once per step
  (memory-bound: a few FLOPs per byte), at the GPU's memory bandwidth;
- communication: gradient synchronisation over the data-parallel ranks (a ring all-reduce moves
  2 (dp-1)/dp of the gradients per GPU; ZeRO-3 gathers the parameters in the forward and the backward
  too, 1.5 x that: Rajbhandari et al. 2020, "ZeRO", section 7) over the network when the ranks span
  nodes (the node's fabric bandwidth shared by its GPUs), else NVLink, else PCIe; and tensor
  parallelism's 4 all-reduces of the layer's activations per layer and micro-batch (Megatron-LM,
  Shoeybi et al. 2019, section 3), inside the node, over NVLink or else PCIe.

Tokens per step need the sequence length and micro-batch: without them only the compute ratio between
pools is known (the part that does not depend on them), and the step time is a ratio, as before.

Spot: a run on a spot pool loses, per interruption, the work since its last checkpoint (half an
interval on average) and the time to get nodes back and restart; `spot_overhead` is the fraction of
wall time that costs at the given interruption rate and restart time (both assumptions the caller
states: AWS publishes only coarse interruption-frequency bands per instance type).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.data.load import catalog
from infra.data.models import GpuModelFigures, NodeType
from infra.training.sizing import SizingResult

# The value bytes a gradient or a parameter takes on the wire, by precision (gradients are reduced in the
# compute precision; fp8 training keeps 16-bit gradients, as Transformer Engine does).
_WIRE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# What the optimizer step touches per model-state byte: read once and written once.
_OPTIMIZER_PASSES = 2
# All-reduces of the layer's activations per layer and micro-batch under tensor parallelism: 2 in the
# forward, 2 in the backward (Megatron-LM, section 3).
_TP_ALL_REDUCES_PER_LAYER = 4


@dataclass(frozen=True)
class Shape:
    """What the communication and the compute need beyond the sizing result (None: not given)."""

    seq_len: int | None = None
    micro_batch: int | None = None
    hidden_size: int | None = None
    layers: int | None = None

    @property
    def tokens_per_replica(self) -> int | None:
        if self.seq_len is None or self.micro_batch is None:
            return None
        return self.seq_len * self.micro_batch


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    """compute time; where tokens are unknown, the relative compute time (1 / TFLOPS)"""
    memory_s: float
    communication_s: float
    absolute: bool
    """whether the parts are seconds (tokens known) or compute alone is a relative figure"""
    throughput_tflops: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.memory_s + self.communication_s


def precision_tflops(figures: GpuModelFigures, precision: str) -> float | None:
    """The dense Tensor Core TFLOPS a precision runs at on this GPU (see the module docstring)."""
    by_precision = {
        "fp8": figures.fp8_dense_tflops,
        "fp32": figures.tf32_dense_tflops,
    }
    return by_precision.get(precision) or figures.bf16_dense_tflops


def _bidirectional_to_one_way(gbps: float | None) -> float | None:
    return None if gbps is None else gbps / 2


def _network_gbps_per_gpu(node: NodeType) -> float:
    """GB/s one GPU's share of the node's fabric carries one way (NICs x Gbps / 8, over the GPUs)."""
    return node.network.nics * node.network.gbps_per_nic / 8 / max(node.gpu_count, 1)


def _intra_node_gbps(figures: GpuModelFigures, node: NodeType) -> float | None:
    if node.gpu is not None and node.gpu.nvlink and figures.nvlink_gbps:
        return _bidirectional_to_one_way(figures.nvlink_gbps)
    return _bidirectional_to_one_way(figures.pcie_gbps)


def step_time(result: SizingResult, shape: Shape, node: NodeType) -> StepTime | None:
    """The step's time on `node`'s GPUs, or None where the catalog has no throughput for its GPU."""
    figures = catalog().gpu_figures(node.gpu.model) if node.gpu else None
    if figures is None:
        return None
    tflops = precision_tflops(figures, result.precision)
    if tflops is None:
        return None
    tokens = shape.tokens_per_replica
    if tokens is None:
        return StepTime(1 / tflops, 0.0, 0.0, False, tflops)
    flops_per_gpu = 6 * result.params * tokens * result.dp / result.world_size
    compute = flops_per_gpu / (tflops * 1e12)
    memory = _OPTIMIZER_PASSES * result.per_gpu_bytes.model_states / (figures.memory_bandwidth_gbps * 1e9)
    communication = _data_parallel_s(result, node, figures) + _tensor_parallel_s(result, shape, node, figures)
    return StepTime(compute, memory, communication, True, tflops)


def _data_parallel_s(result: SizingResult, node: NodeType, figures: GpuModelFigures) -> float:
    if result.dp == 1:
        return 0.0
    spans_nodes = result.world_size > node.gpu_count
    bandwidth = _network_gbps_per_gpu(node) if spans_nodes else _intra_node_gbps(figures, node)
    if not bandwidth:
        return 0.0
    gradient_bytes = result.params_per_gpu * _WIRE_BYTES[result.precision]
    volume = 2 * (result.dp - 1) / result.dp * gradient_bytes
    if result.zero == 3:
        volume *= 1.5
    return volume / (bandwidth * 1e9)


def _tensor_parallel_s(result: SizingResult, shape: Shape, node: NodeType, figures: GpuModelFigures) -> float:
    if result.tp == 1 or None in (shape.tokens_per_replica, shape.hidden_size, shape.layers):
        return 0.0
    bandwidth = _intra_node_gbps(figures, node)
    if not bandwidth:
        return 0.0
    assert shape.tokens_per_replica is not None and shape.hidden_size is not None and shape.layers is not None
    activation_bytes = shape.tokens_per_replica * shape.hidden_size * _WIRE_BYTES[result.precision]
    per_all_reduce = 2 * (result.tp - 1) / result.tp * activation_bytes
    layers_here = -(-shape.layers // result.pp)
    return _TP_ALL_REDUCES_PER_LAYER * layers_here * per_all_reduce / (bandwidth * 1e9)


def spot_overhead(
    step_s: float, checkpoint_every_steps: int, interruptions_per_day: float, restart_minutes: float
) -> float:
    """The fraction of a spot run's wall time lost to interruptions: per interruption half a checkpoint
    interval of work and the restart, times interruptions per hour of running."""
    lost_h = (checkpoint_every_steps * step_s / 2) / 3600 + restart_minutes / 60
    return min(interruptions_per_day / 24 * lost_h, 0.99)
