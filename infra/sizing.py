"""GPU memory sizing for transformer training: model states (ZeRO) and activations (Korthikanti).

Model states follow Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (arXiv:1910.02054), section 5 and figure 1. With Psi = params / (tp * pp) parameters
held by one model-parallel rank, Nd = dp data-parallel ranks, and K optimizer-state bytes per parameter,
the bytes per GPU are (mixed-precision Adam: 2 + 2 + K with K = 12, i.e. 16 Psi at stage 0):

    stage 0:  2 Psi      + 2 Psi      + K Psi
    stage 1:  2 Psi      + 2 Psi      + K Psi / Nd
    stage 2:  2 Psi      + 2 Psi / Nd + K Psi / Nd
    stage 3:  2 Psi / Nd + 2 Psi / Nd + K Psi / Nd

Bytes per parameter (params, grads, optimizer state) by precision and optimizer:

    mixed precision (bf16, fp16, fp8): params 2, grads 2;
        adam/adamw 12 (fp32 master 4 + momentum 4 + variance 4), sgd-momentum 8 (master 4 + momentum 4),
        sgd 4 (master 4).
    fp32: params 4, grads 4;
        adam/adamw 8 (momentum 4 + variance 4; the weights are the master copy), sgd-momentum 4, sgd 0.

fp8 is sized like bf16: Transformer Engine keeps the weights in bf16 with fp32 master weights in the
optimizer and casts to fp8 per GEMM, so the persistent states are the bf16 ones (the transient fp8 weight
copies and scaling factors are ignored; they fit in the headroom).

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), section 4: per transformer layer, with s = seq_len, b = micro_batch,
h = hidden_size, a = num_heads and t = tp,

    no parallelism:                      s*b*h * (34 + 5*a*s/h)
    tensor parallel, no sequence par.:   s*b*h * (10 + 24/t + 5*a*s/(h*t))
    tensor + sequence parallel:          s*b*h * (34 + 5*a*s/h) / t
    full activation checkpointing:       2*s*b*h   (2*s*b*h / t with sequence parallel)

These assume 16-bit activations; for fp32 training the figure is doubled (slightly conservative, the
dropout masks stay one byte). Embedding, final layer-norm and output-logit activations are left out, as
is the one layer whose activations are rebuilt during the backward pass under checkpointing.

Pipeline parallelism (1F1B schedule, section 4.2.3 of Korthikanti): the first stage is the most loaded;
it holds ceil(layers / pp) layers for pp micro-batches in flight, so its activations are
ceil(layers / pp) * pp * per-layer, i.e. the whole model's layers when pp divides layers. This assumes
at least pp micro-batches per step. Activations are not sharded by ZeRO.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.models import NodeType

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adam", "adamw", "sgd-momentum", "sgd"]

GIB = 2**30
GB = 10**9

# Bytes per parameter: (params, grads), then optimizer state, split by mixed precision or fp32.
_MIXED_WEIGHT_GRAD = (2, 2)
_FP32_WEIGHT_GRAD = (4, 4)
_OPTIMIZER_BYTES_MIXED: dict[str, int] = {"adam": 12, "adamw": 12, "sgd-momentum": 8, "sgd": 4}
_OPTIMIZER_BYTES_FP32: dict[str, int] = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}

_ACTIVATION_FIELDS = ("seq_len", "micro_batch", "hidden_size", "layers")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingSizingRequest(_Frozen):
    """What to size: model size, precision, optimizer, parallelism, ZeRO stage and optional activations."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    params: float = Field(gt=0, description="total parameter count, e.g. 7.5e9")
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"
    dp: int = Field(1, ge=1, description="data-parallel degree (Nd)")
    tp: int = Field(1, ge=1, description="tensor-parallel degree, kept inside one node")
    pp: int = Field(1, ge=1, description="pipeline-parallel degree")
    zero: int = Field(0, description="ZeRO stage 0..3, sharding over the dp ranks")
    seq_len: int | None = Field(None, gt=0)
    micro_batch: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    activation_checkpointing: bool = False
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (shards by tp)")
    gpu_memory_gib: float | None = Field(None, gt=0, description="target GPU memory to fit, GiB")
    headroom: float = Field(0.1, ge=0, lt=1, description="fraction of GPU memory kept for CUDA context etc.")

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSizingRequest:
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, not {self.zero}")
        given = [f for f in _ACTIVATION_FIELDS if getattr(self, f) is not None]
        if given and len(given) != len(_ACTIVATION_FIELDS):
            missing = [f for f in _ACTIVATION_FIELDS if f not in given]
            raise ValueError(
                f"activation inputs partially given: have {', '.join(given)}, missing {', '.join(missing)}"
                f" (give all of {', '.join(_ACTIVATION_FIELDS)} or none)"
            )
        if not given:
            if self.num_heads is not None:
                raise ValueError(
                    f"num_heads given without the activation inputs {', '.join(_ACTIVATION_FIELDS)}"
                )
            if self.activation_checkpointing:
                raise ValueError(
                    f"activation_checkpointing needs the activation inputs {', '.join(_ACTIVATION_FIELDS)}"
                )
            return self
        assert self.layers is not None and self.hidden_size is not None
        if self.pp > self.layers:
            raise ValueError(f"pp={self.pp} pipeline stages exceed layers={self.layers}")
        if self.num_heads is None:
            if not self.activation_checkpointing:
                raise ValueError(
                    "num_heads is required for the attention term of the activations "
                    "(5*a*s/h, Korthikanti et al. 2022); give num_heads or enable activation_checkpointing"
                )
        else:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
                )
            if self.num_heads % self.tp:
                raise ValueError(f"num_heads={self.num_heads} is not divisible by tp={self.tp}")
        if self.hidden_size % self.tp:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by tp={self.tp}")
        return self

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def has_activations(self) -> bool:
        return self.seq_len is not None


class BytesPerParam(_Frozen):
    """Bytes stored per parameter before any ZeRO sharding (K = optimizer)."""

    params: int
    grads: int
    optimizer: int


class PerGpuBytes(_Frozen):
    """Bytes held by one GPU (the most loaded: first pipeline stage for activations)."""

    params: int
    grads: int
    optimizer: int
    model_states: int = Field(description="params + grads + optimizer")
    activations: int
    total: int = Field(description="model_states + activations")


class ActivationDetail(_Frozen):
    """How the activation figure was built (Korthikanti et al. 2022)."""

    bytes_per_layer: int = Field(description="one layer, one micro-batch, on one tp rank")
    layers_per_stage: int = Field(description="ceil(layers / pp)")
    microbatches_in_flight: int = Field(description="pp under the 1F1B schedule")
    checkpointing: bool
    sequence_parallel: bool


class SizingResult(_Frozen):
    """Per-GPU memory of one training configuration; `to_json_dict()` gives its JSON shape."""

    params: float = Field(description="total parameter count")
    params_per_gpu: float = Field(description="Psi = params / (tp * pp), before ZeRO sharding")
    precision: Precision
    optimizer: Optimizer
    dp: int
    tp: int
    pp: int
    zero: int
    world_size: int = Field(description="dp * tp * pp")
    bytes_per_param: BytesPerParam
    per_gpu_bytes: PerGpuBytes
    activation: ActivationDetail | None
    headroom: float
    gpu_memory_gib: float | None = Field(description="target GPU memory from the request, GiB")
    usable_bytes_per_gpu: int | None = Field(description="gpu_memory_gib * 2**30 * (1 - headroom)")
    fits_target: bool | None = Field(description="per_gpu_bytes.total <= usable_bytes_per_gpu")
    min_dp: int | None = Field(description="smallest dp that fits the target memory; None if none does")
    min_gpus: int | None = Field(description="min_dp * tp * pp; None without a target or if nothing fits")

    def fits(self, gpu_memory_gib: float | None = None, headroom: float | None = None) -> bool:
        """Whether the per-GPU total fits a GPU of `gpu_memory_gib` GiB (default: the request's target)."""
        return self.per_gpu_bytes.total <= _usable_bytes(*self._target(gpu_memory_gib, headroom))

    def min_dp_for(self, gpu_memory_gib: float | None = None, headroom: float | None = None) -> int | None:
        """Smallest data-parallel degree (tp, pp fixed) whose per-GPU total fits; None if none does."""
        usable = _usable_bytes(*self._target(gpu_memory_gib, headroom))
        act = self.per_gpu_bytes.activations
        return _min_dp(self.params_per_gpu, self.bytes_per_param, self.zero, act, usable)

    def min_gpus_for(self, gpu_memory_gib: float | None = None, headroom: float | None = None) -> int | None:
        """min_dp_for(...) * tp * pp, the smallest world size that fits; None if none does."""
        dp = self.min_dp_for(gpu_memory_gib, headroom)
        return None if dp is None else dp * self.tp * self.pp

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready dict: `per_gpu_bytes.{params,grads,optimizer,model_states,activations,total}` etc."""
        return self.model_dump(mode="json")

    def _target(self, gpu_memory_gib: float | None, headroom: float | None) -> tuple[float, float]:
        mem = self.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
        if mem is None:
            raise ValueError("no GPU memory given: pass gpu_memory_gib or set it in the request")
        if mem <= 0:
            raise ValueError(f"gpu_memory_gib must be > 0, not {mem}")
        room = self.headroom if headroom is None else headroom
        if not 0 <= room < 1:
            raise ValueError(f"headroom must be in [0, 1), not {room}")
        return mem, room


class NodePlan(_Frozen):
    """How many nodes of one type carry the world size dp * tp * pp with every tp group inside a node."""

    node_type: str
    gpus_per_node: int
    nodes: int
    total_gpus: int = Field(description="nodes * gpus_per_node")
    idle_gpus: int = Field(description="total_gpus - world_size")
    usd_per_hour: float = Field(description="nodes * on-demand price")


def bytes_per_param(precision: Precision, optimizer: Optimizer) -> BytesPerParam:
    """Bytes per parameter for params, grads and optimizer state (ZeRO paper section 3.1 for Adam)."""
    if precision == "fp32":
        p, g = _FP32_WEIGHT_GRAD
        return BytesPerParam(params=p, grads=g, optimizer=_OPTIMIZER_BYTES_FP32[optimizer])
    p, g = _MIXED_WEIGHT_GRAD
    return BytesPerParam(params=p, grads=g, optimizer=_OPTIMIZER_BYTES_MIXED[optimizer])


def model_state_bytes(psi: float, bpp: BytesPerParam, zero: int, dp: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for Psi params per model-parallel rank (ZeRO section 5)."""
    params = bpp.params * psi / (dp if zero >= 3 else 1)
    grads = bpp.grads * psi / (dp if zero >= 2 else 1)
    optimizer = bpp.optimizer * psi / (dp if zero >= 1 else 1)
    return params, grads, optimizer


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden_size: int,
    num_heads: int | None,
    tp: int = 1,
    *,
    checkpointing: bool = False,
    sequence_parallel: bool = False,
) -> float:
    """Activation bytes of one transformer layer on one tp rank, 16-bit (Korthikanti et al. 2022, table 2)."""
    sbh = seq_len * micro_batch * hidden_size
    if checkpointing:
        return 2 * sbh / (tp if sequence_parallel else 1)
    if num_heads is None:
        raise ValueError("num_heads is required for the attention term 5*a*s/h of the activations")
    attention = 5 * num_heads * seq_len / hidden_size
    if sequence_parallel:
        return sbh * (34 + attention) / tp
    return sbh * (10 + 24 / tp + attention / tp)


def size_training(req: TrainingSizingRequest) -> SizingResult:
    """Per-GPU memory of model states (ZeRO, arXiv:1910.02054) and activations (arXiv:2205.05198)."""
    bpp = bytes_per_param(req.precision, req.optimizer)
    psi = req.params / (req.tp * req.pp)
    p, g, o = (math.ceil(x) for x in model_state_bytes(psi, bpp, req.zero, req.dp))

    detail: ActivationDetail | None = None
    act = 0
    if req.has_activations:
        assert req.seq_len and req.micro_batch and req.hidden_size and req.layers
        per_layer = activation_bytes_per_layer(
            req.seq_len,
            req.micro_batch,
            req.hidden_size,
            req.num_heads,
            req.tp,
            checkpointing=req.activation_checkpointing,
            sequence_parallel=req.sequence_parallel,
        )
        if req.precision == "fp32":
            per_layer *= 2
        layers_per_stage = math.ceil(req.layers / req.pp)
        in_flight = req.pp
        act = math.ceil(per_layer * layers_per_stage * in_flight)
        detail = ActivationDetail(
            bytes_per_layer=math.ceil(per_layer),
            layers_per_stage=layers_per_stage,
            microbatches_in_flight=in_flight,
            checkpointing=req.activation_checkpointing,
            sequence_parallel=req.sequence_parallel,
        )

    per_gpu = PerGpuBytes(
        params=p, grads=g, optimizer=o, model_states=p + g + o, activations=act, total=p + g + o + act
    )
    usable = None if req.gpu_memory_gib is None else _usable_bytes(req.gpu_memory_gib, req.headroom)
    min_dp = None if usable is None else _min_dp(psi, bpp, req.zero, act, usable)
    return SizingResult(
        params=req.params,
        params_per_gpu=psi,
        precision=req.precision,
        optimizer=req.optimizer,
        dp=req.dp,
        tp=req.tp,
        pp=req.pp,
        zero=req.zero,
        world_size=req.world_size,
        bytes_per_param=bpp,
        per_gpu_bytes=per_gpu,
        activation=detail,
        headroom=req.headroom,
        gpu_memory_gib=req.gpu_memory_gib,
        usable_bytes_per_gpu=usable,
        fits_target=None if usable is None else per_gpu.total <= usable,
        min_dp=min_dp,
        min_gpus=None if min_dp is None else min_dp * req.tp * req.pp,
    )


def node_fits(result: SizingResult, node_type: NodeType, *, headroom: float | None = None) -> bool:
    """Whether one GPU of `node_type` holds the per-GPU total and the node has at least tp GPUs."""
    if node_type.gpu_count < result.tp or node_type.gpu_memory_gib <= 0:
        return False
    return result.fits(node_type.gpu_memory_gib, headroom)


def smallest_node_type(
    result: SizingResult, node_types: Iterable[NodeType], *, headroom: float | None = None
) -> NodeType | None:
    """Cheapest node type (on-demand $/h, then fewest GPUs, then name) that fits; None if none does.

    A node type fits when gpu_memory_gib * 2**30 * (1 - headroom) >= per_gpu_bytes.total and it has at
    least tp GPUs (tensor parallelism stays inside a node). headroom defaults to the result's.
    """
    fitting = [n for n in node_types if node_fits(result, n, headroom=headroom)]
    if not fitting:
        return None
    return min(fitting, key=lambda n: (n.price.on_demand_usd_per_hour, n.gpu_count, n.name))


def nodes_needed(result: SizingResult, node_type: NodeType) -> int:
    """Nodes of `node_type` that carry dp * tp * pp GPUs, each tp group inside one node.

    Each node holds gpu_count // tp tp groups, and there are dp * pp groups, so the count is
    ceil(dp * pp / (gpu_count // tp)) (= ceil(world_size / gpu_count) when tp divides gpu_count).
    """
    groups_per_node = node_type.gpu_count // result.tp
    if groups_per_node < 1:
        raise ValueError(
            f"node type {node_type.name!r} has {node_type.gpu_count} GPUs, fewer than tp={result.tp}"
        )
    return math.ceil(result.dp * result.pp / groups_per_node)


def plan_nodes(
    result: SizingResult, node_types: Iterable[NodeType], *, headroom: float | None = None
) -> NodePlan | None:
    """smallest_node_type(...) with the node count for the world size; None if no node type fits."""
    node = smallest_node_type(result, node_types, headroom=headroom)
    if node is None:
        return None
    nodes = nodes_needed(result, node)
    total = nodes * node.gpu_count
    return NodePlan(
        node_type=node.name,
        gpus_per_node=node.gpu_count,
        nodes=nodes,
        total_gpus=total,
        idle_gpus=total - result.world_size,
        usd_per_hour=round(nodes * node.price.on_demand_usd_per_hour, 4),
    )


def _usable_bytes(gpu_memory_gib: float, headroom: float) -> int:
    return math.floor(gpu_memory_gib * GIB * (1 - headroom))


def _min_dp(psi: float, bpp: BytesPerParam, zero: int, activations: int, usable: int) -> int | None:
    """Smallest dp whose per-GPU total A + B/dp fits `usable`, where B is what ZeRO shards over dp."""

    def total(dp: int) -> int:
        return activations + sum(math.ceil(x) for x in model_state_bytes(psi, bpp, zero, dp))

    sharded = _sharded_at_dp1(psi, bpp, zero)
    unsharded = activations + sum(model_state_bytes(psi, bpp, zero, 1)) - sharded
    if total(1) <= usable:
        return 1
    if sharded == 0 or unsharded >= usable:
        return None
    dp = max(1, math.ceil(sharded / (usable - unsharded)))
    while dp > 1 and total(dp - 1) <= usable:  # guard against float rounding either way
        dp -= 1
    for _ in range(4):
        if total(dp) <= usable:
            return dp
        dp += 1
    return None


def _sharded_at_dp1(psi: float, bpp: BytesPerParam, zero: int) -> float:
    """Bytes that ZeRO stage `zero` divides by dp (at dp = 1)."""
    sharded = bpp.optimizer * psi if zero >= 1 else 0.0
    sharded += bpp.grads * psi if zero >= 2 else 0.0
    sharded += bpp.params * psi if zero >= 3 else 0.0
    return sharded
