"""`gpuplat size --stack`: a sized training run against the stack's own training pools: whether it fits
each pool's GPUs, how many of its nodes it takes, and how the pools compare per step.

The step time is infra.training.step_time's: compute at the precision's throughput, the memory-bound
optimizer step at the GPU's memory bandwidth, and the gradient and tensor-parallel traffic over the
links the run uses; with the sequence length and micro-batch given, in seconds, else the compute ratio
alone. On a spot pool the $ per step includes what interruptions cost (SpotAssumption)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infra.data.load import catalog
from infra.data.models import GIB
from infra.platform.resolve import ResolvedPlatform
from infra.training.sizing import SizingResult, node_fits, nodes_needed
from infra.training.step_time import Shape, StepTime, spot_overhead, step_time


@dataclass(frozen=True)
class SpotAssumption:
    """What a spot pool's interruptions cost: how often, and how long until the job runs again. AWS
    publishes only coarse interruption-frequency bands (the Spot Instance Advisor): the caller's figures."""

    interruptions_per_day: float = 1.0
    restart_minutes: float = 10.0


@dataclass(frozen=True)
class PoolFit:
    pool: str
    gpu: str
    gpu_memory_gib: float
    fits: bool
    why_not: str | None
    nodes: int | None
    pool_max_nodes: int
    usd_per_hour: float | None
    bf16_dense_tflops: float | None
    precision_tflops: float | None
    step_time_s: float | None
    """seconds per step where the sequence length and micro-batch are known, else None"""
    spot_overhead: float | None
    """the fraction of a spot pool's wall time lost to interruptions (None: not spot)"""
    step_time_ratio: float | None
    """the pool's step time over the fastest fitting pool's (1.0: the fastest)"""
    usd_per_step_ratio: float | None
    """the pool's $ per step over the cheapest fitting pool's (1.0: the cheapest)"""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _why_not(result: SizingResult, node_gpus: int, memory_gib: float) -> str:
    if node_gpus < result.tp:
        return f"{node_gpus} GPUs per node, fewer than tp={result.tp}"
    return f"{memory_gib:.1f} GiB per GPU, the run needs {result.per_gpu_bytes.total / GIB:.1f} GiB per GPU"


def pool_fits(
    platform: ResolvedPlatform,
    result: SizingResult,
    shape: Shape | None = None,
    spot: SpotAssumption | None = None,
) -> list[PoolFit]:
    shape = shape or Shape()
    spot = spot or SpotAssumption()
    rows: list[dict[str, Any]] = []
    times: dict[str, StepTime] = {}
    for pool in platform.pools_with_role("train"):
        node = pool.node_type
        why_not = None
        nodes = None
        if not node_fits(result, node):
            why_not = _why_not(result, node.gpu_count, node.gpu_memory_gib)
        else:
            nodes = nodes_needed(result, node)
            if nodes > pool.spec.max_nodes:
                why_not = f"needs {nodes} nodes, the pool has at most {pool.spec.max_nodes}"
        timed = step_time(result, shape, node) if why_not is None else None
        if timed is not None:
            times[pool.name] = timed
        overhead = None
        if timed is not None and pool.spec.capacity == "spot":
            checkpoint_steps = platform.spec.training.checkpoint_every_steps
            seconds = timed.total_s if timed.absolute else 0.0
            overhead = spot_overhead(
                seconds, checkpoint_steps, spot.interruptions_per_day, spot.restart_minutes
            )
        figures_tflops = timed.throughput_tflops if timed else None
        rows.append(
            {
                "pool": pool.name,
                "gpu": node.gpu.model if node.gpu else "-",
                "gpu_memory_gib": round(node.gpu_memory_gib, 1),
                "fits": why_not is None,
                "why_not": why_not,
                "nodes": nodes,
                "pool_max_nodes": pool.spec.max_nodes,
                "usd_per_hour": round(nodes * pool.node_usd_per_hour, 4) if nodes else None,
                "bf16_dense_tflops": _bf16(node.gpu.model if node.gpu else None),
                "precision_tflops": figures_tflops,
                "step_time_s": round(timed.total_s, 4) if timed and timed.absolute else None,
                "spot_overhead": round(overhead, 4) if overhead is not None else None,
            }
        )
    fastest = min((t.total_s for t in times.values()), default=None)
    step_ratio = {name: t.total_s / fastest for name, t in times.items()} if fastest else {}
    per_step = {
        r["pool"]: r["usd_per_hour"] * times[r["pool"]].total_s / (1 - (r["spot_overhead"] or 0.0))
        for r in rows
        if r["pool"] in times
    }
    cheapest = min(per_step.values(), default=None)
    return [
        PoolFit(
            **r,
            step_time_ratio=round(step_ratio[r["pool"]], 2) if r["pool"] in step_ratio else None,
            usd_per_step_ratio=round(per_step[r["pool"]] / cheapest, 2)
            if r["pool"] in per_step and cheapest
            else None,
        )
        for r in rows
    ]


def _bf16(model: str | None) -> float | None:
    figures = catalog().gpu_figures(model) if model else None
    return figures.bf16_dense_tflops if figures else None
