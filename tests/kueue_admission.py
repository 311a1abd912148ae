"""Which flavors Kueue v0.19.2 may assign to a workload in a ClusterQueue, from the objects the platform
emits, with the queue empty: Kueue's matching rules written down, each with its source.

- A pod set's node selector is compared with a flavor's nodeLabels only on the keys some flavor of the
  resource group names (pkg/scheduler/flavorassigner/flavorassigner.go, flavorSelector).
- Topology (pkg/scheduler/flavorassigner/tas_flavorassigner.go:166-227): a pod set asks for a topology
  when its template carries one of the podset-*-topology annotations (pkg/workload/workload.go:515-522,
  IsExplicitlyRequestingTAS), or implicitly when every flavor of every resource group of the queue has a
  topologyName (isTASOnly, pkg/cache/scheduler/clusterqueue.go:741-750). A pod set that asks fits only
  flavors with a topology, except a flavor covering none of the resources its pods request (a
  quota-only flavor); one that does not ask never fits a flavor with a topology.
- Quota: the pod set's total of each covered resource within one flavor's nominalQuota + borrowingLimit
  (no borrowingLimit: the cohort's GPUs), the quota-only resource counted from the GPUs by the
  Configuration's transformations (pkg/workload/resources.go, applyResourceTransformations).

Not modelled: usage by other workloads, preemption, taints (the platform's flavors set no nodeTaints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.k8s.objects import GPU_RESOURCE

TOPOLOGY_ANNOTATIONS = (
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kueue.x-k8s.io/podset-unconstrained-topology",
)


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    template: dict[str, Any]

    def requests(self, transformations: list[dict[str, Any]]) -> dict[str, int]:
        """The pod set's total per resource, after Kueue's transformations."""
        totals: dict[str, int] = {}
        for container in self.template["spec"]["containers"]:
            for name, value in container.get("resources", {}).get("requests", {}).items():
                totals[name] = totals.get(name, 0) + int(value) * self.count
        for transformation in transformations:
            amount = totals.get(transformation["input"], 0)
            if not amount:
                continue
            for output, per_unit in transformation["outputs"].items():
                totals[output] = totals.get(output, 0) + amount * int(per_unit)
            if transformation.get("strategy") == "Replace":
                del totals[transformation["input"]]
        return totals

    @property
    def asks_topology(self) -> bool:
        annotations = self.template.get("metadata", {}).get("annotations", {})
        return any(a in annotations for a in TOPOLOGY_ANNOTATIONS)


def pod_sets(workload: dict[str, Any]) -> list[PodSet]:
    """A Job's one pod set (parallelism pods) or a JobSet's pod set per replicated job."""
    if workload["kind"] == "Job":
        spec = workload["spec"]
        return [PodSet("main", spec.get("parallelism", 1), spec["template"])]
    sets = []
    for replicated in workload["spec"]["replicatedJobs"]:
        job = replicated["template"]["spec"]
        count = replicated.get("replicas", 1) * job.get("parallelism", 1)
        sets.append(PodSet(replicated["name"], count, job["template"]))
    return sets


def _tas_only(queue: dict[str, Any], flavors: dict[str, dict[str, Any]]) -> bool:
    return all(
        "topologyName" in flavors[f["name"]]["spec"]
        for g in queue["spec"]["resourceGroups"]
        for f in g["flavors"]
    )


def _topology_fits(pod_set: PodSet, flavor: dict[str, Any], covered: list[str], tas_only: bool) -> bool:
    has_topology = "topologyName" in flavor["spec"]
    if tas_only and not pod_set.asks_topology:
        return True  # implied: every flavor of the queue has a topology (tas_flavorassigner.go:168-172)
    if pod_set.asks_topology:
        # a flavor without one fits only where it covers none of the pods' resources (:175-183)
        return has_topology or not set(pod_set.requests([])) & set(covered)
    return not has_topology  # "supports only TopologyAwareScheduling" (:199-201)


def _selector_fits(pod_set: PodSet, flavor: dict[str, Any], keys: set[str]) -> bool:
    selector = pod_set.template["spec"].get("nodeSelector", {})
    labels = flavor["spec"].get("nodeLabels", {})
    return all(labels.get(k) == v for k, v in selector.items() if k in keys)


def assignable_flavors(
    workload: dict[str, Any],
    queue: dict[str, Any],
    flavors: dict[str, dict[str, Any]],
    transformations: list[dict[str, Any]],
) -> dict[str, list[str]] | None:
    """Per pod set, per resource group (by its first covered resource), the flavors Kueue may assign on an
    empty cluster; None when some pod set has none in a group it needs (never admitted)."""
    tas_only = _tas_only(queue, flavors)
    result: dict[str, list[str]] = {}
    for pod_set in pod_sets(workload):
        requests = pod_set.requests(transformations)
        for group in queue["spec"]["resourceGroups"]:
            covered = group["coveredResources"]
            needed = {r: requests[r] for r in covered if requests.get(r)}
            if not needed:
                continue
            keys = {k for f in group["flavors"] for k in flavors[f["name"]]["spec"].get("nodeLabels", {})}
            fits = []
            for entry in group["flavors"]:
                flavor = flavors[entry["name"]]
                quota = {r["name"]: r for r in entry["resources"]}
                within = all(
                    amount <= quota[r]["nominalQuota"] + quota[r].get("borrowingLimit", 10**9)
                    for r, amount in needed.items()
                )
                if (
                    within
                    and _selector_fits(pod_set, flavor, keys)
                    and _topology_fits(pod_set, flavor, covered, tas_only)
                ):
                    fits.append(entry["name"])
            if not fits:
                return None
            result[f"{pod_set.name}/{covered[0]}"] = fits
    return result


def gpu_flavors(assignment: dict[str, list[str]]) -> set[str]:
    return {f for key, names in assignment.items() if key.endswith(f"/{GPU_RESOURCE}") for f in names}


def flavors_with_room(queue: dict[str, Any], gpus: int) -> set[str]:
    """The GPU flavors of a ClusterQueue whose nominal quota and borrowing limit together hold `gpus`."""
    return {
        f["name"]
        for f in queue["spec"]["resourceGroups"][0]["flavors"]
        if f["resources"][0]["nominalQuota"] + f["resources"][0].get("borrowingLimit", 0) >= gpus
    }
