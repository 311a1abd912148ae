"""A training pool's alternate instance types and zones (infra/spec: cross_checks._launch_choices,
catalog_checks._alternate_instance_types) and what the resume program is given of them
(infra/backends/aws/bootstrap.py elastic_pool_settings)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.backends.aws.bootstrap import elastic_pool_settings
from infra.errors import ExitCode, SpecError
from infra.platform.resolve import load_platform

TRAIN = 1  # aws-prod's pools: head, train (p5.48xlarge, on-demand), train-spot, infer


def _pool(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        platform["pools"][index].update(fields)

    return mutate


def _without_efa(placement: str) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        platform["fabric"] = {"kind": "none", "placement": placement}

    return mutate


def _both(*mutations: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(platform)

    return mutate


BAD = {
    "alternate-of-another-gpu": (
        _pool(TRAIN, alternate_instance_types=["p4d.24xlarge"]),
        "pools[1].alternate_instance_types[0]: p4d.24xlarge differs from the pool's instance_type "
        "p5.48xlarge: GPU model A100 (not H100); GB per GPU 40 (not 80); vCPUs 96 (not 192); memory GiB "
        "1152 (not 2048); EFA cards 4 (not 32)",
    ),
    "alternate-with-other-efa-cards": (
        _pool(TRAIN, instance_type="p5e.48xlarge", alternate_instance_types=["p5en.48xlarge"]),
        "p5en.48xlarge differs from the pool's instance_type p5e.48xlarge: EFA cards 16 (not 32)",
    ),
    "alternate-unknown": (
        _pool(TRAIN, alternate_instance_types=["p9.48xlarge"]),
        "p9.48xlarge is no aws type of the catalog",
    ),
    "alternate-twice": (
        _pool(TRAIN, instance_type="p5e.48xlarge", alternate_instance_types=["p5en.48xlarge"] * 2),
        "'p5en.48xlarge' is already alternate_instance_types[0]",
    ),
    "alternate-on-an-inference-pool": (
        _pool(3, alternate_instance_types=["g6e.2xlarge"]),
        "pools[3].alternate_instance_types: alternate_instance_types is only given for training pools",
    ),
    "alternate-with-a-reservation": (
        _pool(
            TRAIN,
            capacity="reserved",
            zone="us-east-1a",
            reservation={"kind": "capacity-reservation", "id": "cr-0123456789abcdef0"},
            alternate_instance_types=["p5.48xlarge"],
        ),
        "a capacity-reservation holds one instance type in one zone",
    ),
    "spot-alternate-not-offered-as-spot": (
        _both(
            _pool(
                TRAIN,
                instance_type="p5en.48xlarge",
                alternate_instance_types=["p5e.48xlarge"],
                capacity="spot",
            ),
            _without_efa("cluster"),
        ),
        "pools[1].alternate_instance_types[0]: p5e.48xlarge is not offered as spot, and the pool's "
        "capacity is spot",
    ),
    "zones-with-a-cluster-placement-group": (
        _pool(TRAIN, zones=["us-east-1a", "us-east-1b"]),
        "pools[1].zones: a cluster placement group (fabric.placement, default cluster) lies in one zone",
    ),
    "zones-with-efa": (
        _both(
            _pool(TRAIN, zones=["us-east-1a", "us-east-1b"]), lambda p: p["fabric"].update(placement="spread")
        ),
        "pools[1].zones: p5.48xlarge uses EFA (fabric efa), which does not reach across zones",
    ),
    "zones-and-zone": (
        _both(_pool(TRAIN, zone="us-east-1a", zones=["us-east-1a", "us-east-1b"]), _without_efa("none")),
        "give zone (one) or zones (several), not both",
    ),
    "zones-outside-the-stack": (
        _both(_pool(TRAIN, zones=["us-east-1a", "us-east-1c"]), _without_efa("none")),
        "us-east-1c: not among the stack's zones (us-east-1a, us-east-1b)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_launch_choices_that_break_the_pool_are_one_paragraph(
    case: str, write_stack: Callable[..., Path]
) -> None:
    """Before, the fields did not exist: refused as unknown, whatever they held."""
    mutate, expected = BAD[case]
    path = write_stack("aws-prod", mutate, name=case)
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    assert raised.value.message.startswith(str(path))
    assert expected in raised.value.message
    assert raised.value.exit_code == ExitCode.BAD_INPUT


def test_a_pool_of_one_gpu_shape_over_two_zones_reaches_the_resume_program(
    write_stack: Callable[..., Path],
) -> None:
    """p5e and p5en: 8 H200 141 GB, 192 vCPUs, 2048 GiB (their EFA cards differ: no EFA here)."""
    choices = _pool(
        TRAIN, instance_type="p5e.48xlarge", alternate_instance_types=["p5en.48xlarge"],
        zones=["us-east-1b", "us-east-1a"],
    )  # fmt: skip
    platform = load_platform(write_stack("aws-prod", _both(choices, _without_efa("spread"))))
    subnets = {"us-east-1a": "subnet-a", "us-east-1b": "subnet-b"}
    templates = {"train": "lt-train", "train-spot": "lt-spot"}
    settings = elastic_pool_settings(platform, templates, subnets)
    assert settings["train"] == {
        "launch_template_id": "lt-train",
        "subnet_id": None,
        "static_nodes": ["train-0", "train-1", "train-2", "train-3"],
        "instance_types": ["p5e.48xlarge", "p5en.48xlarge"],
        "subnet_ids": ["subnet-b", "subnet-a"],
        "capacity": "on-demand",
    }
    # one choice: as before, RunInstances on the template's type and subnet
    assert settings["train-spot"]["instance_types"] == [] and settings["train-spot"]["subnet_ids"] == []
    assert settings["train-spot"]["capacity"] == "spot"
