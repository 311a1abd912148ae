"""Predict how data-parallel training scales: the communication share of a step and the speedup from 8 to 32
GPUs, from the gradient size, the all-reduce bus bandwidth (measured or gated) and the compute per step.

The model:
- each step all-reduces every gradient once with a ring. nccl-tests defines bus bandwidth so that
  t = (S / busbw) * 2(n-1)/n for an all-reduce of S bytes over n ranks (doc/PERFORMANCE.md, "AllReduce",
  github.com/NVIDIA/nccl-tests v2.19.6); busbw in GB/s = 10**9 bytes/s (src/all_reduce.cu AllReduceGetBw);
- weak scaling: every GPU keeps its micro-batch, so compute per step is the same at any GPU count and
  throughput is GPUs / step time;
- `overlap` is the fraction of the all-reduce that runs behind the backward pass; no more than the compute
  time can hide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GB = 10**9
WARN_BELOW = 3.0  # the rule of thumb of issue 14: 8 -> 32 GPUs should speed up more than 3x
FABRIC_BELOW = 2.0  # under 2x the network, not the model, sets the pace

ScalingFlag = Literal["ok", "warn", "fabric"]


@dataclass(frozen=True)
class StepPrediction:
    gpus: int
    busbw_gbps: float
    allreduce_seconds: float
    exposed_seconds: float
    step_seconds: float

    @property
    def comm_share(self) -> float:
        return self.exposed_seconds / self.step_seconds


@dataclass(frozen=True)
class ScalingPrediction:
    gradient_bytes: float
    base: StepPrediction
    scaled: StepPrediction
    speedup: float
    flag: ScalingFlag
    message: str

    @property
    def ideal_speedup(self) -> float:
        return self.scaled.gpus / self.base.gpus


def ring_allreduce_seconds(size_bytes: float, gpus: int, busbw_gbps: float) -> float:
    return size_bytes * 2 * (gpus - 1) / gpus / (busbw_gbps * GB)


def predict_step(
    gradient_bytes: float, gpus: int, busbw_gbps: float, compute_seconds: float, overlap: float
) -> StepPrediction:
    allreduce = ring_allreduce_seconds(gradient_bytes, gpus, busbw_gbps)
    exposed = allreduce - min(overlap * allreduce, compute_seconds)
    return StepPrediction(gpus, busbw_gbps, allreduce, exposed, compute_seconds + exposed)


def predict_scaling(
    *,
    params: float,
    bytes_per_grad: float,
    compute_seconds: float,
    base_busbw_gbps: float,
    scaled_busbw_gbps: float,
    overlap: float = 0.0,
    base_gpus: int = 8,
    scaled_gpus: int = 32,
) -> ScalingPrediction:
    """base_busbw_gbps: all-reduce busbw at base_gpus (8: one node); scaled_busbw_gbps: across nodes."""
    _check_inputs(
        params=params,
        bytes_per_grad=bytes_per_grad,
        compute_seconds=compute_seconds,
        base_busbw_gbps=base_busbw_gbps,
        scaled_busbw_gbps=scaled_busbw_gbps,
    )
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be between 0 and 1 (got {overlap})")
    if not 1 <= base_gpus < scaled_gpus:
        raise ValueError(
            f"base_gpus must be at least 1 and below scaled_gpus (got {base_gpus}, {scaled_gpus})"
        )
    gradient_bytes = params * bytes_per_grad
    base = predict_step(gradient_bytes, base_gpus, base_busbw_gbps, compute_seconds, overlap)
    scaled = predict_step(gradient_bytes, scaled_gpus, scaled_busbw_gbps, compute_seconds, overlap)
    speedup = (scaled_gpus / base_gpus) * base.step_seconds / scaled.step_seconds
    flag, message = _judge(speedup, base, scaled)
    return ScalingPrediction(gradient_bytes, base, scaled, speedup, flag, message)


def _check_inputs(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive (got {value})")


def _judge(speedup: float, base: StepPrediction, scaled: StepPrediction) -> tuple[ScalingFlag, str]:
    where = (
        f"{base.gpus} -> {scaled.gpus} GPUs: {speedup:.2f}x predicted; communication is "
        f"{scaled.comm_share:.0%} of a step at {scaled.gpus} GPUs ({scaled.busbw_gbps:g} GB/s busbw)"
    )
    if speedup < FABRIC_BELOW:
        return (
            "fabric",
            f"{where}: under {FABRIC_BELOW:g}x, the fabric sets the pace (check transport and busbw)",
        )
    if speedup < WARN_BELOW:
        return "warn", f"{where}: under {WARN_BELOW:g}x"
    return "ok", where
