"""The Kubernetes rules on hand-made objects (infra/policy/rules/kubernetes.py): a queue's reach against its
team's cap, the pools a pod's selector and required affinity name, what binds the admission guard, and
objects whose parts are not what the rules expect. Each test failed on a mutant of the rules the
policy-rules session let through (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE, TEAM_GPU_RESOURCE
from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext
from infra.policy.rules.kubernetes import (
    check_kubernetes_isolation,
    check_kubernetes_quotas,
    check_spot_flavors,
)
from infra.policy.view import ResourceIndex, ResourceView

KUEUE = "kubernetes:kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"


def k8s(kind: str, name: str, spec: Any, namespace: str = "", api: str = KUEUE) -> ResourceView:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return ResourceView(
        f"{api}:{kind}", name, {"kind": kind, "metadata": metadata, "spec": spec}, urn=f"urn:{name}"
    )


def flavor(name: str, pool: str) -> ResourceView:
    return k8s("ResourceFlavor", name, {"nodeLabels": {LABEL_POOL: pool}})


def quota(flavor_name: str, nominal: float, limit: float | None, resource: str = GPU) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": resource, "nominalQuota": nominal}
    if limit is not None:
        entry["borrowingLimit"] = limit
    return {"name": flavor_name, "resources": [entry]}


def queue(name: str, *groups: list[dict[str, Any]]) -> ResourceView:
    return k8s("ClusterQueue", name, {"resourceGroups": [{"flavors": flavors} for flavors in groups]})


def quota_findings(platform: ResolvedPlatform, *objects: ResourceView) -> list[str]:
    index = ResourceIndex([flavor("train", "train"), flavor("train-spot", "train-spot"), *objects])
    return [f.message for f in check_kubernetes_quotas(index, PolicyContext(platform))]


def test_a_queues_limit_over_every_flavor_is_its_nominal_plus_borrowing_limit(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """research (cap 48) reaches 64 GPUs over its two flavors; its quota-only group holds it to nominal +
    borrowing limit of the team resource: 40 + 8 is within the cap, 40 + 10 is not."""
    aws = shipped_platforms["aws-k8s"]
    flavors = [quota("train", 32, 0), quota("train-spot", 32, 0)]
    held = queue("research", flavors, [quota("team", 40, 8, TEAM_GPU_RESOURCE)])
    assert quota_findings(aws, held) == []
    over = queue("research", flavors, [quota("team", 40, 10, TEAM_GPU_RESOURCE)])
    assert quota_findings(aws, over) == [
        "ClusterQueue research may hold 50 GPUs over its flavors (train 32, train-spot 32: nominal + "
        "borrowing limit), above team 'research''s gpu_quota of 48; Kueue caps each flavor on its own, so "
        f"the cap must be split across them or held by a quota-only {TEAM_GPU_RESOURCE} resource group"
    ]


def test_a_queue_without_a_team_or_with_a_flavor_that_may_borrow_everything_is_not_summed(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A queue of no team has no cap to stay within, and one flavor without a borrowing limit is its own
    finding, not a sum; the queue after them is still judged."""
    aws = shipped_platforms["aws-k8s"]
    shared = queue("shared", [quota("train", 4, 8)])
    unbounded = queue("eval", [quota("train", 4, None)])
    over = queue("product", [quota("train", 20, 6)])
    assert quota_findings(aws, shared, unbounded, over) == [
        "ClusterQueue eval sets no borrowingLimit on flavor 'train': it may borrow every idle GPU of the "
        "cohort, past its team's cap",
        "ClusterQueue product may hold 26 GPUs over its flavors (train 26: nominal + borrowing limit), "
        "above team 'product''s gpu_quota of 24; Kueue caps each flavor on its own, so the cap must be split "
        f"across them or held by a quota-only {TEAM_GPU_RESOURCE} resource group",
    ]


def test_resource_groups_and_flavors_that_are_no_mappings_are_passed_over(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A malformed entry beside good ones (a preview's unknown, a hand-written object): no crash, the good
    entries still count."""
    aws = shipped_platforms["aws-k8s"]
    spec = {
        "resourceGroups": [
            "unknown",
            {"flavors": ["unknown", quota("train", 30, 0)]},
            {"flavors": ["unknown", quota("team", 20, 10, TEAM_GPU_RESOURCE)]},
        ]
    }
    messages = quota_findings(aws, k8s("ClusterQueue", "product", spec))
    assert [m.split(" over its flavors")[0] for m in messages] == ["ClusterQueue product may hold 30 GPUs"]


def isolation_findings(platform: ResolvedPlatform, *objects: ResourceView) -> list[str]:
    return [
        f.message for f in check_kubernetes_isolation(ResourceIndex(list(objects)), PolicyContext(platform))
    ]


def job(pod: dict[str, Any]) -> ResourceView:
    spec = {"template": {"spec": {"containers": [{"name": "main", "image": "trainer"}], **pod}}}
    return k8s("Job", "trainer", spec, namespace="team-eval", api="kubernetes:batch/v1")


GUARD = (
    k8s("ValidatingAdmissionPolicy", "guard", {}, api="kubernetes:admissionregistration.k8s.io/v1"),
    k8s(
        "ValidatingAdmissionPolicyBinding",
        "guard-binding",
        {"policyName": "guard", "validationActions": ["Deny"]},
        api="kubernetes:admissionregistration.k8s.io/v1",
    ),
)


def selected(platform: ResolvedPlatform, pod: dict[str, Any]) -> list[str]:
    """The inference pools a team's job is told it selects (outside the serving namespace)."""
    prefix = "Job team-eval/trainer selects inference pool(s) "
    return [
        m[len(prefix) :].split(" outside")[0]
        for m in isolation_findings(platform, job(pod), *GUARD)
        if m.startswith(prefix)
    ]


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def affinity(*terms: Any) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def test_a_pod_selects_the_pools_its_selector_names_by_pool_and_by_role_together(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-k8s"]
    assert selected(aws, {"nodeSelector": {LABEL_POOL: "infer", LABEL_ROLE: "train"}}) == ["infer"]
    assert selected(aws, {"nodeSelector": {LABEL_POOL: "train", LABEL_ROLE: "infer"}}) == ["infer"]


def test_required_affinity_adds_every_in_expression_after_others_of_a_term(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A NotIn expression and a malformed one before the In that names the inference pool do not end the
    term; an In by role after one by pool adds to it."""
    aws = shipped_platforms["aws-k8s"]
    term = {
        "matchExpressions": [
            expression(LABEL_POOL, "NotIn", "train"),
            "unknown",
            expression(LABEL_POOL, "In", "infer"),
        ]
    }
    assert selected(aws, affinity(term)) == ["infer"]
    by_pool_then_role = {
        "matchExpressions": [expression(LABEL_POOL, "In", "infer"), expression(LABEL_ROLE, "In", "train")]
    }
    assert selected(aws, affinity(by_pool_then_role)) == ["infer"]


def test_affinity_parts_that_are_no_mappings_select_nothing(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-k8s"]
    assert selected(
        aws, affinity("unknown", {"matchExpressions": [expression(LABEL_POOL, "In", "infer")]})
    ) == ["infer"]
    not_a_mapping = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ["unknown"]}}
    }
    assert selected(aws, not_a_mapping) == []


def test_only_a_deny_binding_of_a_validating_admission_policy_guards_the_team_namespaces(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The binding must be a ValidatingAdmissionPolicyBinding and name a ValidatingAdmissionPolicy: an
    object of another kind with the same name or the same spec guards nothing."""
    aws = shipped_platforms["aws-k8s"]
    unguarded = (
        "no ValidatingAdmissionPolicy with a Deny binding guards the team namespaces: isolation would rest "
        "on every job author getting tolerations and selectors right"
    )
    assert unguarded not in isolation_findings(aws, *GUARD)
    policy, binding = GUARD
    namesake = k8s("ConfigMap", "guard", {}, namespace="team-eval", api="kubernetes:core/v1")
    assert unguarded in isolation_findings(aws, namesake, binding)
    lookalike = k8s(
        "ConfigMap", "guard-binding", binding.props["spec"], namespace="team-eval", api="kubernetes:core/v1"
    )
    assert unguarded in isolation_findings(aws, policy, lookalike)


def test_an_object_without_metadata_is_judged_by_its_spec(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A queue whose metadata is unknown (a preview) has no team to be held to, but its flavors are still
    checked."""
    anonymous = ResourceView(
        f"{KUEUE}:ClusterQueue",
        "anonymous",
        {"kind": "ClusterQueue", "spec": {"resourceGroups": [{"flavors": [quota("h200", 8, 0)]}]}},
    )
    assert quota_findings(shipped_platforms["aws-k8s"], anonymous) == [
        "ClusterQueue anonymous names flavor 'h200', which is no ResourceFlavor of a pool of the stack "
        "(flavors: train, train-spot)"
    ]


def server(*pods: dict[str, Any], namespace: str = "serving") -> ResourceView:
    """A LeaderWorkerSet-like object holding each pod spec in its own template."""
    templates = [
        {"template": {"spec": {"containers": [{"name": "vllm", "image": "vllm"}], **p}}} for p in pods
    ]
    return k8s(
        "LeaderWorkerSet", "server", {"templates": templates}, namespace=namespace, api="kubernetes:apps/v1"
    )


def test_every_pod_of_an_object_is_judged_and_each_finding_lists_all_it_names(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """A second inference pool (infer-b) so that the lists have two entries; a team object's first pod is
    not its last, and a model server's findings list every pool and taint."""
    aws = shipped_platforms["aws-k8s"]
    infer = next(p for p in aws.pools if p.name == "infer")
    second = replace(infer, spec=infer.spec.model_copy(update={"name": "infer-b"}))
    platform = replace(aws, pools=(*aws.pools, second))
    every = {"operator": "Exists"}
    inference = {"key": "gpuplat/inference", "operator": "Exists"}
    team = server(
        {},
        {"tolerations": [inference, every]},
        {"nodeSelector": {LABEL_ROLE: "infer"}},
        namespace="team-eval",
    )
    gpu = {"containers": [{"name": "vllm", "resources": {"limits": {GPU: 1}}}]}
    training = [
        {"key": "gpuplat/training", "operator": "Exists"},
        {"key": "gpuplat/spot", "operator": "Exists"},
    ]
    model = server({**gpu, "nodeSelector": {LABEL_ROLE: "train"}, "tolerations": training})
    assert isolation_findings(platform, team, model, *GUARD) == [
        "LeaderWorkerSet team-eval/server tolerates the inference taint (every taint, gpuplat/inference): "
        "training and inference never share nodes",
        "LeaderWorkerSet team-eval/server selects inference pool(s) infer, infer-b outside the serving "
        "namespace 'serving'",
        "LeaderWorkerSet serving/server requests GPUs but does not run on the inference pool only (selects "
        "train, train-spot; inference pools: infer, infer-b)",
        "LeaderWorkerSet serving/server tolerates training pools' taints (gpuplat/spot, gpuplat/training): "
        "model servers stay off training nodes",
    ]


def test_a_training_pool_tainted_no_execute_alone_keeps_unadmitted_pods_off(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-k8s"]
    pools = []
    for pool in aws.pools:
        taints = [t.model_copy(update={"effect": "NoExecute"}) for t in pool.spec.taints]
        pools.append(replace(pool, spec=pool.spec.model_copy(update={"taints": taints})))
    assert isolation_findings(replace(aws, pools=tuple(pools)), *GUARD) == []


def test_only_resource_flavors_are_judged_as_flavors_and_each_lists_every_taint_it_tolerates(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-k8s"]
    lookalike = k8s("ConfigMap", "labels", {"nodeLabels": {LABEL_POOL: "infer"}}, namespace="serving")
    tolerations = [{"key": "gpuplat/inference", "operator": "Exists"}, {"operator": "Exists"}]
    wide = k8s("ResourceFlavor", "wide", {"nodeLabels": {LABEL_POOL: "train"}, "tolerations": tolerations})
    assert isolation_findings(aws, lookalike, wide, *GUARD) == [
        "ResourceFlavor wide lets queued training work onto inference nodes (tolerates every taint, "
        "gpuplat/inference)"
    ]


def spot_findings(platform: ResolvedPlatform | None, *objects: ResourceView) -> list[str]:
    on_demand = [flavor(name, "train") for name in ("train", "train-b", "train-c")]
    flavors = [*on_demand, flavor("train-spot", "train-spot")]
    index = ResourceIndex([*flavors, *objects])
    return [f.message for f in check_spot_flavors(index, PolicyContext(platform))]


def test_a_cluster_queue_naming_spot_before_on_demand_is_told_which_spot_flavor_comes_first(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The order of a queue's flavors is the order Kueue tries them in; a Cohort's is not, and a stack
    without a platform has nothing to judge by."""
    aws = shipped_platforms["aws-k8s"]
    flavors = [
        quota("train", 8, 0),
        quota("train-spot", 8, 0),
        quota("train-b", 8, 0),
        quota("train-c", 8, 0),
    ]
    assert spot_findings(aws, queue("research", flavors)) == [
        "ClusterQueue research tries spot flavor 'train-spot' before on-demand flavor(s) train-b, "
        "train-c: spot only takes what on-demand cannot"
    ]
    cohort = k8s("Cohort", "all", {"resourceGroups": [{"flavors": flavors}]})
    assert spot_findings(aws, cohort) == []
    assert spot_findings(None, queue("research", flavors)) == []


def test_a_flavor_of_no_pool_of_the_stack_or_no_flavor_at_all_is_named(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-k8s"]
    research = queue("research", [quota("old", 8, 0)])
    assert quota_findings(aws, flavor("old", "gone"), research) == [
        "ClusterQueue research names flavor 'old', which is no ResourceFlavor of a pool of the stack "
        "(flavors: old, train, train-spot)"
    ]
    alone = [f.message for f in check_kubernetes_quotas(ResourceIndex([research]), PolicyContext(aws))]
    assert alone == [
        "ClusterQueue research names flavor 'old', which is no ResourceFlavor of a pool of the stack "
        "(flavors: none)"
    ]


def test_a_flavor_of_no_pool_does_not_end_the_checks_of_the_flavors_after_it(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The unknown flavor 'a-old' sorts before 'train', whose nominal quotas (40) exceed its pool's 32 GPUs
    and whose borrowing limit is missing."""
    aws = shipped_platforms["aws-k8s"]
    research = queue("research", [quota("a-old", 8, 0), quota("train", 40, None)])
    assert [m.split(",")[0] for m in quota_findings(aws, research)] == [
        "ClusterQueue research names flavor 'a-old'",
        "ClusterQueue research sets no borrowingLimit on flavor 'train': it may borrow every idle GPU of the "
        "cohort",
        "the nominal quotas of flavor 'train' add up to 40 GPUs but pool 'train' has 32 (ClusterQueue "
        "research: 40): Kueue would guarantee GPUs that do not exist",
    ]
