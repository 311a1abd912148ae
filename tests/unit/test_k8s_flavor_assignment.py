"""Every job a team submits is admissible in its queue (issue 51, item 1): each team's example, an
unannotated Job and an unannotated JobSet, checked against every team's ClusterQueue with Kueue's own
matching rules (tests/kueue_admission.py, each rule with its source)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.k8s.objects import GPU_RESOURCE, k8s_object, team_namespace
from infra.k8s.operators import kueue_manager_config
from infra.k8s.queues import queue_objects, topology_queues
from infra.k8s.training import example_jobset
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.kueue_admission import assignable_flavors, flavors_with_room, gpu_flavors
from tests.unit.test_placement import two_gpu_types


def _without_spot(platform: dict[str, Any]) -> None:
    """aws-k8s with its fixed EFA pool only: every queue can use topology."""
    platform["pools"] = [p for p in platform["pools"] if p["name"] != "train-spot"]
    for team in platform["scheduler"]["teams"]:
        team.pop("spot_gpu_quota", None)


VARIANTS: dict[str, Callable[[dict[str, Any]], None] | None] = {
    "aws-k8s": None,
    "onprem-k8s": None,
    "aws-k8s-l40s": two_gpu_types,
    "aws-k8s-fixed-only": _without_spot,
}


@pytest.fixture(params=sorted(VARIANTS))
def platform(request: pytest.FixtureRequest, write_stack: Callable[..., Path]) -> ResolvedPlatform:
    mutate = VARIANTS[request.param]
    if mutate is None:
        return load_platform(stack_file(request.param))
    return load_platform(write_stack(request.param.split("-l40s")[0].split("-fixed")[0], mutate))


def _pod(gpus: int) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
    }
    return {"spec": {"restartPolicy": "Never", "containers": [container]}}


def plain_job(team: str) -> dict[str, Any]:
    """What a member writes without reading the docs: one pod, one GPU, no queue, no selector."""
    return k8s_object("batch/v1", "Job", "plain", team_namespace(team), spec={"template": _pod(1)})


def plain_jobset(team: str, gpus: int) -> dict[str, Any]:
    job = {"parallelism": 1, "completions": 1, "template": _pod(gpus)}
    return k8s_object(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "plain",
        team_namespace(team),
        spec={"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": job}}]},
    )


def _queues(platform: ResolvedPlatform) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = queue_objects(platform)
    queues = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterQueue"}
    flavors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceFlavor"}
    return queues, flavors


TRANSFORMATIONS = kueue_manager_config()["resources"]["transformations"]


def test_each_team_example_is_admissible_in_its_queue(platform: ResolvedPlatform) -> None:
    queues, flavors = _queues(platform)
    for team in platform.spec.scheduler.teams:
        example = example_jobset(platform, team.name)
        assert assignable_flavors(example, queues[team.name], flavors, TRANSFORMATIONS), team.name


def test_unannotated_jobs_can_use_every_flavor_of_every_team_queue(platform: ResolvedPlatform) -> None:
    """An unannotated Job and JobSet fit every GPU flavor a queue lists with room for them: the fallback
    to the next pool (spot included) is open to them, whatever topology the queue uses."""
    queues, flavors = _queues(platform)
    gpus = platform.pools_with_role("train")[0].gpus_per_node
    for name, queue in queues.items():
        listed = flavors_with_room(queue, gpus)
        team = next(t for t in platform.spec.scheduler.teams if t.name == name)
        for workload in (plain_job(name), plain_jobset(name, min(gpus, team.gpu_quota))):
            assignment = assignable_flavors(workload, queue, flavors, TRANSFORMATIONS)
            assert assignment is not None, (name, workload["kind"])
            assert gpu_flavors(assignment) >= listed, (name, workload["kind"], assignment)


def test_a_queue_uses_topology_on_all_its_flavors_or_none(platform: ResolvedPlatform) -> None:
    queues, flavors = _queues(platform)
    for name, queue in queues.items():
        with_topology = {
            "topologyName" in flavors[f["name"]]["spec"]
            for g in queue["spec"]["resourceGroups"]
            for f in g["flavors"]
        }
        assert len(with_topology) == 1, name
        assert with_topology == {name in topology_queues(platform)}


def test_a_stack_of_fixed_efa_pools_keeps_topology_for_every_queue(write_stack: Callable[..., Path]) -> None:
    platform = load_platform(write_stack("aws-k8s", _without_spot))
    assert topology_queues(platform) == {t.name for t in platform.spec.scheduler.teams}


def test_each_team_example_asks_for_no_more_than_the_team_may_hold(platform: ResolvedPlatform) -> None:
    """Issue 51, item 6: eval's example asked for 16 GPUs against a reach of 8 and could never run."""
    for team in platform.spec.scheduler.teams:
        example = example_jobset(platform, team.name)
        job = example["spec"]["replicatedJobs"][0]["template"]["spec"]
        per_pod = job["template"]["spec"]["containers"][0]["resources"]["requests"][GPU_RESOURCE]
        assert 0 < job["parallelism"] * per_pod <= team.gpu_quota, team.name


def test_examples_are_multi_node_where_the_team_reaches_two_nodes() -> None:
    platform = load_platform(stack_file("aws-k8s"))
    sizes = {
        t.name: example_jobset(platform, t.name)["spec"]["replicatedJobs"][0]["template"]["spec"][
            "parallelism"
        ]
        for t in platform.spec.scheduler.teams
    }
    assert sizes == {"research": 2, "product": 2, "eval": 1}


def test_a_team_whose_cap_is_all_spot_gets_an_example_on_spot(write_stack: Callable[..., Path]) -> None:
    """product with spot_gpu_quota equal to its cap may hold no on-demand GPU: its example asks for the
    spot pool's GPUs (not 0 GPUs on on-demand, which no flavor admits and whose shell divides by 0)."""

    def all_spot(platform: dict[str, Any]) -> None:
        product = next(t for t in platform["scheduler"]["teams"] if t["name"] == "product")
        product["spot_gpu_quota"] = product["gpu_quota"]

    platform = load_platform(write_stack("aws-k8s", all_spot))
    queues, flavors = _queues(platform)
    example = example_jobset(platform, "product")
    assignment = assignable_flavors(example, queues["product"], flavors, TRANSFORMATIONS)
    assert assignment and gpu_flavors(assignment) == {"train-spot"}
