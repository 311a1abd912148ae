"""Where FSx for Lustre goes: the training pools' zone, and a plan-time word when they have none in
common (policy rule placement-filesystem-zone)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.platform.zones import filesystem_zone, training_zones
from infra.policy.check import verdicts_for
from infra.policy.rules import Verdict
from infra.policy.settings import PolicyConfig

FS = "aws-prod-fs-lustre"
RULE = "placement-filesystem-zone"


def _pool(platform: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in platform["pools"] if p["name"] == name)


def _zones(**zones: str) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        for pool, zone in zones.items():
            _pool(platform, pool.replace("_", "-"))["zone"] = zone

    return mutate


def _plan(write_stack: Callable[..., Path], mutate: Callable[[dict[str, Any]], None]) -> tuple[
    ResolvedPlatform, Recording, list[Verdict]
]:  # fmt: skip
    platform = load_platform(write_stack("aws-prod", mutate))
    recording = record(platform)
    return (
        platform,
        recording,
        [v for v in verdicts_for(platform, recording, PolicyConfig()) if v.rule == RULE],
    )


def test_filesystem_follows_training_pools_pinned_to_another_zone(write_stack: Callable[..., Path]) -> None:
    """A reservation exists in one zone; the training pools sit there, and so must the filesystem."""

    def reserved_in_b(platform: dict[str, Any]) -> None:
        train = _pool(platform, "train")
        train["capacity"] = "reserved"
        train["reservation"] = {"kind": "capacity-reservation", "id": "cr-0123456789abcdef0"}
        _zones(train="us-east-1b", train_spot="us-east-1b")(platform)

    platform, recording, found = _plan(write_stack, reserved_in_b)
    assert filesystem_zone(platform) == "us-east-1b"
    assert recording.named(FS).inputs["subnetIds"] == "aws-prod-private-us-east-1b-id"
    assert found == []


def test_shipped_stack_keeps_its_filesystem_with_the_training_pools(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    platform = shipped_platforms["aws-prod"]
    assert set(training_zones(platform).values()) == {"us-east-1a"} == {filesystem_zone(platform)}
    assert record(platform).named(FS).inputs["subnetIds"] == "aws-prod-private-us-east-1a-id"


def test_training_pools_in_different_zones_are_named_at_plan_time(write_stack: Callable[..., Path]) -> None:
    # train: 4 p5 (32 GPUs) in us-east-1a; train-spot: up to 4 p5 (32 GPUs) in us-east-1b: a tie, the
    # stack's zone order decides, and the pool left across the zones is named with both zones.
    _, recording, found = _plan(write_stack, _zones(train_spot="us-east-1b"))
    assert recording.named(FS).inputs["subnetIds"] == "aws-prod-private-us-east-1a-id"
    (verdict,) = found
    assert verdict.severity == "advisory" and verdict.resource == "aws-prod-train-spot-lt"
    assert "train-spot launches in us-east-1b" in verdict.message and "us-east-1a" in verdict.message
    assert "train in us-east-1a, train-spot in us-east-1b" in verdict.message


@pytest.mark.parametrize(("spot_max", "zone"), [(4, "us-east-1a"), (8, "us-east-1b")])
def test_filesystem_goes_where_most_training_gpus_are(
    write_stack: Callable[..., Path], spot_max: int, zone: str
) -> None:
    def split(platform: dict[str, Any]) -> None:
        _zones(train_spot="us-east-1b")(platform)
        _pool(platform, "train-spot")["max"] = spot_max
        platform["budget"]["max_gpus"] = 200
        platform["budget"]["max_hourly_usd"] = 2000

    platform = load_platform(write_stack("aws-prod", split))
    assert filesystem_zone(platform) == zone
