"""Placement preferences (scheduler.teams[].placement): the order a team's jobs try the training pools,
from the catalog's GPU figures and prices, and Kueue's queues built on it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.data.load import catalog
from infra.errors import SpecError
from infra.k8s.queues import queue_objects, quota_plan
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.scheduling.placement import _cost_key, gpu_hour_usd, speed_key, training_order, unknown_pools
from tests.conftest import CONFIG_KEY, stack_document
from tests.k8s_schemas import assert_accepted
from tests.unit.test_hostile_input import run_cli


def two_gpu_types(platform: dict[str, Any]) -> None:
    """aws-k8s with an L40S pool beside the H100 one, a performance-first and a cost-first team."""
    pools = platform["pools"]
    l40s = {
        "name": "train-l40s",
        "role": "train",
        "instance_type": "g6e.48xlarge",
        "count": 2,
        "capacity": "on-demand",
        "labels": {"workload": "training"},
    }
    pools.insert(next(i for i, p in enumerate(pools) if p["name"] == "train-spot"), l40s)
    teams = platform["scheduler"]["teams"]
    teams[0]["placement"] = "performance"
    teams[1]["placement"] = "cost"


@pytest.fixture
def mixed(write_stack: Callable[..., Path]) -> ResolvedPlatform:
    return load_platform(write_stack("aws-k8s", two_gpu_types))


def test_every_gpu_of_the_catalog_has_figures_with_their_source() -> None:
    data = catalog()
    for node in data.node_types:
        if node.gpu:
            figures = data.gpu_figures(node.gpu.model)
            assert figures is not None and figures.source.startswith("https://"), node.name


def test_performance_tries_the_fastest_gpus_and_cost_the_cheapest_gpu_hour(mixed: ResolvedPlatform) -> None:
    research, product, eval_ = mixed.spec.scheduler.teams
    pools = {p.name: p for p in mixed.pools_with_role("train")}
    # The catalog's figures that decide it: H100 989 dense BF16 TFLOPS vs L40S 362; $/GPU-hour on demand.
    assert gpu_hour_usd(pools["train-l40s"]) < gpu_hour_usd(pools["train"])
    assert [p.name for p in training_order(mixed, research.placement)] == [
        "train",
        "train-l40s",
        "train-spot",
    ]
    # Cost first is by $ per step: the L40S GPU-hour is cheaper, its step 2.7 x longer (issue 51, item 4).
    assert [p.name for p in training_order(mixed, product.placement)] == ["train", "train-l40s", "train-spot"]
    assert [p.name for p in training_order(mixed, eval_.placement)] == [
        "train",
        "train-l40s",
        "train-spot",
    ]  # the stack's


def test_each_team_queue_lists_its_flavors_in_its_order_and_moves_on_when_full(
    mixed: ResolvedPlatform,
) -> None:
    queues = {o["metadata"]["name"]: o for o in queue_objects(mixed) if o["kind"] == "ClusterQueue"}
    order = {
        name: [f["name"] for f in q["spec"]["resourceGroups"][0]["flavors"]] for name, q in queues.items()
    }
    assert order == {
        "research": ["train", "train-l40s", "train-spot"],
        "product": ["train", "train-l40s", "train-spot"],
        "eval": ["train", "train-l40s", "train-spot"],
    }
    for queue in queues.values():
        # Kueue assigns the first flavor with room; TryNextFlavor: the next rather than borrow or preempt.
        assert queue["spec"]["flavorFungibility"] == {
            "whenCanBorrow": "TryNextFlavor",
            "whenCanPreempt": "TryNextFlavor",
        }
        assert_accepted(queue)


def test_every_flavor_keeps_its_whole_pool_within_the_team_part_so_the_fallback_works(
    mixed: ResolvedPlatform,
) -> None:
    """Issue 51: splitting the cap per flavor gave product (16 on demand, 8 spot) 16 on L40S and 0 on the
    H100s, so 'falls back to H100 when L40S is full' never happened. Each flavor now reaches its whole
    pool or the team's part of the cap, and the cap across flavors is the quota-only group's."""
    reach = {(q.team, q.flavor): q.nominal + q.borrowing_limit for q in quota_plan(mixed).teams}
    assert reach["product", "train-l40s"] == 16 and reach["product", "train"] == 16
    assert reach["product", "train-spot"] == 8
    assert (reach["research", "train"], reach["research", "train-l40s"], reach["research", "train-spot"]) == (
        32,
        16,
        32,
    )
    queues = {o["metadata"]["name"]: o for o in queue_objects(mixed) if o["kind"] == "ClusterQueue"}
    cap = queues["research"]["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]
    assert (cap["name"], cap["nominalQuota"], cap["borrowingLimit"]) == ("gpuplat/team-gpus", 48, 0)


def test_cost_first_is_the_order_of_size_s_dollars_per_step(tmp_path: Path) -> None:
    """`gpuplat size --stack` for an 8B model that fits every pool: the pools sorted by its $ per step
    are the order a cost-first team's queue tries them (on-demand first, as every order)."""
    document = copy.deepcopy(stack_document("aws-k8s"))
    two_gpu_types(document["config"][CONFIG_KEY])
    stack = tmp_path / "Pulumi.mixed.yaml"
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    run = run_cli(
        "size", "--params", "8e9", "--dp", "16", "--zero", "3", "--stack-file", str(stack), "--json"
    )
    assert run.code == 0, run.err
    pools = json.loads(run.out)["pools"]
    assert all(p["fits"] for p in pools)
    on_demand = [p for p in pools if p["pool"] != "train-spot"]
    by_step = [p["pool"] for p in sorted(on_demand, key=lambda p: p["usd_per_step_ratio"])]
    platform = load_platform(stack)
    cost_first = [p.name for p in training_order(platform, "cost") if p.name != "train-spot"]
    assert cost_first == by_step == ["train", "train-l40s"]


def test_an_unknown_preference_is_refused_naming_the_field(write_stack: Callable[..., Path]) -> None:
    def fastest(platform: dict[str, Any]) -> None:
        platform["scheduler"]["teams"][0]["placement"] = "fastest"

    with pytest.raises(SpecError, match=r"scheduler\.teams.*placement"):
        load_platform(write_stack("aws-k8s", fastest))


def test_size_against_the_stack_says_which_pools_fit_and_compares_them_per_step(tmp_path: Path) -> None:
    document = copy.deepcopy(stack_document("aws-k8s"))
    two_gpu_types(document["config"][CONFIG_KEY])
    stack = tmp_path / "Pulumi.mixed.yaml"
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    run = run_cli(
        "size", "--params", "70e9", "--dp", "16", "--zero", "3", "--stack-file", str(stack), "--json"
    )
    assert run.code == 0, run.err
    pools = {p["pool"]: p for p in json.loads(run.out)["pools"]}
    assert pools["train-l40s"]["fits"] is False
    assert pools["train-l40s"]["why_not"].startswith("44.7 GiB per GPU, the run needs")
    h100, spot = pools["train"], pools["train-spot"]
    assert (h100["nodes"], h100["step_time_ratio"], spot["usd_per_step_ratio"]) == (2, 1.0, 1.0)
    # On-demand H100 at $55.04 per node-hour against spot at the catalog's discount, spot's hours
    # stretched by its interruptions (1 a day, 10 min to restart; no step seconds: restart only).
    lost = 1 / 24 * 10 / 60
    assert spot["spot_overhead"] == round(lost, 4) and h100["spot_overhead"] is None
    spot_per_step = pools["train-spot"]["usd_per_hour"] / (1 - lost)
    assert h100["usd_per_step_ratio"] == round(110.08 / spot_per_step, 2)


def test_a_list_preference_puts_the_named_pools_first(write_stack: Callable[..., Path]) -> None:
    def listed(platform: dict[str, Any]) -> None:
        two_gpu_types(platform)
        platform["scheduler"]["teams"][2]["placement"] = ["train-l40s"]

    platform = load_platform(write_stack("aws-k8s", listed))
    eval_ = platform.spec.scheduler.teams[2]
    assert [p.name for p in training_order(platform, eval_.placement)] == [
        "train-l40s",
        "train",
        "train-spot",
    ]


@pytest.mark.parametrize(
    ("stack", "job_classes", "field", "message"),
    [
        ("aws-k8s", [{"name": "fastest", "placement": "performance"}], "scheduler.job_classes",
         "job classes are Slurm partitions"),
        ("aws-prod", [{"name": "train", "placement": "cost"}], "scheduler.job_classes[0].name",
         "which is already the partition of training pool 'train'"),
        ("aws-prod", [{"name": "gpus", "placement": "cost"}], "scheduler.job_classes[0].name",
         "over the on-demand training pools"),
        ("aws-prod", [{"name": "fast", "placement": "cost"}, {"name": "fast", "placement": "performance"}],
         "scheduler.job_classes[1].name", "already job_classes[0]"),
    ],
)  # fmt: skip
def test_job_classes_are_refused_where_they_cannot_be_partitions(
    write_stack: Callable[..., Path], stack: str, job_classes: list[dict[str, str]], field: str, message: str
) -> None:
    def classes(platform: dict[str, Any]) -> None:
        platform["scheduler"]["job_classes"] = job_classes

    path = write_stack(stack, classes)
    result = run_cli("plan", "--stack-file", str(path))
    assert result.code == 2 and result.clean
    assert field in result.err and message in result.err, result.err


def four_gpu_types(platform: dict[str, Any]) -> None:
    """aws-k8s with an L40S pool before its H100 one, then an H200 and a single-A10G pool after it."""
    pools = platform["pools"]
    at = next(i for i, p in enumerate(pools) if p["name"] == "train")
    for offset, (name, instance_type) in enumerate(
        [
            ("train-l40s", "g6e.48xlarge"),
            ("train", None),
            ("train-h200", "p5e.48xlarge"),
            ("train-a10g", "g5.xlarge"),
        ]
    ):
        if instance_type:
            pool = {"name": name, "role": "train", "instance_type": instance_type, "count": 1}
            pools.insert(at + offset, {**pool, "capacity": "on-demand", "labels": {"workload": "training"}})


def test_performance_ranks_tflops_then_bandwidth_and_cost_the_dollars_per_step(
    write_stack: Callable[..., Path],
) -> None:
    """The catalog's figures: H200 and H100 989 dense BF16 TFLOPS (H200 4.8 TB/s of memory bandwidth
    against 3.35), L40S 362, A10G none listed (counts 0: never first on cost); cost is the pool's price
    over its GPUs over the TFLOPS. Spot stays last, and without a preference the stack's order holds."""
    platform = load_platform(write_stack("aws-k8s", four_gpu_types))
    order = {
        str(p): [pool.name for pool in training_order(platform, p)] for p in ("performance", "cost", None)
    }
    assert order == {
        "performance": ["train-h200", "train", "train-l40s", "train-a10g", "train-spot"],
        "cost": ["train-h200", "train", "train-l40s", "train-a10g", "train-spot"],
        "None": ["train-l40s", "train", "train-h200", "train-a10g", "train-spot"],
    }
    pools = {p.name: p for p in platform.pools}
    assert speed_key(pools["train-a10g"]) == (0.0, 600.0)
    assert speed_key(pools["system"]) == (0.0, 0.0)  # no GPU at all
    assert gpu_hour_usd(pools["train"]) == pools["train"].node_usd_per_hour / 8
    assert gpu_hour_usd(pools["train-a10g"]) == pools["train-a10g"].node_usd_per_hour  # one GPU
    assert gpu_hour_usd(pools["system"]) == pools["system"].node_usd_per_hour  # none: the node's price
    # Equal $ per step go to the faster GPU first.
    assert _cost_key(pools["train"]) == (pools["train"].node_usd_per_hour / 8 / 989.0, -989.0)
    assert _cost_key(pools["train-a10g"])[0] == float("inf")


def test_unknown_pools_are_the_listed_names_that_are_no_training_pool(
    write_stack: Callable[..., Path],
) -> None:
    platform = load_platform(write_stack("aws-k8s", four_gpu_types))
    assert unknown_pools(platform, ["train-l40s", "train-a100", "infer"]) == ["train-a100", "infer"]
    assert unknown_pools(platform, ["train", "train-spot"]) == []
    assert unknown_pools(platform, "performance") == unknown_pools(platform, None) == []
