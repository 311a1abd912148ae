"""Which training pools a team's jobs try first, by its placement preference (scheduler.teams[].placement):
`performance` the fastest GPUs (dense BF16 TFLOPS, then memory bandwidth, from the catalog's gpu_models),
`cost` the cheapest step (the GPU-hour's price, spot where the pool is spot, times the step time
`gpuplat size --stack` compares pools by: usd_per_gpu_step), or a list of pool names
(those first, in the list's order, then the rest in the stack's). Either way on-demand and reserved pools
come before spot ones, as every team's order does: a preference never puts a team's jobs on preemptible
nodes while others are free. A team without a preference keeps the stack's order."""

from __future__ import annotations

from infra.data.load import catalog
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.spec.models import PlacementPreference


def gpu_hour_usd(pool: ResolvedPool) -> float:
    return pool.node_usd_per_hour / max(pool.gpus_per_node, 1)


def speed_key(pool: ResolvedPool) -> tuple[float, float]:
    """Larger is faster: (dense BF16 TFLOPS, memory bandwidth); a GPU without a figure counts 0."""
    gpu = pool.node_type.gpu
    figures = catalog().gpu_figures(gpu.model) if gpu else None
    if figures is None:
        return (0.0, 0.0)
    return (figures.bf16_dense_tflops or 0.0, figures.memory_bandwidth_gbps)


def _performance_key(pool: ResolvedPool) -> tuple[float, float, float]:
    tflops, bandwidth = speed_key(pool)
    return (-tflops, -bandwidth, gpu_hour_usd(pool))


def usd_per_gpu_step(pool: ResolvedPool) -> float:
    """What one GPU of the pool costs per unit of work: the GPU-hour's price over its dense BF16 TFLOPS
    (a compute-bound step's time goes as 1 / TFLOPS; infra.training.pool_fit scales it by the nodes a run
    takes). A GPU without a figure costs infinitely much per step (never first on cost)."""
    tflops = speed_key(pool)[0]
    return gpu_hour_usd(pool) / tflops if tflops else float("inf")


def _cost_key(pool: ResolvedPool) -> tuple[float, float]:
    return (usd_per_gpu_step(pool), -speed_key(pool)[0])


def training_order(
    platform: ResolvedPlatform, preference: PlacementPreference | None = None
) -> list[ResolvedPool]:
    """The training pools in the order jobs with `preference` try them (None: the stack's order)."""
    pools = platform.pools_with_role("train")
    if preference == "performance":
        pools = sorted(pools, key=_performance_key)
    elif preference == "cost":
        pools = sorted(pools, key=_cost_key)
    elif isinstance(preference, list):
        rank = {name: index for index, name in enumerate(preference)}
        pools = sorted(pools, key=lambda p: rank.get(p.name, len(rank)))
    return sorted(pools, key=lambda p: p.spec.capacity == "spot")


def unknown_pools(platform: ResolvedPlatform, preference: PlacementPreference | None) -> list[str]:
    """The names a list preference gives that are no training pool of the stack."""
    if not isinstance(preference, list):
        return []
    training = {p.name for p in platform.pools_with_role("train")}
    return [name for name in preference if name not in training]
