"""GPU memory sizing for transformer training: model states, activations, logits and a process overhead.

Per GPU, at the peak of a training step (the start of the backward pass):

    total = model states + activations + logits + overhead

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
    fp32, and 16-bit autocast over fp32 weights (PyTorch AMP): params 4, grads 4;
        adam/adamw 8 (momentum 4 + variance 4; the weights are the master copy), sgd-momentum 4, sgd 0.

fp8 is sized like bf16: Transformer Engine keeps the weights in bf16 with fp32 master weights in the
optimizer and casts to fp8 per GEMM, so the persistent states are the bf16 ones.

Activations of one transformer layer and micro-batch on one tp rank, with s = seq_len, b = micro_batch,
h = hidden_size, a = num_heads, t = tp, v = bytes of an activation (2 for 16-bit, 4 for fp32) and r = bytes
of the residual stream (v, or 4 under autocast, where the embeddings and the residual sums stay fp32 and
layer_norm runs in fp32: PyTorch AMP docs, "CUDA Ops that can autocast to float32"). The tensors kept for
the backward pass are those of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), section 4.1:

    kept whole on every tp rank (split only by sequence parallelism):
        two layer-norm inputs                             2r sbh
        inputs of the QKV and first MLP linears           2v sbh
        two dropout masks (attention and MLP output)       2 sbh     (with dropout)
    split over tp:
        Q, K, V                                           3v sbh     (math: 12 sbh, below)
        attention output (input of the projection)         v sbh
        GeLU input and input of the second MLP linear     8v sbh
        attention core                                    flash or math, below

With v = r = 2 and dropout that is Korthikanti's 34 sbh outside the attention core, whose own term
5 as^2 b (16-bit softmax output 2, dropout mask 1, dropout output 2 per score) is their 5as/h.
Tensor parallelism without sequence parallelism gives their sbh(10 + 24/t + 5as/(ht)).

    flash: Dao et al. 2022, "FlashAttention" (arXiv:2205.14135), section 3.1 and Algorithm 2: the
        kernel keeps Q, K, V, the output and per row the softmax statistics (PyTorch's fused kernels keep
        one fp32 log-sum-exp per row and head: 4 asb bytes), recomputes the scores in the backward and
        regenerates the dropout mask from the saved RNG state. No term grows with s^2.
    math: PyTorch's math scaled-dot-product attention (aten/src/ATen/native/transformers/attention.cpp,
        _scaled_dot_product_attention_math, since PyTorch 2.5) converts 16-bit Q, K, V to fp32 unless
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True): it keeps fp32 Q, K, V (12 sbh) and
        per score the fp32 softmax output (4) and, with dropout, the mask (1) and the fp32 dropout output
        (4): as^2 b (4 + 5). This bounds Megatron's unfused 16-bit softmax (5 as^2 b) from above.

Full activation checkpointing keeps only each layer's input, r sbh (r sbh / t with sequence
parallelism); the one layer rebuilt during the backward pass is left out.

Outside the layers: the embedding dropout mask (sbh, first pipeline stage), the final layer-norm input
(r sbh) and the LM-head input (v sbh) on the last stage. Under autocast the 16-bit copies of the weights
(2 Psi) stay referenced by the autograd graph of every micro-batch in flight until its backward pass
(torch.autocast's weight cast cache, `cache_enabled`).

Logits (last stage, split over tp by a vocabulary-parallel output layer): the loss is computed in fp32
(cross_entropy = log_softmax + nll_loss autocast to fp32), so the fp32 log-probabilities, 4 sbV bytes
with V = vocab_size, stay until the backward pass, whose first step adds two more fp32 tensors of that
size (the gradient of the log-probabilities and of the logits): 12 sbV in all at the peak.

Pipeline parallelism (1F1B schedule, Korthikanti section 4.2.3): the first stage holds ceil(layers / pp)
layers for pp micro-batches in flight, the last stage one micro-batch plus the logits; the per-GPU figure
is the larger of the two (the same stage when pp = 1). Activations are not sharded by ZeRO.

Overhead: one fixed margin per process, PROCESS_OVERHEAD_BYTES (1 GiB), for what is not a tensor of the
model: CUDA context and kernels, cuBLAS and NCCL workspaces, allocator rounding. The measured rows in
infra/data/memory_calibration.yaml put it at about 0.6 GB on one H200 without NCCL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.models import GIB, NodeType

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adam", "adamw", "sgd-momentum", "sgd"]
Attention = Literal["flash", "math"]
Stage = Literal["only", "first", "last"]

PROCESS_OVERHEAD_BYTES = GIB

# Bytes per parameter: (params, grads), then optimizer state, split by 16-bit or fp32 weights.
_MIXED_WEIGHT_GRAD = (2, 2)
_FP32_WEIGHT_GRAD = (4, 4)
_OPTIMIZER_BYTES_MIXED: dict[str, int] = {"adam": 12, "adamw": 12, "sgd-momentum": 8, "sgd": 4}
_OPTIMIZER_BYTES_FP32: dict[str, int] = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}
_AUTOCAST_PRECISIONS = ("bf16", "fp16")

_FP32 = 4
_MASK = 1  # dropout masks are bool tensors
_WEIGHT_COPY = 2  # 16-bit copy of an fp32 weight under autocast
_LOGITS_KEPT = 4  # fp32 log-probabilities kept for the backward pass
_LOGITS_BACKWARD = 8  # two fp32 gradients of the logits' size at the start of the backward pass

_ACTIVATION_FIELDS = ("seq_len", "micro_batch", "hidden_size", "layers")
_SHAPE_ONLY_FIELDS = ("num_heads", "vocab_size")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingSizingRequest(_Frozen):
    """What to size: model size, precision, optimizer, parallelism, ZeRO stage and optional activations."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    params: float = Field(gt=0, description="total parameter count, e.g. 7.5e9")
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"
    autocast: bool = Field(
        False,
        description="PyTorch autocast: fp32 weights, bf16/fp16 compute (otherwise 16-bit weights with fp32 "
        "master copies in the optimizer, as in Megatron and DeepSpeed)",
    )
    dp: int = Field(1, ge=1, description="data-parallel degree (Nd)")
    tp: int = Field(1, ge=1, description="tensor-parallel degree, kept inside one node")
    pp: int = Field(1, ge=1, description="pipeline-parallel degree")
    zero: int = Field(0, description="ZeRO stage 0..3, sharding over the dp ranks")
    seq_len: int | None = Field(None, gt=0)
    micro_batch: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, gt=0, description="vocabulary size, for the fp32 logits")
    attention: Attention = Field(
        "flash", description="flash: fused kernel, nothing of size seq_len^2 kept; math: scores kept per head"
    )
    dropout: bool = Field(True, description="dropout layers present (their masks are kept for the backward)")
    activation_checkpointing: bool = False
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (shards by tp)")
    gpu_memory_gib: float | None = Field(None, gt=0, description="target GPU memory to fit, GiB")
    headroom: float = Field(
        0.1, ge=0, lt=1, description="fraction of GPU memory left free for allocator fragmentation"
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSizingRequest:
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, not {self.zero}")
        if self.autocast and self.precision not in _AUTOCAST_PRECISIONS:
            raise ValueError(
                f"autocast computes in bf16 or fp16 over fp32 weights: precision must be "
                f"{' or '.join(_AUTOCAST_PRECISIONS)}, not {self.precision}"
            )
        given = [f for f in _ACTIVATION_FIELDS if getattr(self, f) is not None]
        if given and len(given) != len(_ACTIVATION_FIELDS):
            missing = [f for f in _ACTIVATION_FIELDS if f not in given]
            raise ValueError(
                f"activation inputs partially given: have {', '.join(given)}, missing {', '.join(missing)}"
                f" (give all of {', '.join(_ACTIVATION_FIELDS)} or none)"
            )
        if not given:
            for name in _SHAPE_ONLY_FIELDS:
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} given without the activation inputs {', '.join(_ACTIVATION_FIELDS)}"
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
                    "num_heads is required for the attention terms of the activations "
                    "(Korthikanti et al. 2022); give num_heads or enable activation_checkpointing"
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
    """Bytes held by one GPU at the peak of a step (the most loaded pipeline stage)."""

    params: int
    grads: int
    optimizer: int
    model_states: int = Field(description="params + grads + optimizer")
    activations: int = Field(description="layers, embedding and output-layer inputs, autocast weight copies")
    logits: int = Field(description="fp32 log-probabilities kept plus the two fp32 gradients of the loss")
    overhead: int = Field(description="fixed per-process margin: CUDA context, workspaces, allocator")
    total: int = Field(description="model_states + activations + logits + overhead")


class ActivationDetail(_Frozen):
    """How the activation and logit figures were built, for the most loaded pipeline stage."""

    bytes_per_layer: int = Field(description="one layer, one micro-batch, on one tp rank")
    layers_per_stage: int = Field(description="ceil(layers / pp)")
    microbatches_in_flight: int = Field(description="pp on the first stage (1F1B), 1 on the last")
    stage: Stage = Field(description="the pipeline stage sized: first (embedding) or last (logits)")
    layers_bytes: int = Field(description="bytes_per_layer * layers_per_stage * microbatches_in_flight")
    embedding_output_bytes: int = Field(
        description="embedding dropout mask; final layer-norm and LM-head inputs"
    )
    weight_copy_bytes: int = Field(description="16-bit weight copies held under autocast, per micro-batch")
    logits_kept_bytes: int = Field(description="fp32 log-probabilities kept for the backward pass")
    logits_backward_bytes: int = Field(description="the two fp32 gradients at the start of the backward")
    attention: Attention
    dropout: bool
    autocast: bool
    checkpointing: bool
    sequence_parallel: bool

    @property
    def activation_bytes(self) -> int:
        return self.layers_bytes + self.embedding_output_bytes + self.weight_copy_bytes

    @property
    def logit_bytes(self) -> int:
        return self.logits_kept_bytes + self.logits_backward_bytes

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.logit_bytes


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
    assumptions: list[str] = Field(description="what the figures assume, one sentence each")
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
        return _min_dp(
            self.params_per_gpu, self.bytes_per_param, self.zero, _unsharded(self.per_gpu_bytes), usable
        )

    def min_gpus_for(self, gpu_memory_gib: float | None = None, headroom: float | None = None) -> int | None:
        """min_dp_for(...) * tp * pp, the smallest world size that fits; None if none does."""
        dp = self.min_dp_for(gpu_memory_gib, headroom)
        return None if dp is None else dp * self.tp * self.pp

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready dict: `per_gpu_bytes` (params ... logits, overhead, total), `assumptions` etc."""
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


# Fabrics that carry NCCL between nodes without the kernel's TCP stack (infra/data/models.py NicFabric).
RDMA_FABRICS = ("efa", "infiniband", "roce")


class NodePlan(_Frozen):
    """How many nodes of one type carry the world size dp * tp * pp with every tp group inside a node."""

    node_type: str
    gpus_per_node: int
    nodes: int
    total_gpus: int = Field(description="nodes * gpus_per_node")
    idle_gpus: int = Field(description="total_gpus - world_size")
    usd_per_hour: float = Field(description="nodes * on-demand price")
    left_out: list[str] = Field(
        default_factory=list, description="cheaper node types refused: several nodes without an RDMA fabric"
    )


def bytes_per_param(precision: Precision, optimizer: Optimizer, *, autocast: bool = False) -> BytesPerParam:
    """Bytes per parameter for params, grads and optimizer state (ZeRO paper section 3.1 for Adam)."""
    if precision == "fp32" or autocast:
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
    attention: Attention = "flash",
    dropout: bool = True,
    precision: Precision = "bf16",
    autocast: bool = False,
    checkpointing: bool = False,
    sequence_parallel: bool = False,
) -> float:
    """Bytes one transformer layer keeps for the backward pass on one tp rank (terms: module docstring)."""
    sbh = seq_len * micro_batch * hidden_size
    value, residual = _value_bytes(precision), _residual_bytes(precision, autocast)
    whole_split = tp if sequence_parallel else 1
    if checkpointing:
        return residual * sbh / whole_split
    if num_heads is None:
        raise ValueError("num_heads is required for the attention terms of the activations")
    mask = _MASK if dropout else 0
    kept_whole = 2 * residual + 2 * value + 2 * mask
    if attention == "math":
        qkv = 3 * _FP32
        per_score = _FP32 + (mask + _FP32 if dropout else 0)  # softmax output; dropout mask and output
        core = per_score * num_heads * seq_len / hidden_size
    else:
        qkv = 3 * value
        core = _FP32 * num_heads / hidden_size  # log-sum-exp: one fp32 per row and head
    split = qkv + value + 8 * value + core
    return sbh * (kept_whole / whole_split + split / tp)


def logits_bytes(seq_len: int, micro_batch: int, vocab_size: int | None, tp: int = 1) -> tuple[float, float]:
    """(kept, backward) bytes of the fp32 loss over b*s*vocab logits on one tp rank; (0, 0) without vocab."""
    if vocab_size is None:
        return 0.0, 0.0
    sbv = seq_len * micro_batch * vocab_size / tp
    return _LOGITS_KEPT * sbv, _LOGITS_BACKWARD * sbv


def size_training(req: TrainingSizingRequest) -> SizingResult:
    """Per-GPU memory at the peak of a training step (terms and sources: module docstring)."""
    bpp = bytes_per_param(req.precision, req.optimizer, autocast=req.autocast)
    psi = req.params / (req.tp * req.pp)
    p, g, o = (math.ceil(x) for x in model_state_bytes(psi, bpp, req.zero, req.dp))
    detail = _most_loaded_stage(req, psi) if req.has_activations else None
    act = 0 if detail is None else detail.activation_bytes
    logits = 0 if detail is None else detail.logit_bytes
    overhead = PROCESS_OVERHEAD_BYTES
    per_gpu = PerGpuBytes(
        params=p,
        grads=g,
        optimizer=o,
        model_states=p + g + o,
        activations=act,
        logits=logits,
        overhead=overhead,
        total=p + g + o + act + logits + overhead,
    )
    usable = None if req.gpu_memory_gib is None else _usable_bytes(req.gpu_memory_gib, req.headroom)
    min_dp = None if usable is None else _min_dp(psi, bpp, req.zero, _unsharded(per_gpu), usable)
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
        assumptions=_assumptions(req, bpp, detail),
        headroom=req.headroom,
        gpu_memory_gib=req.gpu_memory_gib,
        usable_bytes_per_gpu=usable,
        fits_target=None if usable is None else per_gpu.total <= usable,
        min_dp=min_dp,
        min_gpus=None if min_dp is None else min_dp * req.tp * req.pp,
    )


def _most_loaded_stage(req: TrainingSizingRequest, psi: float) -> ActivationDetail:
    """With pp = 1 the only stage; else the larger of the first (pp micro-batches) and the last (logits)."""
    if req.pp == 1:
        return _stage_activations(req, psi, "only")
    first, last = _stage_activations(req, psi, "first"), _stage_activations(req, psi, "last")
    return last if last.total_bytes > first.total_bytes else first


def _stage_activations(req: TrainingSizingRequest, psi: float, stage: Stage) -> ActivationDetail:
    assert req.seq_len and req.micro_batch and req.hidden_size and req.layers
    per_layer = activation_bytes_per_layer(
        req.seq_len,
        req.micro_batch,
        req.hidden_size,
        req.num_heads,
        req.tp,
        attention=req.attention,
        dropout=req.dropout,
        precision=req.precision,
        autocast=req.autocast,
        checkpointing=req.activation_checkpointing,
        sequence_parallel=req.sequence_parallel,
    )
    has_embedding, has_output = stage in ("only", "first"), stage in ("only", "last")
    layers_per_stage = math.ceil(req.layers / req.pp)
    in_flight = req.pp if has_embedding else 1
    sbh = req.seq_len * req.micro_batch * req.hidden_size / (req.tp if req.sequence_parallel else 1)
    embedding_mask = (_MASK if req.dropout else 0) * sbh if has_embedding else 0
    output_inputs = (_residual_bytes(req.precision, req.autocast) + _value_bytes(req.precision)) * sbh
    kept, backward = (
        logits_bytes(req.seq_len, req.micro_batch, req.vocab_size, req.tp) if has_output else (0, 0)
    )
    return ActivationDetail(
        bytes_per_layer=math.ceil(per_layer),
        layers_per_stage=layers_per_stage,
        microbatches_in_flight=in_flight,
        stage=stage,
        layers_bytes=math.ceil(per_layer * layers_per_stage * in_flight),
        embedding_output_bytes=math.ceil(embedding_mask * in_flight + (output_inputs if has_output else 0)),
        weight_copy_bytes=math.ceil(_WEIGHT_COPY * psi * in_flight) if req.autocast else 0,
        logits_kept_bytes=math.ceil(kept),
        logits_backward_bytes=math.ceil(backward),
        attention=req.attention,
        dropout=req.dropout,
        autocast=req.autocast,
        checkpointing=req.activation_checkpointing,
        sequence_parallel=req.sequence_parallel,
    )


def _assumptions(
    req: TrainingSizingRequest, bpp: BytesPerParam, detail: ActivationDetail | None
) -> list[str]:
    weights = "fp32 weights under autocast" if req.autocast else f"{req.precision} weights"
    notes = [
        f"model states: {bpp.params} + {bpp.grads} + {bpp.optimizer} bytes per parameter ({weights}, "
        f"{req.optimizer}), ZeRO stage {req.zero} over dp={req.dp} (Rajbhandari et al. 2020)"
    ]
    if detail is None:
        notes.append(
            "no activation inputs (seq_len, micro_batch, hidden_size, layers): activations not counted"
        )
    else:
        notes.extend(_activation_assumptions(req, detail))
    notes.append(
        f"overhead: {PROCESS_OVERHEAD_BYTES / GIB:g} GiB per process (CUDA context, cuBLAS and NCCL "
        "workspaces, allocator)"
    )
    notes.append(f"headroom: {req.headroom:.0%} of GPU memory left free for allocator fragmentation")
    return notes


def _activation_assumptions(req: TrainingSizingRequest, detail: ActivationDetail) -> list[str]:
    if req.activation_checkpointing:
        notes = [
            "full activation checkpointing: each layer keeps its input only; the layer recomputed in "
            "the backward pass is not counted"
        ]
    elif req.attention == "flash":
        notes = [
            "attention flash: a fused kernel (FlashAttention, memory-efficient or cuDNN) keeps nothing "
            "of size seq_len^2 (Dao et al. 2022)"
        ]
    else:
        kept = "softmax output, dropout mask and output" if req.dropout else "softmax output"
        notes = [
            f"attention math: PyTorch's math attention keeps the seq_len^2 scores of every head in fp32 "
            f"({kept}) and fp32 copies of Q, K, V"
        ]
    notes.append("dropout: masks kept, 1 byte per element" if req.dropout else "no dropout: no masks kept")
    if req.autocast:
        notes.append(
            "autocast: fp32 residual stream and layer norms; 16-bit weight copies held until the backward"
        )
    if req.vocab_size is None:
        notes.append("no vocabulary size: logits not counted (give vocab_size)")
    elif detail.logits_kept_bytes:
        notes.append(
            "logits: loss in fp32 over micro_batch x seq_len x vocab_size; the log-probabilities are kept "
            "and the backward pass starts with two fp32 gradients of that size"
        )
    if req.pp > 1:
        notes.append(
            f"pipeline 1F1B: the first stage holds {req.pp} micro-batches, the last one the logits; "
            f"sized: the {detail.stage} stage"
        )
    return notes


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
    """The node type that carries the run for the least on-demand $/h in all (then fewest nodes, then
    name), with its node count; None if no node type fits. A run that spans several nodes only goes on
    node types with an RDMA fabric between them (EFA, InfiniBand, RoCE): data-parallel gradients over
    plain Ethernet leave the GPUs waiting, the field report's first complaint. What that rule left out,
    cheaper, is named in the plan."""
    usable: list[tuple[int, NodeType]] = []
    without_fabric: list[tuple[int, NodeType]] = []
    for node in node_types:
        if not node_fits(result, node, headroom=headroom):
            continue
        count = nodes_needed(result, node)
        if count > 1 and node.network.fabric not in RDMA_FABRICS:
            without_fabric.append((count, node))
        else:
            usable.append((count, node))
    if not usable:
        return None

    def cost(choice: tuple[int, NodeType]) -> float:
        return choice[0] * choice[1].price.on_demand_usd_per_hour

    nodes, best = min(usable, key=lambda c: (cost(c), c[0], c[1].name))
    total = nodes * best.gpu_count
    left_out = [
        f"{node.name}: {count} nodes for ${cost((count, node)):,.2f}/h, but its network is "
        f"{node.network.fabric} (no RDMA between nodes)"
        for count, node in sorted(without_fabric, key=cost)
        if cost((count, node)) < cost((nodes, best))
    ]
    return NodePlan(
        node_type=best.name,
        gpus_per_node=best.gpu_count,
        nodes=nodes,
        total_gpus=total,
        idle_gpus=total - result.world_size,
        usd_per_hour=round(cost((nodes, best)), 4),
        left_out=left_out,
    )


def _usable_bytes(gpu_memory_gib: float, headroom: float) -> int:
    return math.floor(gpu_memory_gib * GIB * (1 - headroom))


def _unsharded(per_gpu: PerGpuBytes) -> int:
    """Bytes per GPU that no ZeRO stage divides by dp."""
    return per_gpu.activations + per_gpu.logits + per_gpu.overhead


def _value_bytes(precision: Precision) -> int:
    return _FP32 if precision == "fp32" else 2


def _residual_bytes(precision: Precision, autocast: bool) -> int:
    return _FP32 if autocast else _value_bytes(precision)


def _min_dp(psi: float, bpp: BytesPerParam, zero: int, unsharded: int, usable: int) -> int | None:
    """Smallest dp whose per-GPU total A + B/dp fits `usable`, where B is what ZeRO shards over dp."""

    def total(dp: int) -> int:
        return unsharded + sum(math.ceil(x) for x in model_state_bytes(psi, bpp, zero, dp))

    sharded = _sharded_at_dp1(psi, bpp, zero)
    fixed = unsharded + sum(model_state_bytes(psi, bpp, zero, 1)) - sharded
    if total(1) <= usable:
        return 1
    if sharded == 0 or fixed >= usable:
        return None
    dp = max(1, math.ceil(sharded / (usable - fixed)))
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
