"""Kueue quotas from the teams: guarantees add up to the GPUs that exist, caps hold, spot comes last."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.k8s.queues import KUEUE_API, _split, queue_objects, quota_plan, training_flavors
from infra.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file


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
    assert set(flavors) == {"train", "train-spot"}
    assert flavors["train-spot"]["nodeLabels"] == {"gpuplat/pool": "train-spot"}
    assert flavors["train-spot"]["tolerations"][0]["key"] == "gpuplat/spot"
    assert "tolerations" not in flavors["train"]
    assert flavors["train"]["topologyName"] == "aws-k8s-network"


def test_every_team_namespace_gets_a_default_local_queue_and_only_v1beta2(aws_k8s: ResolvedPlatform) -> None:
    objects = queue_objects(aws_k8s)
    locals_ = {
        (o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in objects if o["kind"] == "LocalQueue"
    }
    assert locals_ == {("team-research", "research"), ("team-product", "product"), ("team-eval", "eval")}
    assert {o["apiVersion"] for o in objects} == {KUEUE_API}
    priorities = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "WorkloadPriorityClass"}
    assert priorities["high"] > priorities["normal"] > priorities["spot"]
