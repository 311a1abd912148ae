"""A training pool's launch template where Slurm launches it through an instant EC2 Fleet
(roles/slurm_elastic/files/gpuplat_ec2_nodes/ec2.py, Ec2Nodes.fleet_request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.plan.record import Recording, record
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]


def fleet_stack_file(directory: Path, zone_count: int | None = None) -> Path:
    """aws-prod with the train pool on p5e or p5en, in the first `zone_count` zones (all by default;
    no EFA, which does not span zones)."""
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.aws-prod.yaml").read_text())
    [key] = [k for k in document["config"] if k.endswith(":platform")]
    platform = document["config"][key]
    platform["fabric"] = {"kind": "none", "placement": "spread"}
    train = next(p for p in platform["pools"] if p["name"] == "train")
    train.update(
        instance_type="p5e.48xlarge",
        alternate_instance_types=["p5en.48xlarge"],
        zones=platform["zones"][:zone_count],
    )
    path = directory / "Pulumi.aws-prod.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def train_interfaces(recording: Recording) -> list[dict[str, Any]]:
    return list(recording.named("aws-prod-train-lt").inputs["networkInterfaces"])


@pytest.mark.parametrize("zone_count", [2, 1])
def test_a_fleet_pool_template_names_a_subnet_only_where_no_override_does(
    tmp_path: Path, zone_count: int
) -> None:
    """Several zones: the fleet's overrides give each launch its subnet, and the template's interfaces
    name none, as ParallelCluster's CreateFleet templates (aws-parallelcluster v3.11.0,
    cli/src/pcluster/templates/queues_stack.py:161: a subnet only for a SlurmComputeResource, which
    launches through RunInstances; aws/aws-parallelcluster#4521 "Include SubnetID only when using
    RunInstances API"). Before, the first zone's subnet was in the template beside a second zone's in
    the override. One zone: the overrides name only instance types, and the template keeps its subnet."""
    recording = record(load_platform(fleet_stack_file(tmp_path, zone_count)))
    interfaces = train_interfaces(recording)
    assert interfaces
    subnets = [interface.get("subnetId") for interface in interfaces]
    if zone_count > 1:
        assert subnets == [None] * len(interfaces), subnets
    else:
        assert all(subnets), subnets
