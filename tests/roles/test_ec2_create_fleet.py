"""Pools with several instance types or subnets launch through an instant EC2 Fleet (ec2.py,
Ec2Nodes.fleet_request), all or nothing per job, in batches of 500.

What moto 5.2.6 emulates of CreateFleet (moto/ec2/models/fleets.py): type instant answers the instances
(InstanceIds, InstanceType, LaunchTemplateAndOverrides), the overrides' InstanceType and SubnetId are
applied, instance and fleet tags at launch are kept. What it does not: MinTargetCapacity,
SingleAvailabilityZone and the allocation strategies (it fills the capacity from the overrides in
order), capacity errors, and the Errors array of a partial instant fleet (it never fills it). Those
parts run against botocore's Stubber, which checks every request against the real EC2 service model
(botocore 1.44.18, data/ec2/2016-11-15/service-2.json) and answers what EC2 answers there.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from gpuplat_ec2_nodes import ec2 as program_ec2
from gpuplat_ec2_nodes.ec2 import LAUNCH_BATCH_MAX, Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK, UsageError
from gpuplat_ec2_nodes.holds import hold_reason, read_holds
from gpuplat_ec2_nodes.resume import resume
from gpuplat_ec2_nodes.resume_file import ResumeJob
from gpuplat_ec2_nodes.settings import Pool, Settings, load_settings, parse_pool
from gpuplat_ec2_nodes.slurm import Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import REGION, Cloud, RecordingEc2, SlurmRecorder

boto3 = pytest.importorskip("boto3")
moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

ICE = "InsufficientInstanceCapacity"
TYPES = ["p5e.48xlarge", "p5en.48xlarge"]


@pytest.fixture(scope="module")
def second_subnet(moto_cloud: Cloud) -> str:
    vpc = moto_cloud.ec2.describe_subnets(SubnetIds=[moto_cloud.subnet_id])["Subnets"][0]["VpcId"]
    return str(moto_cloud.ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.2.0/24")["Subnet"]["SubnetId"])


def fleet_settings(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, subnets: list[str], **pool: Any
) -> Settings:
    """The config file's pool as resume reads it: instance types and subnets beside the template."""
    entry = {
        "launch_template_id": cloud.launch_template_id,
        "subnet_id": cloud.subnet_id,
        "instance_types": TYPES,
        "subnet_ids": subnets,
        **pool,
    }
    pools = {"train": parse_pool("train", entry)}
    return Settings(cloud.stack, REGION, slurm.scontrol, pools, state_dir=tmp_path / "state")


class FleetRecorder(RecordingEc2):
    """The moto client, with every launch request kept."""

    def __init__(self, client: Any, slurm: SlurmRecorder) -> None:
        super().__init__(client, slurm)
        self.fleets: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []

    def create_fleet(self, **request: Any) -> Any:
        self.fleets.append(request)
        return self.client.create_fleet(**request)

    def run_instances(self, **request: Any) -> Any:
        self.runs.append(request)
        return self.client.run_instances(**request)


def recorded(cloud: Cloud, slurm: SlurmRecorder) -> tuple[Ec2Nodes, FleetRecorder]:
    client = FleetRecorder(boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url), slurm)
    return Ec2Nodes(client, cloud.stack), client


def test_a_pool_with_alternates_launches_a_job_through_one_instant_fleet(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, second_subnet: str
) -> None:
    """Before, the pool's instance types and subnets were ignored: RunInstances on the template's one
    type and subnet, however many the pool may use."""
    settings = fleet_settings(tmp_path, cloud, slurm, [cloud.subnet_id, second_subnet])
    nodes, client = recorded(cloud, slurm)
    job = ResumeJob("42", ("train-1", "train-2"))
    assert resume(settings, nodes, Slurm(slurm.scontrol), ["train-1", "train-2"], jobs=[job]) == EXIT_OK
    assert client.runs == []
    [request] = client.fleets
    assert request["Type"] == "instant"
    [config] = request["LaunchTemplateConfigs"]
    assert config["LaunchTemplateSpecification"]["LaunchTemplateId"] == cloud.launch_template_id
    assert config["Overrides"] == [
        {"InstanceType": kind, "SubnetId": subnet}
        for kind in TYPES
        for subnet in (cloud.subnet_id, second_subnet)
    ]
    assert request["TargetCapacitySpecification"] == {
        "TotalTargetCapacity": 2,
        "DefaultTargetCapacityType": "on-demand",
    }
    assert request["OnDemandOptions"] == {
        "AllocationStrategy": "lowest-price",
        "SingleAvailabilityZone": True,
        "MinTargetCapacity": 2,
    }
    instances = {harness.program_ec2.tag_value(i, "gpuplat:node"): i for i in cloud.instances()}
    assert sorted(instances) == ["train-1", "train-2"]
    for instance in instances.values():
        assert instance["State"]["Name"] in ("pending", "running")
        assert instance["InstanceType"] in TYPES
        assert instance["SubnetId"] in (cloud.subnet_id, second_subnet)
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert (tags["gpuplat:stack"], tags["gpuplat:pool"], tags["gpuplat:role"]) == (
            cloud.stack,
            "train",
            "train",
        )
    assert set(harness.address_updates(slurm)) == {"train-1", "train-2"}


def test_a_spot_pool_asks_the_fleet_for_spot_capacity_optimized(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, second_subnet: str
) -> None:
    settings = fleet_settings(tmp_path, cloud, slurm, [second_subnet], capacity="spot")
    nodes, client = recorded(cloud, slurm)
    assert resume(settings, nodes, Slurm(slurm.scontrol), ["train-3"]) == EXIT_OK
    [request] = client.fleets
    assert request["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "spot"
    assert request["SpotOptions"] == {
        "AllocationStrategy": "capacity-optimized",
        "SingleAvailabilityZone": True,
        "MinTargetCapacity": 1,
    }
    assert "OnDemandOptions" not in request


def test_a_pool_with_one_choice_keeps_run_instances(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    settings = fleet_settings(tmp_path, cloud, slurm, [], instance_types=[])
    nodes, client = recorded(cloud, slurm)
    assert resume(settings, nodes, Slurm(slurm.scontrol), ["train-4"]) == EXIT_OK
    assert client.fleets == []
    assert [(r["MinCount"], r["MaxCount"], r["SubnetId"]) for r in client.runs] == [(1, 1, cloud.subnet_id)]


# --- what moto does not emulate: botocore's Stubber against the real service model --------------------


@pytest.fixture
def stubbed(cloud: Cloud, slurm: SlurmRecorder) -> Iterator[tuple[Ec2Nodes, Stubber]]:
    """Launches answered by the Stubber (requests validated against EC2's model), the rest by moto."""
    launch_client = boto3.client("ec2", region_name=REGION)
    with Stubber(launch_client) as stubber:
        client = RecordingEc2(boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url), slurm)
        yield Ec2Nodes(client, cloud.stack, launch_client=launch_client), stubber
        stubber.assert_no_pending_responses()


def moto_instances(cloud: Cloud, count: int) -> list[str]:
    """Instances that exist in moto, for the Stubber's fleet to name (tagged as a launch tags them)."""
    tags = [{"Key": "gpuplat:stack", "Value": cloud.stack}, {"Key": "gpuplat:role", "Value": "train"}]
    reply = cloud.ec2.run_instances(
        LaunchTemplate={"LaunchTemplateId": cloud.launch_template_id},
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return [i["InstanceId"] for i in reply["Instances"]]


def fleet_answer(instance_ids: list[str], errors: list[str]) -> dict[str, Any]:
    """CreateFleet's answer for an instant fleet (CreateFleetResult): started instances, and one
    CreateFleetError per override EC2 could not launch."""
    return {
        "FleetId": "fleet-0123456789abcdef0",
        "Instances": [{"InstanceIds": instance_ids, "InstanceType": TYPES[0], "Lifecycle": "on-demand"}]
        if instance_ids
        else [],
        "Errors": [
            {
                "ErrorCode": code,
                "ErrorMessage": "We currently do not have sufficient capacity in the Availability Zone",
                "Lifecycle": "on-demand",
                "LaunchTemplateAndOverrides": {
                    "Overrides": {"InstanceType": TYPES[1], "SubnetId": "subnet-1"}
                },
            }
            for code in errors
        ],
    }


def test_an_instant_fleet_short_of_a_job_gets_it_no_node(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, stubbed: tuple[Ec2Nodes, Stubber]
) -> None:
    """EC2 answers a partial instant fleet with the instances it started and an Errors array, not an
    API error; a job's names never run on part of their instances: what started is terminated."""
    nodes, stubber = stubbed
    [started] = moto_instances(cloud, 1)
    stubber.add_response("create_fleet", fleet_answer([started], [ICE]))
    settings = fleet_settings(tmp_path, cloud, slurm, ["subnet-1", "subnet-2"])
    job = ResumeJob("7", ("train-1", "train-2"))
    assert resume(settings, nodes, Slurm(slurm.scontrol), ["train-1", "train-2"], jobs=[job]) == EXIT_FAILED
    assert cloud.state(started) == "terminated"
    assert "gpuplat:node" not in {t["Key"] for t in cloud.describe(started)["Tags"]}, "never given a name"
    assert harness.address_updates(slurm) == {}
    downs = [call for call in slurm.calls() if "state=power_down_force" in call]
    assert downs and all(call[-1] == f"reason=gpuplat resume failed: {ICE}" for call in downs)


def test_a_fleet_that_started_nothing_holds_the_pool_on_its_capacity_error(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, stubbed: tuple[Ec2Nodes, Stubber]
) -> None:
    """The capacity cool-down (holds.py) reads the code from the fleet's Errors array, one per override
    that failed: a capacity error among them holds the pool, whatever the others say."""
    nodes, stubber = stubbed
    stubber.add_response("create_fleet", fleet_answer([], ["InvalidParameterValue", ICE]))
    settings = replace(
        fleet_settings(tmp_path, cloud, slurm, ["subnet-1", "subnet-2"]), insufficient_capacity_timeout_s=600
    )
    slurm.nodes("")
    assert resume(settings, nodes, Slurm(slurm.scontrol), ["train-1"]) == EXIT_FAILED
    assert hold_reason(read_holds(settings), "train", time.time()) is not None


def test_a_throttled_fleet_request_is_asked_again(
    tmp_path: Path,
    cloud: Cloud,
    slurm: SlurmRecorder,
    stubbed: tuple[Ec2Nodes, Stubber],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes, stubber = stubbed
    monkeypatch.setattr(program_ec2.time, "sleep", lambda _s: None)
    [started] = moto_instances(cloud, 1)
    stubber.add_client_error("create_fleet", "RequestLimitExceeded", http_status_code=503)
    stubber.add_response("create_fleet", fleet_answer([started], []))
    settings = fleet_settings(tmp_path, cloud, slurm, ["subnet-1", "subnet-2"])
    launched, code = nodes.launch(settings.pools["train"], ["train-5"])
    assert (list(launched), code) == (["train-5"], None)


# --- batches of 500 -----------------------------------------------------------------------------------


class CountingEc2:
    """EC2 that starts whatever it is asked (ids only) and keeps the requests: 501 launches without
    501 instances in moto."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.started = 0

    def ids(self, count: int) -> list[str]:
        self.started += count
        return [f"i-{n:017x}" for n in range(self.started - count, self.started)]

    def run_instances(self, **request: Any) -> dict[str, Any]:
        self.requests.append(("run_instances", request))
        return {"Instances": [{"InstanceId": i} for i in self.ids(request["MaxCount"])]}

    def create_fleet(self, **request: Any) -> dict[str, Any]:
        """Everything in the last override's subnet (an instant fleet answers where it launched)."""
        self.requests.append(("create_fleet", request))
        count = request["TargetCapacitySpecification"]["TotalTargetCapacity"]
        subnet = request["LaunchTemplateConfigs"][0]["Overrides"][-1].get("SubnetId")
        return {"Instances": [{"InstanceIds": self.ids(count), "SubnetId": subnet}], "Errors": []}

    def create_tags(self, **_request: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("pool", "sizes"),
    [
        (Pool("train", "lt-1", None, ()), lambda r: (r["MinCount"], r["MaxCount"])),
        (
            Pool("train", "lt-1", None, (), instance_types=tuple(TYPES)),
            lambda r: (
                r["OnDemandOptions"]["MinTargetCapacity"],
                r["TargetCapacitySpecification"]["TotalTargetCapacity"],
            ),
        ),
    ],
    ids=["run_instances", "create_fleet"],
)
def test_a_job_of_more_than_500_nodes_launches_in_batches_of_500(pool: Pool, sizes: Any) -> None:
    """ParallelCluster's launch_max_batch_size; an instant fleet's MinTargetCapacity is at most 1000.
    Before, one request for all of them."""
    client = CountingEc2()
    names = [f"train-{i}" for i in range(LAUNCH_BATCH_MAX + 1)]
    launched, code = Ec2Nodes(client, "stack").launch(pool, names, all_or_nothing=True)
    assert (len(launched), code) == (len(names), None)
    assert [sizes(request) for _call, request in client.requests] == [(500, 500), (1, 1)]


def test_the_batches_of_a_job_go_to_the_zone_of_its_first() -> None:
    """Each instant fleet keeps its instances in one zone; a job of more than one batch would otherwise
    get its later batches wherever EC2 finds capacity, and its nodes in two zones."""
    client = CountingEc2()
    pool = Pool("train", "lt-1", None, (), tuple(TYPES), ("subnet-a", "subnet-b"))
    names = [f"train-{i}" for i in range(LAUNCH_BATCH_MAX + 1)]
    launched, code = Ec2Nodes(client, "stack").launch(pool, names, all_or_nothing=True)
    assert (len(launched), code) == (len(names), None)
    first, second = (request["LaunchTemplateConfigs"][0]["Overrides"] for _call, request in client.requests)
    assert {o["SubnetId"] for o in first} == {"subnet-a", "subnet-b"}
    assert second == [{"InstanceType": kind, "SubnetId": "subnet-b"} for kind in TYPES]


class OneZoneFleetEc2(CountingEc2):
    """An instant fleet answers the subnet its instances went to (CreateFleetInstance.SubnetId, botocore
    1.44.18's EC2 model), also where the overrides name none and the template's interfaces do."""

    def create_fleet(self, **request: Any) -> dict[str, Any]:
        self.requests.append(("create_fleet", request))
        count = request["TargetCapacitySpecification"]["TotalTargetCapacity"]
        return {"Instances": [{"InstanceIds": self.ids(count), "SubnetId": "subnet-template"}], "Errors": []}


def test_the_later_batches_of_a_one_zone_pool_keep_its_alternate_types() -> None:
    """One zone (the template's subnet, overrides of instance type only): the later batches are pinned
    to that zone already, and keep every instance type. Before, the pin filtered out every override
    (none names the subnet EC2 answered), so the later batches asked for the template's type only."""
    client = OneZoneFleetEc2()
    pool = Pool("train", "lt-1", None, (), tuple(TYPES))
    names = [f"train-{i}" for i in range(LAUNCH_BATCH_MAX + 1)]
    launched, code = Ec2Nodes(client, "stack").launch(pool, names, all_or_nothing=True)
    assert (len(launched), code) == (len(names), None)
    first, second = (request["LaunchTemplateConfigs"][0]["Overrides"] for _call, request in client.requests)
    assert first == second == [{"InstanceType": kind} for kind in TYPES]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"capacity": "reserved"}, "pool train: capacity must be one of on-demand, spot, not 'reserved'"),
        ({"instance_types": "p5e.48xlarge"}, "pool train: instance_types must be a list of names"),
        ({"subnet_ids": ["subnet-a", ""]}, "pool train: subnet_ids must be a list of names"),
        ({"instance_types": TYPES + TYPES[:1]}, "pool train: instance_types lists a name twice"),
    ],
    ids=["capacity", "not-a-list", "empty-name", "twice"],
)
def test_a_malformed_pool_choice_is_a_usage_error_naming_the_pool_and_key(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    """The config file's pool keys (bootstrap.py writes them): one clear message, exit 2 (UsageError),
    never a fleet request over a wrong list."""
    config = tmp_path / "ec2-nodes.json"
    pool = {"launch_template_id": "lt-1", "subnet_id": None, "static_nodes": [], **entry}
    config.write_text(json.dumps({"stack": "s", "region": REGION, "pools": {"train": pool}}))
    with pytest.raises(UsageError, match=re.escape(message)):
        load_settings(config)


def test_a_pool_of_one_subnet_gives_it_to_every_override() -> None:
    """A pool whose config names its subnet (subnet_id) beside alternate types: each override carries
    it, as RunInstances would."""
    pool = Pool("train", "lt-1", "subnet-own", (), tuple(TYPES))
    request = Ec2Nodes(CountingEc2(), "stack").fleet_request(pool, 2, all_or_nothing=True)
    assert request["LaunchTemplateConfigs"][0]["Overrides"] == [
        {"InstanceType": kind, "SubnetId": "subnet-own"} for kind in TYPES
    ]
    assert {spec["ResourceType"] for spec in request["TagSpecifications"]} == {"instance", "fleet"}
