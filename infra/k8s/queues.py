"""Kueue from the spec: a flavor per training pool, a ClusterQueue per team in one cohort, a LocalQueue
in each team namespace, priorities from the Slurm QoS levels (API kueue.x-k8s.io/v1beta2, Kueue 0.19).

Quota semantics differ from Slurm's: `gpu_quota` is a cap (GrpTRES), Kueue's nominalQuota a guarantee
that other queues may borrow while unused, and Kueue limits each flavor on its own (nominal +
borrowingLimit), never a queue's sum over flavors. So the cap is split across the flavors, in the order
a queue tries them (on-demand first, spot last): each flavor takes as much of what is left of the cap
as its pool has GPUs, so a team's reach summed over flavors is its cap and Kueue never admits past it
(the team namespace's ResourceQuota, a backstop, then never refuses a pod of an admitted workload).
Within a flavor the teams' nominal quotas split the pool's GPUs by fair-share weight, never past a
team's reach there; what no team can take is the cohort's own quota, lent to all.

Only GPUs are covered: Kueue runs with quotaCheckStrategy IgnoreUndeclared (infra.k8s.operators), so
CPU and memory requests are left to the node autoscaler and the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.k8s.objects import (
    GPU_RESOURCE,
    Manifest,
    k8s_object,
    node_labels,
    team_namespace,
    tolerations,
)
from infra.k8s.operators import DEFAULT_LOCAL_QUEUE
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.scheduling.placement import training_order
from infra.scheduling.slurm import QOS
from infra.spec.models import Team

KUEUE_API = "kueue.x-k8s.io/v1beta2"
# A job in a team namespace without a kueue.x-k8s.io/queue-name label goes to this LocalQueue.
LOCAL_QUEUE = DEFAULT_LOCAL_QUEUE
# Network topology labels EKS sets on instance types with a known topology (network-node-layer-1 the
# broadest): https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html
AWS_TOPOLOGY_LEVELS = (
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
    "kubernetes.io/hostname",
)
# A pod template's topology request (apis/kueue/v1beta2/topology_types.go, v0.19.2): all pods in one
# domain of that level if they fit, else the next level up, else spread.
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"


def cohort_name(platform: ResolvedPlatform) -> str:
    return platform.name


def topology_name(platform: ResolvedPlatform) -> str:
    return f"{platform.name}-network"


def training_flavors(platform: ResolvedPlatform) -> list[ResolvedPool]:
    """Training pools in the stack's order: on-demand (and reserved) first, spot last. A team with a
    placement preference tries them in its own order (infra.scheduling.placement)."""
    return training_order(platform)


def uses_topology(platform: ResolvedPlatform, pool: ResolvedPool) -> bool:
    """Topology-aware scheduling on EKS EFA pools of a fixed size. Kueue places a topology request only
    on nodes that exist and are ready, so on a pool that scales out from fewer nodes it would never find
    room, create no pod, and the autoscaler would never add a node: such pools' flavors have no topology
    (their jobs are admitted on quota and spread as the scheduler places them)."""
    k8s = platform.spec.kubernetes
    fixed = pool.spec.min_nodes == pool.spec.max_nodes
    return k8s is not None and k8s.distribution == "eks" and platform.uses_efa(pool) and fixed


def narrowest_network_level() -> str:
    """The topology level a multi-node job prefers: the narrowest network layer (not a single host)."""
    return AWS_TOPOLOGY_LEVELS[-2]


@dataclass(frozen=True)
class FlavorQuota:
    team: str
    flavor: str
    nominal: int
    borrowing_limit: int


@dataclass(frozen=True)
class QuotaPlan:
    teams: list[FlavorQuota]
    cohort: dict[str, int]
    """Per flavor, the GPUs no team is guaranteed: the cohort's own nominal quota."""

    def nominal(self, team: str, flavor: str) -> int:
        return next(q.nominal for q in self.teams if q.team == team and q.flavor == flavor)


def _split(total: int, weights: dict[str, int], room: dict[str, int]) -> dict[str, int]:
    """`total` units by weight, no share above its `room` (water-filling: what a capped share cannot take
    is split again among the others), the last units by largest remainder (ties: by name)."""
    share = dict.fromkeys(weights, 0)
    left = total
    open_ = sorted(t for t in weights if room[t] > 0)
    while left > 0 and open_:
        weight_sum = sum(weights[t] for t in open_)
        exact = {t: left * weights[t] / weight_sum for t in open_}
        capped = [t for t in open_ if exact[t] >= room[t] - share[t]]
        if capped:
            for team in capped:
                left -= room[team] - share[team]
                share[team] = room[team]
            open_ = [t for t in open_ if t not in capped]
            continue
        for team in open_:
            share[team] += int(exact[team])
        rest = total - sum(share.values())
        for team in sorted(open_, key=lambda t: (-(exact[t] - int(exact[t])), t))[:rest]:
            share[team] += 1
        left = 0
    return share


def _budgets(team: Team) -> dict[bool, int] | None:
    """A team's cap by capacity class (spot or not) where it splits it itself, else None (one budget)."""
    if team.spot_gpu_quota is None:
        return None
    return {True: team.spot_gpu_quota, False: team.gpu_quota - team.spot_gpu_quota}


def _reach(platform: ResolvedPlatform, team: Team) -> dict[str, int]:
    """The GPUs of each flavor the team may hold: its cap (or its spot or on-demand part) taken flavor by
    flavor in the order the team tries them, each as far as the pool's GPUs go."""
    split = _budgets(team)
    reached = {True: 0, False: 0}
    reach: dict[str, int] = {}
    for pool in training_order(platform, team.placement):
        spot = pool.spec.capacity == "spot"
        left = (
            team.gpu_quota - reached[True] - reached[False] if split is None else split[spot] - reached[spot]
        )
        reach[pool.name] = min(left, pool.max_gpus)
        reached[spot] += reach[pool.name]
    return reach


def quota_plan(platform: ResolvedPlatform) -> QuotaPlan:
    teams = platform.spec.scheduler.teams
    weights = {t.name: t.fairshare for t in teams}
    reaches = {t.name: _reach(platform, t) for t in teams}
    quotas: list[FlavorQuota] = []
    cohort: dict[str, int] = {}
    for pool in training_flavors(platform):
        gpus = pool.max_gpus
        reach = {t: reaches[t][pool.name] for t in weights}
        share = _split(gpus, weights, reach)
        for team in weights:
            quotas.append(FlavorQuota(team, pool.name, share[team], reach[team] - share[team]))
        cohort[pool.name] = gpus - sum(share.values())
    return QuotaPlan(quotas, cohort)


def _flavor(platform: ResolvedPlatform, pool: ResolvedPool) -> Manifest:
    # Every label of the pool's nodes: Kueue matches a job's node selector only on keys some flavor
    # names (so `gpuplat/capacity: spot` picks the spot flavor) and adds the flavor's labels to the pods.
    spec: dict[str, object] = {"nodeLabels": node_labels(pool)}
    if pool.spec.taints:
        spec["tolerations"] = tolerations(pool)
    if uses_topology(platform, pool):
        spec["topologyName"] = topology_name(platform)
    return k8s_object(KUEUE_API, "ResourceFlavor", pool.name, labels=node_labels(pool), spec=spec)


def _resource_group(quotas: Mapping[str, tuple[int, int | None]]) -> dict[str, object]:
    flavors = []
    for flavor, (nominal, borrowing) in quotas.items():
        resource: dict[str, object] = {"name": GPU_RESOURCE, "nominalQuota": nominal}
        if borrowing is not None:
            resource["borrowingLimit"] = borrowing
        flavors.append({"name": flavor, "resources": [resource]})
    return {"coveredResources": [GPU_RESOURCE], "flavors": flavors}


def _cluster_queue(platform: ResolvedPlatform, team: Team, plan: QuotaPlan) -> Manifest:
    # The flavors in the order the team tries them (Kueue assigns the first that has room, and with
    # TryNextFlavor moves on rather than borrow or preempt there).
    planned = {q.flavor: (q.nominal, q.borrowing_limit) for q in plan.teams if q.team == team.name}
    quotas = {pool.name: planned[pool.name] for pool in training_order(platform, team.placement)}
    return k8s_object(
        KUEUE_API,
        "ClusterQueue",
        team.name,
        spec={
            "cohortName": cohort_name(platform),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team_namespace(team.name)}},
            "resourceGroups": [_resource_group(quotas)],
            "fairSharing": {"weight": team.fairshare},
            # Borrowed GPUs are taken back for the lender; within a team, higher priority goes first.
            # No borrowWithinCohort: Kueue's fair sharing (on, infra.k8s.operators) decides preemption
            # between queues, and the field "only works with Classical Preemption, not with Fair
            # Sharing" (apis/kueue/v1beta2/clusterqueue_types.go, BorrowWithinCohort, v0.19.2).
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            # Try the next flavor (spot) before borrowing on-demand GPUs from another team.
            "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
            "queueingStrategy": "BestEffortFIFO",
        },
    )


def _cohort(platform: ResolvedPlatform, plan: QuotaPlan) -> Manifest:
    spec: dict[str, object] = {}
    if any(plan.cohort.values()):
        spec["resourceGroups"] = [_resource_group({f: (n, None) for f, n in plan.cohort.items()})]
    return k8s_object(KUEUE_API, "Cohort", cohort_name(platform), spec=spec)


def _topology(platform: ResolvedPlatform) -> Manifest:
    levels = [{"nodeLabel": label} for label in AWS_TOPOLOGY_LEVELS]
    return k8s_object(KUEUE_API, "Topology", topology_name(platform), spec={"levels": levels})


def queue_objects(platform: ResolvedPlatform) -> list[Manifest]:
    plan = quota_plan(platform)
    teams = platform.spec.scheduler.teams
    objects: list[Manifest] = [
        k8s_object(KUEUE_API, "WorkloadPriorityClass", str(qos["name"]), value=qos["priority"]) for qos in QOS
    ]
    if any(uses_topology(platform, p) for p in training_flavors(platform)):
        objects.append(_topology(platform))
    objects += [_flavor(platform, pool) for pool in training_flavors(platform)]
    objects.append(_cohort(platform, plan))
    objects += [_cluster_queue(platform, t, plan) for t in teams]
    objects += [
        k8s_object(
            KUEUE_API, "LocalQueue", LOCAL_QUEUE, team_namespace(t.name), spec={"clusterQueue": t.name}
        )
        for t in teams
    ]
    return objects
