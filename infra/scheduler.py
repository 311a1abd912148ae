"""The Slurm layout derived from the spec: partitions from training pools, accounts from teams, QoS.

Inference pools never become partitions: training jobs cannot land on inference nodes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infra.resolve import ResolvedPlatform

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
class Account:
    name: str
    gpu_limit: int
    fairshare: int
    users: list[str]


def gres_type(model: str) -> str:
    return model.lower().replace("-", "_") or "gpu"


def partitions(platform: ResolvedPlatform) -> list[Partition]:
    result = []
    for index, pool in enumerate(platform.pools_with_role("train")):
        spot = pool.spec.capacity == "spot"
        result.append(
            Partition(
                name=pool.name.replace("-", "_"),
                pool=pool.name,
                nodes=pool.node_names(),
                gpus_per_node=pool.gpus_per_node,
                gpu_type=gres_type(pool.node_type.gpu.model if pool.node_type.gpu else ""),
                priority_tier=1 if spot else 10,
                preempt_mode=platform.spec.scheduler.spot_preempt_mode.upper() if spot else "OFF",
                default=index == 0,
                spot=spot,
                allowed_qos=["spot"] if spot else ["normal", "high", "spot"],
            )
        )
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


def slurm_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    return {
        "slurm_cluster_name": platform.name.replace("-", "_"),
        "slurm_partitions": [asdict(p) for p in partitions(platform)],
        "slurm_accounts": [asdict(a) for a in accounts(platform)],
        "slurm_qos": qos(platform),
        "slurm_default_time_limit": platform.spec.scheduler.default_time_limit,
    }
