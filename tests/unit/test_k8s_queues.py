"""Kueue quotas from the teams: guarantees add up to the GPUs that exist, caps hold, spot comes last."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import SpecError
from infra.k8s.objects import LABEL_CAPACITY, LABEL_POOL, TEAM_GPU_RESOURCE, node_labels
from infra.k8s.queues import KUEUE_API, TEAM_CAP_FLAVOR, _split, queue_objects, quota_plan, training_flavors
from infra.k8s.training import example_jobset
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file

KUEUE_STACKS = ["aws-k8s", "onprem-k8s"]


@pytest.fixture(scope="module")
def aws_k8s() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


def test_split_follows_weights_and_hands_out_every_unit() -> None:
    share = _split(
        32, {"research": 50, "product": 30, "eval": 20}, {"research": 99, "product": 99, "eval": 99}
    )
    assert share == {"research": 16, "product": 10, "eval": 6}


def test_split_gives_what_a_capped_team_cannot_take_to_the_others() -> None:
    share = _split(
        32, {"research": 50, "product": 30, "eval": 20}, {"research": 99, "product": 99, "eval": 2}
    )
    assert share["eval"] == 2
    assert sum(share.values()) == 32
    assert share["research"] > share["product"]


def test_split_leaves_units_no_team_can_take() -> None:
    assert sum(_split(32, {"a": 1, "b": 1}, {"a": 3, "b": 4}).values()) == 7


def test_nominal_quotas_add_up_to_each_pools_gpus(aws_k8s: ResolvedPlatform) -> None:
    plan = quota_plan(aws_k8s)
    for pool in training_flavors(aws_k8s):
        guaranteed = sum(q.nominal for q in plan.teams if q.flavor == pool.name) + plan.cohort[pool.name]
        assert guaranteed == pool.max_gpus


def test_no_team_reaches_past_its_cap(aws_k8s: ResolvedPlatform) -> None:
    plan = quota_plan(aws_k8s)
    for team in aws_k8s.spec.scheduler.teams:
        quotas = [q for q in plan.teams if q.team == team.name]
        assert sum(q.nominal for q in quotas) <= team.gpu_quota
        assert all(q.nominal + q.borrowing_limit <= team.gpu_quota for q in quotas)


def _admissible(queue: dict[str, Any]) -> tuple[dict[str, int], int | None]:
    """What a queue may admit: per GPU flavor nominal + borrowingLimit, and the cap across them (the
    quota-only group's nominal, borrowing 0) or None without one."""
    groups = queue["spec"]["resourceGroups"]
    per_flavor = {
        f["name"]: f["resources"][0]["nominalQuota"] + f["resources"][0]["borrowingLimit"]
        for f in groups[0]["flavors"]
    }
    cap = None
    for group in groups[1:]:
        assert group["coveredResources"] == [TEAM_GPU_RESOURCE]
        (resource,) = group["flavors"][0]["resources"]
        assert resource["borrowingLimit"] == 0
        cap = resource["nominalQuota"]
    return per_flavor, cap


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_each_flavor_reaches_its_whole_pool_and_the_team_reach_over_flavors_is_its_cap(stack: str) -> None:
    """Kueue caps each flavor on its own (nominal + borrowingLimit): each flavor may take its whole pool
    (or the team's spot or on-demand part), and the quota-only TEAM_GPU_RESOURCE, one per GPU by Kueue's
    resource transformation, holds the sum over flavors to the cap."""
    platform = load_platform(stack_file(stack))
    queues = {o["metadata"]["name"]: o for o in queue_objects(platform) if o["kind"] == "ClusterQueue"}
    pools = {p.name: p.max_gpus for p in training_flavors(platform)}
    for team in platform.spec.scheduler.teams:
        per_flavor, cap = _admissible(queues[team.name])
        for flavor, reach in per_flavor.items():
            assert reach == min(pools[flavor], team.gpu_quota) or team.spot_gpu_quota is not None
        total = sum(per_flavor.values()) if cap is None else min(cap, sum(per_flavor.values()))
        assert total == team.gpu_quota, team.name


def test_a_team_splits_its_cap_between_spot_and_on_demand(aws_k8s: ResolvedPlatform) -> None:
    plan = quota_plan(aws_k8s)
    reach = {(q.team, q.flavor): q.nominal + q.borrowing_limit for q in plan.teams}
    assert (reach["product", "train"], reach["product", "train-spot"]) == (16, 8)  # spot_gpu_quota: 8 of 24
    # Without a split every flavor reaches its whole pool; the cap group holds the sum to the cap.
    assert (reach["research", "train"], reach["research", "train-spot"]) == (32, 32)
    assert (reach["eval", "train"], reach["eval", "train-spot"]) == (8, 8)


def test_no_spot_gpu_is_out_of_every_queue_s_reach(aws_k8s: ResolvedPlatform) -> None:
    """Issue 51: 8 of the 32 spot GPUs were in no queue's reach; now every pool's GPUs are."""
    plan = quota_plan(aws_k8s)
    for pool in training_flavors(aws_k8s):
        assert (
            max(q.nominal + q.borrowing_limit for q in plan.teams if q.flavor == pool.name) == pool.max_gpus
        )


def test_a_spot_part_above_the_cap_is_refused(write_stack: Callable[..., Path]) -> None:
    def too_much_spot(platform: dict[str, Any]) -> None:
        platform["scheduler"]["teams"][0]["spot_gpu_quota"] = 64

    with pytest.raises(SpecError, match="spot_gpu_quota 64 is above its gpu_quota 48"):
        load_platform(write_stack("aws-k8s", too_much_spot))


def test_gpus_no_team_may_take_belong_to_the_cohort(write_stack: Callable[..., Path]) -> None:
    def small_caps(platform: dict[str, Any]) -> None:
        platform["scheduler"]["teams"] = [
            {"name": "research", "gpu_quota": 8, "fairshare": 50},
            {"name": "product", "gpu_quota": 8, "fairshare": 50},
        ]

    platform = load_platform(write_stack("aws-k8s", small_caps))
    plan = quota_plan(platform)
    assert plan.cohort == {"train": 16, "train-spot": 32}
    cohort = next(o for o in queue_objects(platform) if o["kind"] == "Cohort")
    flavors = cohort["spec"]["resourceGroups"][0]["flavors"]
    assert {f["name"]: f["resources"][0]["nominalQuota"] for f in flavors} == plan.cohort


def test_queues_try_on_demand_before_spot_and_preempt_as_specified(aws_k8s: ResolvedPlatform) -> None:
    queues = [o for o in queue_objects(aws_k8s) if o["kind"] == "ClusterQueue"]
    assert [q["metadata"]["name"] for q in queues] == ["research", "product", "eval"]
    for queue in queues:
        spec = queue["spec"]
        assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == ["train", "train-spot"]
        assert spec["cohortName"] == "aws-k8s"
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        assert spec["preemption"]["withinClusterQueue"] == "LowerPriority"
    assert [q["spec"]["fairSharing"]["weight"] for q in queues] == [50, 30, 20]


def test_flavors_select_their_pool_and_tolerate_its_taints(aws_k8s: ResolvedPlatform) -> None:
    flavors = {
        o["metadata"]["name"]: o["spec"] for o in queue_objects(aws_k8s) if o["kind"] == "ResourceFlavor"
    }
    assert set(flavors) == {"train", "train-spot", TEAM_CAP_FLAVOR}
    assert flavors[TEAM_CAP_FLAVOR] == {}  # quota only: it selects no nodes
    assert flavors["train-spot"]["nodeLabels"] == {
        "workload": "training",
        "gpuplat/pool": "train-spot",
        "gpuplat/role": "train",
        "gpuplat/capacity": "spot",
    }
    assert flavors["train-spot"]["tolerations"][0]["key"] == "gpuplat/spot"
    assert flavors["train"]["tolerations"][0]["key"] == "gpuplat/training"  # every GPU pool is tainted
    # Every queue lists the autoscaled spot pool too, which cannot use topology: no queue does.
    assert "topologyName" not in flavors["train"]


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_every_flavor_of_an_autoscaled_pool_is_reachable(stack: str) -> None:
    """Kueue's topology-aware scheduling counts only ready nodes: a topology flavor on a pool that
    scales out from fewer nodes never fits, no pod is created and the autoscaler never adds a node."""
    platform = load_platform(stack_file(stack))
    flavors = {
        o["metadata"]["name"]: o["spec"] for o in queue_objects(platform) if o["kind"] == "ResourceFlavor"
    }
    for pool in training_flavors(platform):
        if pool.spec.min_nodes < pool.spec.max_nodes:
            assert "topologyName" not in flavors[pool.name], pool.name


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_every_key_a_job_selects_on_is_a_flavor_label(stack: str) -> None:
    """Kueue matches a job's node selector against flavors only on keys some flavor's nodeLabels name;
    another key is ignored in the flavor choice and the pod may land on a flavor it cannot run on."""
    platform = load_platform(stack_file(stack))
    flavors = [
        o["spec"].get("nodeLabels", {}) for o in queue_objects(platform) if o["kind"] == "ResourceFlavor"
    ]
    keys = {key for labels in flavors for key in labels}
    job = example_jobset(platform, platform.spec.scheduler.teams[0].name)
    selector = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert set(selector) <= keys
    assert any(all(labels.get(k) == v for k, v in selector.items()) for labels in flavors)
    for pool in training_flavors(platform):
        assert {LABEL_POOL, LABEL_CAPACITY} <= set(node_labels(pool)) <= keys


def test_the_example_job_asks_for_the_narrowest_network_level(write_stack: Callable[..., Path]) -> None:
    """Where the team's queue uses topology (a stack of fixed EFA pools only)."""

    def fixed_only(platform: dict[str, Any]) -> None:
        platform["pools"] = [p for p in platform["pools"] if p["name"] != "train-spot"]
        for team in platform["scheduler"]["teams"]:
            team.pop("spot_gpu_quota", None)

    aws_k8s = load_platform(write_stack("aws-k8s", fixed_only))
    job = example_jobset(aws_k8s, "research")
    annotations = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/podset-preferred-topology"] == "topology.k8s.aws/network-node-layer-3"
    topology = next(o for o in queue_objects(aws_k8s) if o["kind"] == "Topology")
    assert annotations["kueue.x-k8s.io/podset-preferred-topology"] in [
        level["nodeLabel"] for level in topology["spec"]["levels"]
    ]


def test_every_team_namespace_gets_a_default_local_queue_and_only_v1beta2(aws_k8s: ResolvedPlatform) -> None:
    objects = queue_objects(aws_k8s)
    locals_ = {
        (o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in objects if o["kind"] == "LocalQueue"
    }
    assert locals_ == {("team-research", "research"), ("team-product", "product"), ("team-eval", "eval")}
    assert {o["apiVersion"] for o in objects} == {KUEUE_API}
    priorities = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "WorkloadPriorityClass"}
    assert priorities["high"] > priorities["normal"] > priorities["spot"]


def test_autoscaled_flavors_wait_for_a_provisioning_request(aws_k8s: ResolvedPlatform) -> None:
    """Issue 51, item 8: the spot pool scales from zero and a multi-node job got part of its nodes, held
    them idle until waitForPodsReady evicted it, and tried again. Now Kueue asks the cluster autoscaler
    for the whole workload first (an AdmissionCheck on the autoscaled flavors only)."""
    objects = queue_objects(aws_k8s)
    check = next(o for o in objects if o["kind"] == "AdmissionCheck")
    config = next(o for o in objects if o["kind"] == "ProvisioningRequestConfig")
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"]["name"] == config["metadata"]["name"]
    assert config["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    for queue in (o for o in objects if o["kind"] == "ClusterQueue"):
        (entry,) = queue["spec"]["admissionChecksStrategy"]["admissionChecks"]
        assert entry == {"name": check["metadata"]["name"], "onFlavors": ["train-spot"]}


def test_the_autoscaler_serves_provisioning_requests_with_their_crd() -> None:
    from infra.k8s.operators import releases
    from tests.conftest import fsx_facts

    platform = load_platform(stack_file("aws-k8s"))
    (autoscaler,) = [r for r in releases(platform, fsx_facts()) if r.name == "cluster-autoscaler"]
    assert autoscaler.values["extraArgs"]["enable-provisioning-requests"] is True
    assert autoscaler.values["extraArgs"]["kube-api-content-type"] == "application/json"
    tag = autoscaler.values["image"]["tag"].removeprefix("v")
    assert autoscaler.crd_urls == (
        f"https://raw.githubusercontent.com/kubernetes/autoscaler/cluster-autoscaler-{tag}/"
        "cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml",
    )


def test_fixed_pools_and_clusters_without_the_autoscaler_have_no_provisioning_check() -> None:
    platform = load_platform(stack_file("onprem-k8s"))
    objects = queue_objects(platform)
    assert not [o for o in objects if o["kind"] in ("AdmissionCheck", "ProvisioningRequestConfig")]
    assert all("admissionChecksStrategy" not in o["spec"] for o in objects if o["kind"] == "ClusterQueue")
