"""EC2 answers the resume program must ask again for (gpuplat_ec2_nodes/ec2.py, retried): a throttled
RunInstances (RequestLimitExceeded; botocore asks RunInstances once, so that capacity errors come back
at once) and CreateTags on an instance not yet visible (InvalidInstanceID.NotFound, EC2's eventual
consistency). Through the program's own boto3 clients (ec2_nodes) and the box's fault proxy in front
of moto, which answers the armed fault with EC2's error document.

moto is consistent at once: the NotFound answer is injected, as EC2 gives it for a moment after launch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuplat_ec2_nodes import ec2 as program_ec2
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.resume import resume
from gpuplat_ec2_nodes.slurm import Slurm

from tests.box.emulator import FaultProxy, Faults
from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import CREDENTIALS, REGION, Cloud, SlurmRecorder, settings_for

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm


@pytest.fixture
def faults(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Faults, str]]:
    """Armed faults and the proxy's URL; back-off shortened to milliseconds."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(program_ec2, "RETRY_BASE_S", 0.01)
    armed = Faults()
    upstream = int(cloud.url.rsplit(":", 1)[1])
    client = harness.boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    proxy = FaultProxy("127.0.0.1", upstream, armed, client)
    yield armed, proxy.url
    proxy.stop()


def resume_through(url: str, tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, *names: str) -> int:
    ec2 = program_ec2.ec2_nodes(REGION, url, cloud.stack)
    return int(resume(settings_for(tmp_path, cloud, slurm), ec2, Slurm(slurm.scontrol), list(names)))


def test_a_throttled_launch_is_asked_again(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, faults: tuple[Faults, str]
) -> None:
    armed, url = faults
    armed.arm("RunInstances", "RequestLimitExceeded", times=2)
    assert resume_through(url, tmp_path, cloud, slurm, "train-0") == EXIT_OK
    assert armed.count("RunInstances") == 3
    assert list(cloud.node_instances("running") or cloud.node_instances("pending")) == ["train-0"]


def test_a_tag_on_an_instance_not_yet_visible_is_asked_again(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, faults: tuple[Faults, str]
) -> None:
    """Before: the instance was terminated and the name powered down, its job requeued for nothing."""
    armed, url = faults
    armed.arm("CreateTags", "InvalidInstanceID.NotFound", times=3)
    assert resume_through(url, tmp_path, cloud, slurm, "train-1") == EXIT_OK
    assert armed.count("CreateTags") == 4
    [instance] = cloud.instances(gpuplat_node="train-1")
    assert instance["State"]["Name"] in ("pending", "running")


def test_retries_end_and_the_instance_goes(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, faults: tuple[Faults, str]
) -> None:
    armed, url = faults
    armed.arm("CreateTags", "InvalidInstanceID.NotFound", times=program_ec2.RETRY_ATTEMPTS)
    assert resume_through(url, tmp_path, cloud, slurm, "train-2") == EXIT_FAILED
    assert armed.count("CreateTags") == program_ec2.RETRY_ATTEMPTS
    [instance] = cloud.instances()
    assert instance["State"]["Name"] == "terminated", "an instance without its name is not left running"
    assert slurm.calls()[-1][-1] == "reason=gpuplat resume failed: TaggingFailed"


def test_a_capacity_error_is_still_asked_once(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, faults: tuple[Faults, str]
) -> None:
    armed, url = faults
    armed.arm("RunInstances", "InsufficientInstanceCapacity", times=1)
    assert resume_through(url, tmp_path, cloud, slurm, "train-3") == EXIT_FAILED
    assert armed.count("RunInstances") == 1


def test_the_box_proxy_starts_what_ec2_would(cloud: Cloud, faults: tuple[Faults, str]) -> None:
    """The box's proxy in front of moto (tests/box/emulator.py): moto starts exactly MinCount, EC2 as
    many as it can up to MaxCount and none below MinCount; so every multi-name resume took the partial
    path in the box before."""
    armed, url = faults
    client = harness.boto3.client("ec2", region_name=REGION, endpoint_url=url)
    request = {"LaunchTemplate": {"LaunchTemplateId": cloud.launch_template_id}, "SubnetId": cloud.subnet_id}
    assert len(client.run_instances(MinCount=1, MaxCount=3, **request)["Instances"]) == 3
    armed.limit_capacity(2)
    with pytest.raises(harness.botocore_exceptions.ClientError, match="InsufficientInstanceCapacity"):
        client.run_instances(MinCount=3, MaxCount=3, **request)
    assert len(client.run_instances(MinCount=1, MaxCount=3, **request)["Instances"]) == 2
    with pytest.raises(harness.botocore_exceptions.ClientError, match="InsufficientInstanceCapacity"):
        client.run_instances(MinCount=1, MaxCount=1, **request)


def test_the_box_proxy_refuses_one_templates_capacity_and_applies_its_shutdown_behaviour(
    cloud: Cloud, faults: tuple[Faults, str]
) -> None:
    """The box's proxy: capacity refused for one launch template only (box scenario k: one pool
    without capacity), and the template's InstanceInitiatedShutdownBehavior applied to the launch, as
    EC2 applies it (moto takes it from the request only; the box's hypervisor terminates an instance
    that powered itself off when it says terminate)."""
    armed, url = faults
    client = harness.boto3.client("ec2", region_name=REGION, endpoint_url=url)
    other = client.create_launch_template(
        LaunchTemplateName=f"{cloud.stack}-terminate-on-shutdown"[:120],
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceInitiatedShutdownBehavior": "terminate"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    armed.refuse_capacity(cloud.launch_template_id)
    with pytest.raises(harness.botocore_exceptions.ClientError, match="InsufficientInstanceCapacity"):
        client.run_instances(
            LaunchTemplate={"LaunchTemplateId": cloud.launch_template_id}, SubnetId=cloud.subnet_id,
            MinCount=1, MaxCount=1,
        )  # fmt: skip
    [instance] = client.run_instances(
        LaunchTemplate={"LaunchTemplateId": other}, SubnetId=cloud.subnet_id, MinCount=1, MaxCount=1
    )["Instances"]
    behaviour = client.describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )["InstanceInitiatedShutdownBehavior"]["Value"]
    assert behaviour == "terminate"
