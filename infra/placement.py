"""Which training pools a team's jobs try first, by its placement preference (scheduler.teams[].placement):
`performance` the fastest GPUs (dense BF16 TFLOPS, then memory bandwidth, from the catalog's gpu_models),
`cost` the cheapest GPU-hour (the pool's own price: spot where the pool is spot). Either way on-demand
and reserved pools come before spot ones, as every team's order does: a preference never puts a team's
jobs on preemptible nodes while others are free. A team without a preference keeps the stack's order."""

from __future__ import annotations

from infra.data.load import catalog
from infra.resolve import ResolvedPlatform, ResolvedPool
from infra.spec.models import Team


def gpu_hour_usd(pool: ResolvedPool) -> float:
    return pool.node_usd_per_hour / max(pool.gpus_per_node, 1)


def speed_key(pool: ResolvedPool) -> tuple[float, float]:
    """Larger is faster: (dense BF16 TFLOPS, memory bandwidth); a GPU without a figure counts 0."""
    gpu = pool.node_type.gpu
    figures = catalog().gpu_figures(gpu.model) if gpu else None
    if figures is None:
        return (0.0, 0.0)
    return (figures.bf16_dense_tflops or 0.0, figures.memory_bandwidth_gbps)


def training_order(platform: ResolvedPlatform, team: Team | None = None) -> list[ResolvedPool]:
    """The training pools in the order `team`'s jobs try them (None: the stack's order)."""
    pools = platform.pools_with_role("train")
    preference = team.placement if team is not None else None
    if preference == "performance":
        pools = sorted(pools, key=lambda p: (-speed_key(p)[0], -speed_key(p)[1], gpu_hour_usd(p)))
    elif preference == "cost":
        pools = sorted(pools, key=lambda p: (gpu_hour_usd(p), -speed_key(p)[0]))
    return sorted(pools, key=lambda p: p.spec.capacity == "spot")
