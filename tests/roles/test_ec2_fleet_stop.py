"""The fleet's stop (`gpuplat down`): the teardown tags the stack's training launch templates
gpuplat:fleet=stopped before it terminates anything, and a resume for a pool of a stopped template
launches nothing, so a controller that still runs while a job is pending cannot bring an instance back
during or after the teardown. When EC2 cannot say whether the fleet is stopped, nothing launches either.

Same harness as test_ec2_nodes.py (moto server, recorder scontrol).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.resume import resume
from gpuplat_ec2_nodes.settings import parse_pool
from gpuplat_ec2_nodes.slurm import Slurm
from gpuplat_ec2_nodes.teardown import teardown

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import Cloud, RecordingEc2, SlurmRecorder, settings_for

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm


def template(cloud: Cloud, name: str, stack: str, role: str = "train") -> str:
    """A launch template tagged as `pulumi up` tags a pool's (infra/backends/aws/tags.py pool_tags)."""
    [base] = cloud.ec2.describe_launch_templates(LaunchTemplateIds=[cloud.launch_template_id])[
        "LaunchTemplates"
    ]
    data = cloud.ec2.describe_launch_template_versions(
        LaunchTemplateId=base["LaunchTemplateId"], Versions=["$Latest"]
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    tags = [{"Key": "gpuplat:stack", "Value": stack}, {"Key": "gpuplat:role", "Value": role}]
    created = cloud.ec2.create_launch_template(
        LaunchTemplateName=f"{stack}-{name}"[:120],
        LaunchTemplateData=data,
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
    )
    return str(created["LaunchTemplate"]["LaunchTemplateId"])


def fleet_tag(cloud: Cloud, template_id: str) -> str | None:
    tags = cloud.ec2.describe_tags(
        Filters=[
            {"Name": "resource-id", "Values": [template_id]},
            {"Name": "key", "Values": ["gpuplat:fleet"]},
        ]
    )["Tags"]
    return str(tags[0]["Value"]) if tags else None


def on_templates(settings: Any, **templates: str) -> Any:
    pools = {
        name: parse_pool(name, {"launch_template_id": template_id, "subnet_id": None, "static_nodes": []})
        for name, template_id in templates.items()
    }
    return replace(settings, pools=pools)


def test_teardown_stops_the_fleet_first_and_a_resume_then_launches_nothing(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Before, the teardown only terminated: a controller still running relaunched a pending job's nodes
    (the box's scenario h shows it with slurmctld running)."""
    train = template(cloud, "train", cloud.stack)
    controller = template(cloud, "head", cloud.stack, role="service")
    other_stack = template(cloud, "train", f"{cloud.stack}-other")
    settings = on_templates(settings_for(tmp_path, cloud, slurm), train=train)
    ec2 = harness.ec2_nodes(cloud, slurm)
    running = cloud.launch("train-0")

    assert teardown(settings, ec2, timeout_s=30, poll_s=0.1) == EXIT_OK
    assert [fleet_tag(cloud, t) for t in (train, controller, other_stack)] == ["stopped", None, None]
    assert cloud.state(running) == "terminated"
    calls = slurm.calls()
    tagged = calls.index(["ec2", "create_tags", train])
    assert tagged < calls.index(["ec2", "terminate_instances", running]), "stopped before any termination"

    slurm.record.unlink()
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-1"]) == EXIT_FAILED
    assert ["ec2", "run_instances", ""] not in slurm.calls()
    assert cloud.node_instances("pending") == {} and cloud.node_instances("running") == {}
    assert ["scontrol", "update", "nodename=train-1", "state=power_down_force",
            "reason=gpuplat resume failed: PoolHeld"] in slurm.calls()  # fmt: skip


def test_a_pool_whose_template_is_not_stopped_launches(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """The stop is read per template: another stack's stop holds nothing of this one; nor does another
    value of the tag (IAM refuses only `stopped`, iam.py NOT_STOPPED)."""
    train = template(cloud, "train", cloud.stack)
    cloud.ec2.create_tags(Resources=[train], Tags=[{"Key": "gpuplat:fleet", "Value": "running"}])
    other = template(cloud, "train", f"{cloud.stack}-other")
    cloud.ec2.create_tags(Resources=[other], Tags=[{"Key": "gpuplat:fleet", "Value": "stopped"}])
    settings = on_templates(settings_for(tmp_path, cloud, slurm), train=train, gone=other)
    assert resume(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), ["train-1"]) == EXIT_OK
    assert sorted(cloud.node_instances("running")) == ["train-1"]
    assert resume(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), ["gone-0"]) == EXIT_FAILED
    assert "gone-0" not in cloud.node_instances("running")


class NoTagsEc2(RecordingEc2):
    """EC2 that refuses DescribeTags (throttled, an outage)."""

    def get_paginator(self, name: str) -> Any:
        if name == "describe_tags":
            error = {"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}
            raise harness.ClientError(error, "DescribeTags")
        return self.client.get_paginator(name)


def test_a_resume_that_cannot_read_the_fleets_stop_launches_and_says_so(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: Any
) -> None:
    """Resume always launches when a describe fails (as when it cannot look up earlier instances): on
    AWS the controllers' IAM policy refuses a launch from a stopped template whatever it reads."""
    train = template(cloud, "train", cloud.stack)
    settings = on_templates(settings_for(tmp_path, cloud, slurm), train=train)
    client = harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url)
    ec2 = Ec2Nodes(NoTagsEc2(client, slurm), cloud.stack)
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-1"]) == EXIT_OK
    assert sorted(cloud.node_instances("running")) == ["train-1"]
    # the whole line, as the operator reads it in the controller's log
    assert "resume: cannot read whether the fleet is stopped (RequestLimitExceeded); launching" in (
        caplog.messages
    )
