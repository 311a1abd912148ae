"""The Slurm layout derived from the spec: partitions from training pools, accounts from teams, QoS.

Inference pools never become partitions: training jobs cannot land on inference nodes.

Where the on-demand training pools hold GPUs of more than one type, one more partition spans them all
(PLACEMENT_PARTITION, the default): there the job_submit/lua plugin (roles/slurm_controller) gives each job
the GPU types in its team's placement order (infra.scheduling.placement), and a partition per job class does
so whatever the team (shared_partitions(), placement()).

On backend aws the training nodes are launched and terminated by Slurm's power saving
(https://slurm.schedmd.com/power_save.html): slurm.conf names every node a pool may ever have, with
State=CLOUD, before any of them exists. Their node lines therefore come from the GPU catalog
(cloud_nodes()), not from facts gathered on the nodes as on local and onprem.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra.data.packages import package_facts
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.scheduling.placement import training_order
from infra.spec.models import PlacementPreference
from infra.spec.names import PLACEMENT_PARTITION
from infra.spec.user_ids import user_uids

# QoS tiers: high and normal preempt spot. The preempt mode of every QoS is the spec's
# scheduler.spot_preempt_mode (see qos()), the same mode the spot partitions use.
QOS = (
    {"name": "high", "priority": 1000, "preempt": ["spot"]},
    {"name": "normal", "priority": 100, "preempt": ["spot"]},
    {"name": "spot", "priority": 10, "preempt": []},
)

# Seconds a preempted spot job keeps running after Slurm sends it SIGTERM (QoS GraceTime),
# so it can write a checkpoint before it is requeued or cancelled (then SIGKILL after
# KillWait). Sized for a checkpoint of a large model to shared storage.
SPOT_GRACE_TIME_S = 120

# Partitions of on-demand pools schedule before spot ones (PriorityTier 1), and take every QoS.
ON_DEMAND_PRIORITY_TIER = 10
ON_DEMAND_QOS = ("normal", "high", "spot")


@dataclass(frozen=True)
class Partition:
    name: str
    pool: str
    nodes: list[str]
    gpus_per_node: int
    gpu_type: str
    priority_tier: int
    preempt_mode: str
    default: bool
    spot: bool
    allowed_qos: list[str]


@dataclass(frozen=True)
class SharedPartition:
    """A partition over several on-demand training pools: where placement preferences choose the pool."""

    name: str
    pools: list[str]
    nodes: list[str]
    default: bool
    allowed_qos: list[str]
    priority_tier: int = ON_DEMAND_PRIORITY_TIER


@dataclass(frozen=True)
class CloudNodes:
    """The slurm.conf node lines of one training pool whose nodes Slurm powers up and down.

    `names` are every node the pool may have (ResolvedPool.node_names()); `static` are the first
    min_nodes of them, which are never suspended (SuspendExcNodes) and are powered up by a timer;
    `cloud` are the rest, launched on demand by the ResumeProgram and terminated by the
    SuspendProgram after SuspendTime idle.
    """

    pool: str
    names: list[str]
    static: list[str]
    cloud: list[str]
    cpus: int
    real_memory_mb: int
    gpu_type: str
    gpu_count: int
    gres: str
    feature: str


@dataclass(frozen=True)
class Account:
    name: str
    gpu_limit: int
    fairshare: int
    users: list[str]


def gres_type(model: str) -> str:
    return model.lower().replace("-", "_") or "gpu"


def pool_gres_type(pool: ResolvedPool) -> str:
    return gres_type(pool.node_type.gpu.model if pool.node_type.gpu else "")


def gpu_feature(kind: str) -> str:
    """The node feature of a GPU type (gres type): what `--constraint=gpu_h100` asks for."""
    return f"gpu_{kind}"


# RealMemory of a node that does not exist yet: the catalog's memory less what the kernel keeps.
# The OS reports less than the marketed GiB: the kernel's page array alone takes 1.5625 % of RAM
# (a 64-byte struct page per 4 KiB page), firmware, the kernel image and crashkernel take a few
# hundred MiB more (a p5.48xlarge, 2048 GiB, shows MemTotal 2015.5 GiB, 1.6 % less); on top of
# that the same 1 % headroom the facts-based node lines keep for the OS. slurmd sets a node whose
# memory is below RealMemory INVALID, and a RealMemory above what is there lets jobs ask for memory
# the node cannot give, so the margin errs on the low side: 3 % plus a fixed 512 MiB (small
# instances lose proportionally more to fixed reservations).
CLOUD_MEMORY_RESERVE_PERCENT = 3
CLOUD_MEMORY_RESERVE_MB = 512


def cloud_real_memory_mb(memory_gib: int) -> int:
    """RealMemory (MiB) for a node of `memory_gib` marketed GiB."""
    total = memory_gib * 1024
    return total - -(-total * CLOUD_MEMORY_RESERVE_PERCENT // 100) - CLOUD_MEMORY_RESERVE_MB


# Local nodes are containers that only `gpuplat scale` removes: Slurm never powers one down by itself.
LOCAL_NEVER_SUSPEND_S = 10 * 365 * 24 * 3600


def elastic_pools(platform: ResolvedPlatform) -> list[str]:
    return [p.name for p in platform.pools_with_role("train") if p.spec.min_nodes < p.spec.max_nodes]


def power_saving(platform: ResolvedPlatform) -> bool:
    """Slurm powers the training nodes up and down: on aws, where it launches and terminates them, and on
    local stacks with an elastic pool, where `gpuplat scale` starts and removes their containers."""
    return platform.spec.backend == "aws" or (
        platform.spec.backend == "local" and bool(elastic_pools(platform))
    )


def host_hardware() -> tuple[int, int]:
    """(CPUs, MemTotal MiB) of this machine: every local node is a container on it."""
    total_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return os.cpu_count() or 1, total_kib // 1024


def local_real_memory_mb(total_mb: int) -> int:
    """The margin the facts-based node lines keep (roles/slurm_common: 1 %, at least 512 MiB)."""
    return total_mb - max(-(-total_mb // 100), 512)


def cloud_nodes(platform: ResolvedPlatform) -> list[CloudNodes]:
    """Node lines of every training pool from the catalog; empty unless power saving is on."""
    if not power_saving(platform):
        return []
    local = platform.spec.backend == "local"
    cpus, memory_mb = host_hardware() if local else (0, 0)
    result = []
    for pool in platform.pools_with_role("train"):
        names = pool.node_names()
        gpu = pool.node_type.gpu
        kind = gres_type(gpu.model if gpu else "")
        static = names[: pool.spec.min_nodes]
        result.append(
            CloudNodes(
                pool=pool.name,
                names=names,
                static=static,
                cloud=names[len(static) :],
                cpus=cpus if local else pool.node_type.vcpus,
                real_memory_mb=local_real_memory_mb(memory_mb)
                if local
                else cloud_real_memory_mb(pool.node_type.memory_gib),
                gpu_type=kind,
                gpu_count=pool.gpus_per_node,
                gres=f"gpu:{kind}:{pool.gpus_per_node}",
                feature=f"pool_{pool.name},{gpu_feature(kind)}",
            )
        )
    return result


def controllers(platform: ResolvedPlatform) -> list[str]:
    """Slurm names of the slurmctld hosts, primary first: the controller pool's first node, and its
    second as the backup when scheduler.high_availability is set (the spec requires two nodes then).

    On local and onprem these are the inventory hosts of the controller pool; on aws the nodes'
    hostnames (the instances name themselves after their node name at boot).
    """
    names = platform.controller_pool.node_names()
    return names[: 2 if platform.spec.scheduler.high_availability else 1]


def _on_demand_training(platform: ResolvedPlatform) -> list[ResolvedPool]:
    return [p for p in platform.pools_with_role("train") if p.spec.capacity != "spot"]


def on_demand_gpu_types(platform: ResolvedPlatform) -> list[str]:
    return sorted({pool_gres_type(p) for p in _on_demand_training(platform)})


def heterogeneous(platform: ResolvedPlatform) -> bool:
    """The on-demand training pools hold more than one GPU type: there is a placement to choose."""
    return len(on_demand_gpu_types(platform)) > 1


def partitions(platform: ResolvedPlatform) -> list[Partition]:
    """One partition per training pool; the first is the default unless a shared one spans the pools."""
    shared_default = heterogeneous(platform)
    result = []
    for index, pool in enumerate(platform.pools_with_role("train")):
        spot = pool.spec.capacity == "spot"
        result.append(
            Partition(
                name=pool.name.replace("-", "_"),
                pool=pool.name,
                nodes=pool.node_names(),
                gpus_per_node=pool.gpus_per_node,
                gpu_type=pool_gres_type(pool),
                priority_tier=1 if spot else ON_DEMAND_PRIORITY_TIER,
                preempt_mode=platform.spec.scheduler.spot_preempt_mode.upper() if spot else "OFF",
                default=index == 0 and not shared_default,
                spot=spot,
                allowed_qos=["spot"] if spot else list(ON_DEMAND_QOS),
            )
        )
    return result


def shared_partitions(platform: ResolvedPlatform) -> list[SharedPartition]:
    """Where the on-demand training pools hold more than one GPU type: PLACEMENT_PARTITION (the default,
    each job in its team's order) and one partition per job class (each job in the class's order)."""
    if not heterogeneous(platform):
        return []
    pools = _on_demand_training(platform)
    names = [p.name for p in pools]
    nodes = [node for p in pools for node in p.node_names()]
    qos_names = list(ON_DEMAND_QOS)
    return [
        SharedPartition(PLACEMENT_PARTITION, names, nodes, True, qos_names),
        *(
            SharedPartition(c.name.replace("-", "_"), names, nodes, False, qos_names)
            for c in platform.spec.scheduler.job_classes
        ),
    ]


def default_partition(platform: ResolvedPlatform) -> str:
    """Where a job without -p goes: the shared partition over the on-demand pools, else the first pool's."""
    shared = shared_partitions(platform)
    return shared[0].name if shared else next(p.name for p in partitions(platform) if p.default)


def partition_names(platform: ResolvedPlatform) -> set[str]:
    return {p.name for p in partitions(platform)} | {p.name for p in shared_partitions(platform)}


def gpu_type_order(platform: ResolvedPlatform, preference: PlacementPreference | None) -> list[str]:
    """The GPU features of the on-demand training pools in the order jobs with `preference` try them."""
    order = [gpu_feature(pool_gres_type(p)) for p in training_order(platform, preference)]
    on_demand = {gpu_feature(pool_gres_type(p)) for p in _on_demand_training(platform)}
    return [
        feature
        for index, feature in enumerate(order)
        if feature in on_demand and feature not in order[:index]
    ]


def placement(platform: ResolvedPlatform) -> dict[str, dict[str, Any]]:
    """What roles/slurm_controller's job_submit.lua gives jobs, by partition: the GPU features jobs try in
    order (`accounts`: a team's own; `order`: everyone else's, the stack's order on PLACEMENT_PARTITION,
    a job class's on its own). Every job in these partitions gets one, so that all its nodes have one GPU
    type; what the plugin leaves to the job (a node list, brackets of its own, heterogeneous components
    among themselves) is in its header."""
    shared = shared_partitions(platform)
    if not shared:
        return {}
    teams = {
        t.name: gpu_type_order(platform, t.placement) for t in platform.spec.scheduler.teams if t.placement
    }
    result: dict[str, dict[str, Any]] = {
        PLACEMENT_PARTITION: {"accounts": teams, "order": gpu_type_order(platform, None)}
    }
    for job_class, partition in zip(platform.spec.scheduler.job_classes, shared[1:], strict=True):
        result[partition.name] = {"accounts": {}, "order": gpu_type_order(platform, job_class.placement)}
    return result


def qos(platform: ResolvedPlatform) -> list[dict[str, Any]]:
    """QoS with the spec's preempt mode and the spot grace period.

    Only the spot QoS is ever preempted; the others carry the same mode so that no QoS
    disagrees with the spot partitions (slurm_common checks that they agree).
    """
    mode = platform.spec.scheduler.spot_preempt_mode
    return [
        {**q, "preempt_mode": mode, "grace_time": SPOT_GRACE_TIME_S if q["name"] == "spot" else 0}
        for q in QOS
    ]


def accounts(platform: ResolvedPlatform) -> list[Account]:
    return [Account(t.name, t.gpu_quota, t.fairshare, list(t.users)) for t in platform.spec.scheduler.teams]


def mpi_default(platform: ResolvedPlatform) -> str | None:
    """Slurm's MpiDefault for the nodes' OS release: PMIx where the release's Slurm ships the mpi/pmix
    plugin, else PMI-2 (infra/data/packages.yaml, releases[].slurm.mpi_plugins). None: no facts for the
    release (the role keeps its own default)."""
    release = platform.software.os_release
    if release is None:
        return None
    slurm = package_facts().release(release).slurm
    return slurm.mpi_default if slurm is not None else None


def slurm_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    mpi = mpi_default(platform)
    return {
        **({"slurm_common_mpi_default": mpi} if mpi is not None else {}),
        "slurm_cluster_name": platform.name.replace("-", "_"),
        "slurm_partitions": [asdict(p) for p in partitions(platform)],
        "slurm_shared_partitions": [asdict(p) for p in shared_partitions(platform)],
        "slurm_placement": placement(platform),
        "slurm_accounts": [asdict(a) for a in accounts(platform)],
        "slurm_common_user_ids": user_uids(platform.spec.scheduler),
        "slurm_qos": qos(platform),
        "slurm_default_time_limit": platform.spec.scheduler.default_time_limit,
        "slurm_controllers": controllers(platform),
        "slurm_high_availability": platform.spec.scheduler.high_availability,
        "slurm_power_saving": power_saving(platform),
        "slurm_common_resume_timeout": platform.spec.scheduler.resume_timeout_s,
        "slurm_cloud_nodes": [asdict(n) for n in cloud_nodes(platform)],
        "slurm_suspend_time": (
            platform.spec.scheduler.scale_down_idle_s
            if platform.spec.backend == "aws"
            else LOCAL_NEVER_SUSPEND_S
        ),
    }
