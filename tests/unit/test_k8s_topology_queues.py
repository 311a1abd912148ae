"""The per-queue topology decision (infra.k8s.queues.topology_queues) on stacks where each of its three
rules decides: a pool that cannot use topology, a queue with a cap group, a flavor shared with a queue
that uses none. Every unannotated Job and JobSet must still fit every flavor it may reach (Kueue's
matching rules: tests/kueue_admission.py), and only fixed EFA pools' flavors carry a topology."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.k8s.queues import topology_flavors, topology_queues, uses_topology
from infra.platform.resolve import ResolvedPlatform, load_platform
from tests.kueue_admission import assignable_flavors, flavors_with_room, gpu_flavors
from tests.unit.test_k8s_flavor_assignment import TRANSFORMATIONS, _queues, plain_job, plain_jobset


def _team(platform: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in platform["scheduler"]["teams"] if t["name"] == name)


def _no_cap_groups(platform: dict[str, Any]) -> None:
    """aws-k8s where no team's flavors reach past its cap (research takes both pools whole, eval no
    spot): only the spot pool, which scales, keeps the queues off topology."""
    _team(platform, "research")["gpu_quota"] = 64
    _team(platform, "eval")["spot_gpu_quota"] = 0


def _two_fixed_pools(platform: dict[str, Any]) -> None:
    """Two fixed EFA pools, no spot: research takes both whole (no cap group), product and eval need
    one; all three share both flavors."""
    pools = platform["pools"]
    train = next(p for p in pools if p["name"] == "train")
    platform["pools"] = [p for p in pools if p["name"] != "train-spot"] + [{**train, "name": "train-b"}]
    for team in platform["scheduler"]["teams"]:
        team.pop("spot_gpu_quota", None)
    _team(platform, "research")["gpu_quota"] = 64


VARIANTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "no-cap-groups": _no_cap_groups,
    "two-fixed-pools": _two_fixed_pools,
}


@pytest.fixture(params=sorted(VARIANTS))
def platform(request: pytest.FixtureRequest, write_stack: Callable[..., Path]) -> ResolvedPlatform:
    return load_platform(write_stack("aws-k8s", VARIANTS[request.param]))


def test_only_pools_that_can_use_topology_have_it(platform: ResolvedPlatform) -> None:
    capable = {p.name for p in platform.pools_with_role("train") if uses_topology(platform, p)}
    assert topology_flavors(platform) <= capable


def test_unannotated_jobs_fit_every_flavor_they_reach(platform: ResolvedPlatform) -> None:
    queues, flavors = _queues(platform)
    gpus = platform.pools_with_role("train")[0].gpus_per_node
    for name, queue in queues.items():
        reachable = flavors_with_room(queue, gpus)
        for workload in (plain_job(name), plain_jobset(name, gpus)):
            assignment = assignable_flavors(workload, queue, flavors, TRANSFORMATIONS)
            assert assignment is not None, (name, workload["kind"])
            assert gpu_flavors(assignment) >= reachable, (name, workload["kind"], assignment)


def test_a_queue_with_a_cap_group_or_sharing_a_flavor_with_one_uses_no_topology(
    write_stack: Callable[..., Path],
) -> None:
    """Two fixed EFA pools: every pool could use topology, but product and eval need a cap group (whose
    flavor has none) and research shares both flavors with them."""
    platform = load_platform(write_stack("aws-k8s", _two_fixed_pools))
    assert topology_queues(platform) == set()
