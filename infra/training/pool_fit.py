"""`gpuplat size --stack`: a sized training run against the stack's own training pools: whether it fits
each pool's GPUs, how many of its nodes it takes, and how the pools compare per step.

The step-time ratio assumes a compute-bound step: time in proportion to 1 / dense BF16 TFLOPS (the
catalog's gpu_models). Communication and input pipelines shift it; the order it gives holds while the
GPUs, not the network or the data, set the pace."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infra.data.models import GIB
from infra.platform.resolve import ResolvedPlatform
from infra.scheduling.placement import speed_key, usd_per_gpu_step
from infra.training.sizing import SizingResult, node_fits, nodes_needed


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
    step_time_ratio: float | None
    """the pool's step time over the fastest fitting pool's (1.0: the fastest)"""
    usd_per_step_ratio: float | None
    """the pool's $ per step over the cheapest fitting pool's (1.0: the cheapest)"""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def pool_fits(platform: ResolvedPlatform, result: SizingResult) -> list[PoolFit]:
    rows: list[dict[str, Any]] = []
    pools = {p.name: p for p in platform.pools_with_role("train")}
    for pool in pools.values():
        node = pool.node_type
        gpu = node.gpu.model if node.gpu else "-"
        tflops = speed_key(pool)[0] or None
        why_not = None
        nodes = None
        if not node_fits(result, node):
            why_not = (
                f"{node.gpu_count} GPUs per node, fewer than tp={result.tp}"
                if node.gpu_count < result.tp
                else f"{node.gpu_memory_gib:.1f} GiB per GPU, the run needs "
                f"{result.per_gpu_bytes.total / GIB:.1f} GiB per GPU"
            )
        else:
            nodes = nodes_needed(result, node)
            if nodes > pool.spec.max_nodes:
                why_not = f"needs {nodes} nodes, the pool has at most {pool.spec.max_nodes}"
        rows.append(
            {
                "pool": pool.name,
                "gpu": gpu,
                "gpu_memory_gib": round(node.gpu_memory_gib, 1),
                "fits": why_not is None,
                "why_not": why_not,
                "nodes": nodes,
                "pool_max_nodes": pool.spec.max_nodes,
                "usd_per_hour": round(nodes * pool.node_usd_per_hour, 4) if nodes else None,
                "bf16_dense_tflops": tflops,
            }
        )
    fitting = [r for r in rows if r["fits"] and r["bf16_dense_tflops"]]
    fastest = max((r["bf16_dense_tflops"] for r in fitting), default=None)
    step_ratio = {r["pool"]: fastest / r["bf16_dense_tflops"] for r in fitting} if fastest else {}
    # $ per step: the run's GPUs times what one costs per step there (the cost-first placement's key).
    per_step = {
        r["pool"]: r["nodes"] * pools[r["pool"]].gpus_per_node * usd_per_gpu_step(pools[r["pool"]])
        for r in fitting
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
