"""`gpuplat down` on an aws Slurm stack: the instances Slurm launched (no Pulumi resources) are terminated
first and waited for, in every state, before `pulumi destroy`; with some left, nothing is destroyed.

EC2 is moto on loopback (AWS_ENDPOINT_URL, as boto3 honours it); the Automation API's stack is a
stand-in whose destroy records what EC2 still had of the fleet at that moment.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from infra.cli.commands import lifecycle
from infra.cli.stack_options import platform_from_options
from infra.errors import GpuPlatError
from infra.lifecycle import cloud_stack, fleet
from tests.conftest import empty_moto_account, moto_image

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

STACK = "aws-prod"  # stacks/Pulumi.aws-prod.yaml: backend aws, Slurm, us-east-1
REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """One server for the module: moto's backend is one per process whichever server asks it, so a server
    per test isolated nothing (each test cleans up what another would wait on)."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    empty_moto_account(url)
    yield url
    empty_moto_account(url)  # its tests launch in the shipped stacks' names, as other modules' tests do
    server.stop()


@pytest.fixture
def ec2(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(fleet, "FLEET_POLL_S", 0.1)
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)


def launch(ec2: Any, stack: str, pool: str, role: str) -> str:
    tags = {"gpuplat:stack": stack, "gpuplat:pool": pool, "gpuplat:role": role}
    [instance] = ec2.run_instances(
        ImageId=moto_image(ec2),
        InstanceType="p5.48xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )["Instances"]
    return str(instance["InstanceId"])


def state(ec2: Any, instance_id: str) -> str:
    return str(
        ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
    )


def fleet_left(ec2: Any) -> list[str]:
    filters = [
        {"Name": "tag:gpuplat:stack", "Values": [STACK]},
        {"Name": "tag:gpuplat:role", "Values": ["train"]},
        {
            "Name": "instance-state-name",
            "Values": ["pending", "running", "shutting-down", "stopping", "stopped"],
        },
    ]
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i["InstanceId"] for r in reservations for i in r["Instances"]]


@pytest.fixture
def destroyed(monkeypatch: pytest.MonkeyPatch, ec2: Any) -> list[list[str]]:
    """What was left of the fleet each time `pulumi destroy` ran."""
    seen: list[list[str]] = []

    class Stack:
        name = STACK

        def destroy(self, on_output: Any = None) -> Any:
            seen.append(fleet_left(ec2))
            return SimpleNamespace(
                summary=SimpleNamespace(resource_changes={"delete": 212}, result="succeeded")
            )

    monkeypatch.setattr(cloud_stack, "open_stack", lambda platform, action, create: Stack())
    return seen


def test_down_terminates_the_slurm_fleet_before_the_destroy(ec2: Any, destroyed: list[list[str]]) -> None:
    ours = [launch(ec2, STACK, "train", "train"), launch(ec2, STACK, "removed-pool", "train")]
    ec2.stop_instances(InstanceIds=[ours[1]])
    controller, other = launch(ec2, STACK, "head", "controller"), launch(ec2, f"{STACK}-2", "train", "train")
    lifecycle.down(stack=STACK, yes=True)
    assert destroyed == [[]], "the destroy ran once, with nothing of the fleet left in any state"
    assert [state(ec2, i) for i in ours] == ["terminated", "terminated"]
    assert state(ec2, controller) == "running", "the controllers are Pulumi's to destroy"
    assert state(ec2, other) == "running", "another stack's fleet is not touched"


def test_with_an_instance_that_will_not_terminate_nothing_is_destroyed(
    ec2: Any, destroyed: list[list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stuck = launch(ec2, STACK, "train", "train")
    ec2.modify_instance_attribute(InstanceId=stuck, DisableApiTermination={"Value": True})
    monkeypatch.setattr(fleet, "FLEET_TIMEOUT_S", 0.3)
    try:
        with pytest.raises(GpuPlatError) as raised:
            lifecycle.down(stack=STACK, yes=True)
    finally:  # moto's backend is one per process: leave nothing another test would wait on
        ec2.modify_instance_attribute(InstanceId=stuck, DisableApiTermination={"Value": False})
        ec2.terminate_instances(InstanceIds=[stuck])
    assert destroyed == []
    assert "instances Slurm launched are still there after 0 s" in raised.value.message
    assert "then run `gpuplat down` again" in raised.value.message
    assert f"teardown: left: {stuck}" in capsys.readouterr().err


def test_a_destroy_that_fails_on_a_node_launched_meanwhile_tears_down_again(
    ec2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld runs until the destroy takes the controllers: a node it launched after the teardown
    fails the destroy (the network it holds); then nothing launches any more."""
    calls: list[list[str]] = []

    def destroy() -> str:
        calls.append(fleet_left(ec2))
        if len(calls) == 1:
            launch(ec2, STACK, "train", "train")
            raise RuntimeError("DependencyViolation: resource sg-0abc has a dependent object")
        return "212 resource(s) deleted (succeeded)"

    launch(ec2, STACK, "train", "train")
    platform = lifecycle.platform_from_options(STACK, None)
    assert (
        fleet.destroy_with_fleet(platform, destroy, lambda line: None)
        == "212 resource(s) deleted (succeeded)"
    )
    assert calls == [[], []]


def test_without_credentials_down_says_so_at_once_and_destroys_nothing(
    ec2: Any, destroyed: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(GpuPlatError) as raised:
        lifecycle.down(stack=STACK, yes=True)
    assert destroyed == []
    assert "cannot list the instances Slurm launched" in raised.value.message
    assert "AWS credentials" in raised.value.message


def test_a_fleet_that_cannot_be_stopped_is_not_torn_down_nor_destroyed(
    ec2: Any, destroyed: list[list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the stop the controllers would launch again during the teardown: nothing is terminated."""
    from gpuplat_ec2_nodes.ec2 import Ec2Nodes

    def denied(self: Any) -> list[str]:
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "CreateTags")

    monkeypatch.setattr(Ec2Nodes, "stop_fleet", denied)
    running = launch(ec2, STACK, "train", "train")
    try:
        with pytest.raises(GpuPlatError) as raised:
            lifecycle.down(stack=STACK, yes=True)
        assert destroyed == []
        assert state(ec2, running) == "running"
    finally:
        ec2.terminate_instances(InstanceIds=[running])
    assert "could not be tagged gpuplat:fleet=stopped" in raised.value.message
    assert "teardown: cannot stop the fleet" in capsys.readouterr().err


def training_template(ec2: Any, stack: str) -> str:
    tags = [{"Key": "gpuplat:stack", "Value": stack}, {"Key": "gpuplat:role", "Value": "train"}]
    created = ec2.create_launch_template(
        LaunchTemplateName=f"{stack}-train-{len(ec2.describe_launch_templates()['LaunchTemplates'])}",
        LaunchTemplateData={"ImageId": moto_image(ec2)},
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
    )
    return str(created["LaunchTemplate"]["LaunchTemplateId"])


def fleet_tag(ec2: Any, template_id: str) -> str | None:
    filters = [{"Name": "resource-id", "Values": [template_id]}, {"Name": "key", "Values": ["gpuplat:fleet"]}]
    tags = ec2.describe_tags(Filters=filters)["Tags"]
    return str(tags[0]["Value"]) if tags else None


def test_up_starts_a_fleet_a_failed_down_left_stopped(
    ec2: Any, destroyed: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Day 2 after a `down` that stopped the fleet and then failed (an instance that would not terminate):
    the templates stay tagged stopped, which `pulumi up` keeps; `gpuplat up` removes the tag, of this
    stack's training templates only, so the stack brought back launches again."""
    from gpuplat_ec2_nodes import teardown as teardown_module

    own, other = training_template(ec2, STACK), training_template(ec2, f"{STACK}-other")
    ec2.create_tags(Resources=[other], Tags=[{"Key": "gpuplat:fleet", "Value": "stopped"}])
    monkeypatch.setattr(teardown_module, "teardown_round", lambda ec2_nodes: None)  # never empty
    monkeypatch.setattr(fleet, "FLEET_TIMEOUT_S", 0.2)
    with pytest.raises(GpuPlatError):
        lifecycle.down(stack=STACK, yes=True)
    assert destroyed == [] and fleet_tag(ec2, own) == "stopped"

    platform = platform_from_options(STACK, None)
    assert "removed from" in fleet.start_fleet(platform)
    assert fleet_tag(ec2, own) is None
    assert fleet_tag(ec2, other) == "stopped", "another stack's stop"
    assert fleet.start_fleet(platform)  # a second `up`: nothing to remove, no error


def test_up_says_when_the_fleet_cannot_be_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing answers at the endpoint: one paragraph saying the stack is up but may launch nothing."""
    unreachable = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    for key, value in {**unreachable, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(GpuPlatError) as raised:
        fleet.start_fleet(platform_from_options(STACK, None))
    assert "could not be removed" in raised.value.message
