"""Kueue from the spec: a flavor per training pool, a ClusterQueue per team in one cohort, a LocalQueue
in each team namespace, priorities from the Slurm QoS levels (API kueue.x-k8s.io/v1beta2, Kueue 0.19).

Quota semantics differ from Slurm's: `gpu_quota` is a cap (GrpTRES), Kueue's nominalQuota a guarantee
that other queues may borrow while unused, and Kueue limits each flavor on its own (nominal +
borrowingLimit), never a queue's sum over flavors. So each GPU flavor may reach its whole pool (or the
team's spot or on-demand part where it splits its cap), and the cap across flavors is a quota-only
resource: Kueue's resource transformation (Configuration `resources.transformations`, infra.k8s.operators)
adds TEAM_GPU_RESOURCE, one per GPU requested, to every workload, and a second resource group covers it
with one flavor that selects no nodes, nominal the cap, borrowing 0 (Kueue documents this pattern:
site/content/en/docs/concepts/cluster_queue.md and the ResourceTransformation type,
apis/config/v1beta2/configuration_types.go:597-632, v0.19.2). A queue whose flavors cannot together take
more than its cap gets no such group. Guarantees: the teams' nominal quotas split each pool's GPUs by
fair-share weight, never past the part of the cap a team takes there in the order it tries the pools (so
a team's guarantees add up to at most its cap); what no team is guaranteed is the cohort's own quota.

Topology-aware scheduling is decided per queue, all or nothing, because Kueue (v0.19.2) matches a pod set
and a flavor so (pkg/scheduler/flavorassigner/tas_flavorassigner.go:166-227): a pod set without a
topology request never fits a flavor with a topologyName ("supports only TopologyAwareScheduling"), one
with a request never fits a GPU flavor without one, and a request is implied only on a ClusterQueue
whose every flavor, in every resource group, has a topology (isTASOnly, pkg/cache/scheduler/
clusterqueue.go:741-750). So a queue uses topology only where every pool it lists supports it and it
needs no cap group (whose quota-only flavor has no topology); a flavor, shared by the queues that list
it, has a topology only where all of them do.

Only GPUs are covered: Kueue runs with quotaCheckStrategy IgnoreUndeclared (infra.k8s.operators), so
CPU and memory requests are left to the node autoscaler and the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.k8s.objects import (
    GPU_RESOURCE,
    TEAM_GPU_RESOURCE,
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
# Autoscaled pools' flavors are admitted through a ProvisioningRequest (Kueue's built-in admission check,
# GA since v0.14: site/content/en/docs/concepts/admission_check/provisioning_request.md at v0.19.2): Kueue
# reserves the quota, asks the cluster autoscaler for room for every pod of the workload at once, and
# admits (creates pods) only when it answers Provisioned. The class scales up for the whole request
# (cluster-autoscaler FAQ, "Supported ProvisioningClasses", 1.34.5); on AWS the node group's
# AtomicIncreaseSize is not implemented (cloudprovider/aws/aws_cloud_provider.go:287-290), so the scale-up
# is one request for all the nodes, not a guarantee EC2 delivers them all: waitForPodsReady still bounds
# a partial delivery. A failed request is retried with back-off (retryStrategy's defaults).
PROVISIONING_CHECK = "autoscaled-capacity"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
PROVISIONING_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
# The flavor that provides the quota-only TEAM_GPU_RESOURCE: it selects no nodes.
TEAM_CAP_FLAVOR = "team-gpu-cap"
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


def provisioned_flavors(platform: ResolvedPlatform) -> list[str]:
    """The training pools that scale (min < max) where the cluster autoscaler runs: their workloads wait
    for a ProvisioningRequest."""
    k8s = platform.spec.kubernetes
    if k8s is None or k8s.scaler != "cluster-autoscaler":
        return []
    return [p.name for p in training_flavors(platform) if p.spec.min_nodes < p.spec.max_nodes]


def _provisioning_objects() -> list[Manifest]:
    config = k8s_object(
        KUEUE_API,
        "ProvisioningRequestConfig",
        PROVISIONING_CHECK,
        spec={"provisioningClassName": PROVISIONING_CLASS, "managedResources": [GPU_RESOURCE]},
    )
    check = k8s_object(
        KUEUE_API,
        "AdmissionCheck",
        PROVISIONING_CHECK,
        spec={
            "controllerName": PROVISIONING_CONTROLLER,
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "ProvisioningRequestConfig",
                "name": PROVISIONING_CHECK,
            },
        },
    )
    return [config, check]


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


def flavor_limits(platform: ResolvedPlatform, team: Team) -> dict[str, int]:
    """The GPUs of each flavor the team may hold (nominal + borrowingLimit): the whole pool, or its spot
    or on-demand part of the cap where it splits it. A spot part is a limit per spot pool."""
    split = _budgets(team)
    return {
        pool.name: min(
            pool.max_gpus, team.gpu_quota if split is None else split[pool.spec.capacity == "spot"]
        )
        for pool in training_order(platform, team.placement)
    }


def needs_cap_group(platform: ResolvedPlatform, team: Team) -> bool:
    """Whether the team's flavors together could take more than its cap (then TEAM_GPU_RESOURCE caps it)."""
    return sum(flavor_limits(platform, team).values()) > team.gpu_quota


def _guaranteed_room(platform: ResolvedPlatform, team: Team) -> dict[str, int]:
    """How much of each flavor the team may be guaranteed: its cap (or its spot or on-demand part) taken
    flavor by flavor in the order the team tries them, so its guarantees add up to at most its cap."""
    split = _budgets(team)
    taken = {True: 0, False: 0}
    room: dict[str, int] = {}
    for pool in training_order(platform, team.placement):
        spot = pool.spec.capacity == "spot"
        left = team.gpu_quota - taken[True] - taken[False] if split is None else split[spot] - taken[spot]
        room[pool.name] = min(left, pool.max_gpus)
        taken[spot] += room[pool.name]
    return room


def quota_plan(platform: ResolvedPlatform) -> QuotaPlan:
    teams = platform.spec.scheduler.teams
    weights = {t.name: t.fairshare for t in teams}
    rooms = {t.name: _guaranteed_room(platform, t) for t in teams}
    limits = {t.name: flavor_limits(platform, t) for t in teams}
    quotas: list[FlavorQuota] = []
    cohort: dict[str, int] = {}
    for pool in training_flavors(platform):
        gpus = pool.max_gpus
        share = _split(gpus, weights, {t: rooms[t][pool.name] for t in weights})
        for team in weights:
            quotas.append(FlavorQuota(team, pool.name, share[team], limits[team][pool.name] - share[team]))
        cohort[pool.name] = gpus - sum(share.values())
    return QuotaPlan(quotas, cohort)


def topology_queues(platform: ResolvedPlatform) -> set[str]:
    """The teams whose queues use topology-aware scheduling: every pool they list supports it, they need
    no cap group, and every other queue listing one of their pools qualifies too (a flavor is shared)."""
    teams = platform.spec.scheduler.teams
    listed = {t.name: {p.name for p in training_order(platform, t.placement)} for t in teams}
    capable = {p.name for p in training_flavors(platform) if uses_topology(platform, p)}
    chosen = {t.name for t in teams if listed[t.name] <= capable and not needs_cap_group(platform, t)}
    while True:
        shared_with_others = {p for t in listed if t not in chosen for p in listed[t]}
        kept = {t for t in chosen if not listed[t] & shared_with_others}
        if kept == chosen:
            return chosen
        chosen = kept


def topology_flavors(platform: ResolvedPlatform) -> set[str]:
    """The pools whose flavors have a topology: those the topology queues list."""
    teams = {t.name: t for t in platform.spec.scheduler.teams}
    return {p.name for t in topology_queues(platform) for p in training_order(platform, teams[t].placement)}


def queue_uses_topology(platform: ResolvedPlatform, team: str) -> bool:
    return team in topology_queues(platform)


def _flavor(platform: ResolvedPlatform, pool: ResolvedPool, topology: set[str]) -> Manifest:
    # Every label of the pool's nodes: Kueue matches a job's node selector only on keys some flavor
    # names (so `gpuplat/capacity: spot` picks the spot flavor) and adds the flavor's labels to the pods.
    spec: dict[str, object] = {"nodeLabels": node_labels(pool)}
    if pool.spec.taints:
        spec["tolerations"] = tolerations(pool)
    if pool.name in topology:
        spec["topologyName"] = topology_name(platform)
    return k8s_object(KUEUE_API, "ResourceFlavor", pool.name, labels=node_labels(pool), spec=spec)


def _cap_flavor() -> Manifest:
    """The flavor of the quota-only cap: no node labels, so it constrains no pod's placement."""
    return k8s_object(KUEUE_API, "ResourceFlavor", TEAM_CAP_FLAVOR, spec={})


def _resource_group(
    quotas: Mapping[str, tuple[int, int | None]], resource_name: str = GPU_RESOURCE
) -> dict[str, object]:
    flavors = []
    for flavor, (nominal, borrowing) in quotas.items():
        resource: dict[str, object] = {"name": resource_name, "nominalQuota": nominal}
        if borrowing is not None:
            resource["borrowingLimit"] = borrowing
        flavors.append({"name": flavor, "resources": [resource]})
    return {"coveredResources": [resource_name], "flavors": flavors}


def _cluster_queue(platform: ResolvedPlatform, team: Team, plan: QuotaPlan) -> Manifest:
    # The flavors in the order the team tries them (Kueue assigns the first that has room, and with
    # TryNextFlavor moves on rather than borrow or preempt there).
    planned = {q.flavor: (q.nominal, q.borrowing_limit) for q in plan.teams if q.team == team.name}
    quotas = {pool.name: planned[pool.name] for pool in training_order(platform, team.placement)}
    groups = [_resource_group(quotas)]
    if needs_cap_group(platform, team):
        groups.append(_resource_group({TEAM_CAP_FLAVOR: (team.gpu_quota, 0)}, TEAM_GPU_RESOURCE))
    checks: dict[str, object] = {}
    provisioned = [f for f in provisioned_flavors(platform) if f in quotas]
    if provisioned:
        checks["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": PROVISIONING_CHECK, "onFlavors": provisioned}]
        }
    return k8s_object(
        KUEUE_API,
        "ClusterQueue",
        team.name,
        spec={
            **checks,
            "cohortName": cohort_name(platform),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team_namespace(team.name)}},
            "resourceGroups": groups,
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
    topology = topology_flavors(platform)
    if topology:
        objects.append(_topology(platform))
    objects += [_flavor(platform, pool, topology) for pool in training_flavors(platform)]
    if any(needs_cap_group(platform, t) for t in teams):
        objects.append(_cap_flavor())
    if provisioned_flavors(platform):
        objects += _provisioning_objects()
    objects.append(_cohort(platform, plan))
    objects += [_cluster_queue(platform, t, plan) for t in teams]
    objects += [
        k8s_object(
            KUEUE_API, "LocalQueue", LOCAL_QUEUE, team_namespace(t.name), spec={"clusterQueue": t.name}
        )
        for t in teams
    ]
    return objects
