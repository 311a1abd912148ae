"""Rules over the Kubernetes layer's objects (scheduler.kind kueue), read from the recorded or previewed
pulumi-kubernetes resources (their inputs are the objects themselves).

- isolation: team workloads and Kueue flavors never reach inference nodes; model servers run on the
  inference pool only; the API server enforces it (an admission policy with a Deny binding).
- spot: spot flavors come after every on-demand flavor of a queue, and only interruptible pools are
  spot flavors.
- quotas: per flavor the guaranteed (nominal) GPUs do not exceed the pool's; a team's reach (nominal +
  borrowing limit) stays within its cap; every queue and flavor reference resolves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE, TEAM_GPU_RESOURCE, serving_namespace, team_namespace
from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules.base import Finding, PolicyContext, _items, _number
from infra.policy.view import ResourceIndex, ResourceView

GPU = "nvidia.com/gpu"


def kubernetes_objects(index: ResourceIndex, kind: str | None = None) -> list[ResourceView]:
    return [
        r
        for r in index
        if r.type.startswith("kubernetes:")
        and isinstance(r.props.get("kind"), str)
        and (kind is None or r.props["kind"] == kind)
        and not r.type.endswith("Patch")
    ]


def object_label(view: ResourceView) -> str:
    meta = view.props.get("metadata") or {}
    where = f"{meta['namespace']}/" if isinstance(meta, Mapping) and meta.get("namespace") else ""
    name = meta.get("name", view.name) if isinstance(meta, Mapping) else view.name
    return f"{view.props.get('kind')} {where}{name}"


def _meta(view: ResourceView, key: str) -> str:
    meta = view.props.get("metadata")
    return str(meta.get(key, "")) if isinstance(meta, Mapping) else ""


def pod_specs(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every pod spec inside an object (Deployment, Job, JobSet, LeaderWorkerSet, ...): the mappings
    that hold `containers`."""
    if isinstance(value, Mapping):
        if isinstance(value.get("containers"), list):
            yield value
            return
        for item in value.values():
            yield from pod_specs(item)
    elif isinstance(value, list):
        for item in value:
            yield from pod_specs(item)


def _inference(platform: ResolvedPlatform) -> tuple[set[str], set[str]]:
    infer = platform.pools_with_role("infer")
    return {p.name for p in infer}, {t.key for p in infer for t in p.spec.taints}


def _tolerated(pod: Mapping[str, Any], keys: set[str]) -> list[str]:
    found = []
    for toleration in _items(pod.get("tolerations")):
        if not isinstance(toleration, Mapping):
            continue
        key = toleration.get("key")
        if key in keys:
            found.append(str(key))
        elif not key and toleration.get("operator") == "Exists":
            found.append("every taint")
    return found


def _selected_pools(pod: Mapping[str, Any], platform: ResolvedPlatform) -> set[str]:
    """Pools a pod's nodeSelector or required node affinity names (by pool or by role)."""
    by_role: dict[str, set[str]] = {p.role: set() for p in platform.pools}
    for pool in platform.pools:
        by_role[pool.role].add(pool.name)
    chosen: set[str] = set()
    selector = pod.get("nodeSelector")
    if isinstance(selector, Mapping):
        if LABEL_POOL in selector:
            chosen.add(str(selector[LABEL_POOL]))
        if LABEL_ROLE in selector:
            chosen |= by_role.get(str(selector[LABEL_ROLE]), set())
    affinity = pod.get("affinity")
    required = (
        affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
        if isinstance(affinity, Mapping)
        else {}
    )
    for term in _items(required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None):
        for expression in _items(term.get("matchExpressions") if isinstance(term, Mapping) else None):
            if not isinstance(expression, Mapping) or expression.get("operator") != "In":
                continue
            values = {str(v) for v in _items(expression.get("values"))}
            if expression.get("key") == LABEL_POOL:
                chosen |= values
            elif expression.get("key") == LABEL_ROLE:
                for role in values:
                    chosen |= by_role.get(role, set())
    return chosen


def _has_admission_guard(index: ResourceIndex) -> bool:
    policies = {_meta(p, "name") for p in kubernetes_objects(index, "ValidatingAdmissionPolicy")}
    return any(
        isinstance(b.props.get("spec"), Mapping)
        and b.props["spec"].get("policyName") in policies
        and "Deny" in _items(b.props["spec"].get("validationActions"))
        for b in kubernetes_objects(index, "ValidatingAdmissionPolicyBinding")
    )


def check_kubernetes_isolation(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.scheduler.kind != "kueue":
        return
    infer_pools, infer_taints = _inference(platform)
    train_taints = {t.key for p in platform.pools_with_role("train") for t in p.spec.taints}
    for pool in platform.pools_with_role("train"):
        if pool.gpus_per_node and not any(t.effect in ("NoSchedule", "NoExecute") for t in pool.spec.taints):
            yield Finding(
                f"pool {pool.name}",
                f"training pool {pool.name!r} has GPUs and no NoSchedule or NoExecute taint: a pod Kueue "
                "never admitted (another namespace's, a DaemonSet's) can take its GPU nodes; taint it (the "
                "flavor then tolerates the taint for the jobs Kueue admits)",
            )
    serving = serving_namespace(platform)
    for view in kubernetes_objects(index):
        namespace = _meta(view, "namespace")
        label = object_label(view)
        for pod in pod_specs(view.props.get("spec")):
            tolerated = _tolerated(pod, infer_taints)
            chosen = _selected_pools(pod, platform)
            if namespace != serving:
                if tolerated:
                    yield Finding(
                        label,
                        f"{label} tolerates the inference taint ({', '.join(sorted(set(tolerated)))}): "
                        "training and inference never share nodes",
                        view.urn or None,
                    )
                if chosen & infer_pools:
                    yield Finding(
                        label,
                        f"{label} selects inference pool(s) {', '.join(sorted(chosen & infer_pools))} "
                        f"outside the serving namespace {serving!r}",
                        view.urn or None,
                    )
                continue
            gpus = any(
                isinstance(c, Mapping) and GPU in str(c.get("resources", {}))
                for c in _items(pod.get("containers"))
            )
            if gpus and (not chosen or not chosen <= infer_pools):
                yield Finding(
                    label,
                    f"{label} requests GPUs but does not run on the inference pool only "
                    f"(selects {', '.join(sorted(chosen)) or 'any node'}; inference pools: "
                    f"{', '.join(sorted(infer_pools))})",
                    view.urn or None,
                )
            wrong = _tolerated(pod, train_taints)
            if wrong:
                yield Finding(
                    label,
                    f"{label} tolerates training pools' taints ({', '.join(sorted(set(wrong)))}): model "
                    "servers stay off training nodes",
                    view.urn or None,
                )
    for flavor in kubernetes_objects(index, "ResourceFlavor"):
        spec = flavor.props.get("spec") or {}
        labels = spec.get("nodeLabels") or {}
        reaches = labels.get(LABEL_POOL) in infer_pools or labels.get(LABEL_ROLE) == "infer"
        tolerated = _tolerated(spec, infer_taints)
        if reaches or tolerated:
            yield Finding(
                object_label(flavor),
                f"{object_label(flavor)} lets queued training work onto inference nodes "
                f"({'selects them' if reaches else 'tolerates ' + ', '.join(sorted(set(tolerated)))})",
                flavor.urn or None,
            )
    if platform.spec.scheduler.teams and not _has_admission_guard(index):
        yield Finding(
            f"stack {platform.name}",
            "no ValidatingAdmissionPolicy with a Deny binding guards the team namespaces: isolation would "
            "rest on every job author getting tolerations and selectors right",
        )


def _flavor_pools(index: ResourceIndex) -> dict[str, str]:
    """ResourceFlavor name -> the pool its nodeLabels select."""
    pools = {}
    for flavor in kubernetes_objects(index, "ResourceFlavor"):
        labels = (flavor.props.get("spec") or {}).get("nodeLabels") or {}
        pools[_meta(flavor, "name")] = str(labels.get(LABEL_POOL, ""))
    return pools


def _flavor_quotas(view: ResourceView) -> Iterator[tuple[str, float, float | None]]:
    """(flavor, nominal GPUs, borrowing limit or None) of a ClusterQueue or Cohort."""
    spec = view.props.get("spec") or {}
    for group in _items(spec.get("resourceGroups")):
        for flavor in _items(group.get("flavors") if isinstance(group, Mapping) else None):
            for resource in _items(flavor.get("resources") if isinstance(flavor, Mapping) else None):
                if isinstance(resource, Mapping) and resource.get("name") == GPU:
                    limit = resource.get("borrowingLimit")
                    yield (
                        str(flavor.get("name")),
                        _number(resource.get("nominalQuota")),
                        None if limit is None else _number(limit),
                    )


def check_spot_flavors(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.scheduler.kind != "kueue":
        return
    pools = {p.name: p for p in platform.pools}
    flavor_pool = _flavor_pools(index)

    def is_spot(flavor: str) -> bool:
        pool = pools.get(flavor_pool.get(flavor, ""))
        return pool is not None and pool.spec.capacity == "spot"

    for queue in kubernetes_objects(index, "ClusterQueue"):
        order = [flavor for flavor, _, _ in _flavor_quotas(queue)]
        first_spot = next((i for i, f in enumerate(order) if is_spot(f)), None)
        late = [f for f in order[first_spot or 0 :] if first_spot is not None and not is_spot(f)]
        if late:
            yield Finding(
                object_label(queue),
                f"{object_label(queue)} tries spot flavor {order[first_spot or 0]!r} before on-demand "
                f"flavor(s) {', '.join(late)}: spot only takes what on-demand cannot",
                queue.urn or None,
            )
    for flavor, pool_name in sorted(flavor_pool.items()):
        pool = pools.get(pool_name)
        if pool is not None and pool.spec.capacity == "spot" and not pool.spec.interruptible:
            yield Finding(
                f"ResourceFlavor {flavor}",
                f"ResourceFlavor {flavor} offers spot pool {pool.name!r}, which is not interruptible: its "
                "jobs would be lost with the node",
            )


def _cap_over_flavors(view: ResourceView) -> float | None:
    """The queue's limit on the quota-only TEAM_GPU_RESOURCE (nominal + borrowing limit), which Kueue's
    resource transformation counts one per GPU over every flavor; None without one (or unbounded)."""
    spec = view.props.get("spec") or {}
    for group in _items(spec.get("resourceGroups")):
        for flavor in _items(group.get("flavors") if isinstance(group, Mapping) else None):
            for resource in _items(flavor.get("resources") if isinstance(flavor, Mapping) else None):
                if isinstance(resource, Mapping) and resource.get("name") == TEAM_GPU_RESOURCE:
                    limit = resource.get("borrowingLimit")
                    if limit is not None:
                        return _number(resource.get("nominalQuota")) + _number(limit)
    return None


def _queues_within_caps(queues: list[ResourceView], caps: dict[str, int]) -> Iterator[Finding]:
    """Kueue limits each flavor on its own: a team's reach is its nominal plus borrowing limit summed over
    every flavor, or the queue's limit on TEAM_GPU_RESOURCE where that is lower, and it must stay within
    the team's cap, or Kueue admits workloads the team namespace's ResourceQuota then refuses pods of
    (half-started jobs holding nodes)."""
    for view in queues:
        cap = caps.get(_meta(view, "name"))
        quotas = list(_flavor_quotas(view))
        if cap is None or any(limit is None for _, _, limit in quotas):
            continue
        over_flavors = _cap_over_flavors(view)
        reach = sum(nominal + (limit or 0) for _, nominal, limit in quotas)
        if over_flavors is not None:
            reach = min(reach, over_flavors)
        if reach > cap:
            parts = ", ".join(f"{flavor} {nominal + (limit or 0):g}" for flavor, nominal, limit in quotas)
            yield Finding(
                object_label(view),
                f"{object_label(view)} may hold {reach:g} GPUs over its flavors ({parts}: nominal + "
                f"borrowing limit), above team {_meta(view, 'name')!r}'s gpu_quota of {cap}; Kueue caps "
                "each flavor on its own, so the cap must be split across them or held by a quota-only "
                f"{TEAM_GPU_RESOURCE} resource group",
                view.urn or None,
            )


def check_kubernetes_quotas(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.scheduler.kind != "kueue":
        return
    flavor_pool = _flavor_pools(index)
    pools = {p.name: p for p in platform.pools}
    caps = {t.name: t.gpu_quota for t in platform.spec.scheduler.teams}
    holders: dict[str, list[tuple[str, float]]] = {}
    queues = kubernetes_objects(index, "ClusterQueue")
    for view in [*queues, *kubernetes_objects(index, "Cohort")]:
        for flavor, nominal, limit in _flavor_quotas(view):
            holders.setdefault(flavor, []).append((object_label(view), nominal))
            pool = pools.get(flavor_pool.get(flavor, ""))
            if flavor not in flavor_pool or pool is None:
                yield Finding(
                    object_label(view),
                    f"{object_label(view)} names flavor {flavor!r}, which is no ResourceFlavor of a pool "
                    f"of the stack (flavors: {', '.join(sorted(flavor_pool)) or 'none'})",
                    view.urn or None,
                )
                continue
            is_queue = view.props.get("kind") == "ClusterQueue"
            if is_queue and limit is None:
                yield Finding(
                    object_label(view),
                    f"{object_label(view)} sets no borrowingLimit on flavor {flavor!r}: it may borrow every "
                    "idle GPU of the cohort, past its team's cap",
                    view.urn or None,
                )
    yield from _queues_within_caps(queues, caps)
    for flavor, held in sorted(holders.items()):
        pool = pools.get(flavor_pool.get(flavor, ""))
        if pool is None:
            continue
        total = sum(nominal for _, nominal in held)
        if total > pool.max_gpus:
            yield Finding(
                f"ResourceFlavor {flavor}",
                f"the nominal quotas of flavor {flavor!r} add up to {total:g} GPUs but pool {pool.name!r} "
                f"has {pool.max_gpus} ({', '.join(f'{label}: {n:g}' for label, n in held)}): Kueue would "
                "guarantee GPUs that do not exist",
            )
    training_gpus = platform.training_gpus
    for team, cap in sorted(caps.items()):
        if cap > training_gpus:
            yield Finding(
                f"ResourceQuota {team_namespace(team)}/gpus",
                f"team {team!r} has gpu_quota {cap}, more than the {training_gpus} training GPUs of the "
                "stack",
            )
    queue_names = {_meta(q, "name") for q in queues}
    for local in kubernetes_objects(index, "LocalQueue"):
        target = (local.props.get("spec") or {}).get("clusterQueue")
        if target not in queue_names:
            yield Finding(
                object_label(local),
                f"{object_label(local)} points at ClusterQueue {target!r}, which the stack does not declare",
                local.urn or None,
            )
