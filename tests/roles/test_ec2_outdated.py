"""A role change with compute nodes up (outdated.py): the nodes of an older definition of their pool
(a launch template version whose user data, the bundle it boots, is not the latest's) are set
POWER_DOWN_ASAP, so their running jobs finish on the old bundle and the next launch of the name boots
the new one (ParallelCluster 3.11's QueueUpdateStrategy DRAIN); never reconfigured nor killed under a
job. A new version with the same user data (a pool image sealed from the same bundle) drains nothing.

Same harness as test_ec2_nodes.py (moto server, recorder scontrol).
"""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.reconcile import reconcile
from gpuplat_ec2_nodes.resume import resume
from gpuplat_ec2_nodes.settings import parse_pool
from gpuplat_ec2_nodes.slurm import Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import Cloud, RecordingEc2, SlurmRecorder, settings_for, show_node, tags_of

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm
NOW_AFTER_LAUNCH = 10**10  # reconcile's clock: any launch is long past, no orphan grace matters here


def boot_script(bundle: str) -> str:
    return base64.b64encode(f"#!/bin/sh\nexec gpuplat-node-join --bundle {bundle}\n".encode()).decode()


def pool_template(cloud: Cloud, bundle: str) -> str:
    [base] = cloud.ec2.describe_launch_template_versions(
        LaunchTemplateId=cloud.launch_template_id, Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    data = {**base["LaunchTemplateData"], "UserData": boot_script(bundle)}
    created = cloud.ec2.create_launch_template(
        LaunchTemplateName=f"{cloud.stack}-train"[:120], LaunchTemplateData=data
    )
    return str(created["LaunchTemplate"]["LaunchTemplateId"])


def new_version(cloud: Cloud, template_id: str, **changes: Any) -> None:
    """`pulumi up` of a changed pool: a new version of its template, the newest."""
    [latest] = cloud.ec2.describe_launch_template_versions(
        LaunchTemplateId=template_id, Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    data = {**latest["LaunchTemplateData"], **changes}
    cloud.ec2.create_launch_template_version(LaunchTemplateId=template_id, LaunchTemplateData=data)


def on_template(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, template_id: str) -> Any:
    pool = parse_pool(
        "train", {"launch_template_id": template_id, "subnet_id": cloud.subnet_id, "static_nodes": []}
    )
    return replace(settings_for(tmp_path, cloud, slurm, orphan_grace_s=300.0), pools={"train": pool})


def updates(slurm: SlurmRecorder) -> list[list[str]]:
    return [call[2:] for call in slurm.calls() if call[:2] == ["scontrol", "update"]]


def test_a_role_change_drains_the_running_nodes_after_their_jobs_and_the_next_launch_boots_the_new_bundle(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Before, a running node kept the old bundle until it idled out (SuspendTime), taking new jobs on it."""
    template_id = pool_template(cloud, "bundles/aaaa.zip")
    own = replace(cloud, launch_template_id=template_id)
    busy, idle, leaving = own.launch("train-0"), own.launch("train-1"), own.launch("train-2")
    # an operator's drain (replacement.py replaces it once drained) and a node still booting (drained
    # once in service, a later round): neither is set POWER_DOWN_ASAP now
    drained, booting = own.launch("train-5"), own.launch("train-6")
    own.launch("gone-0", pool="gone")  # a removed pool's, of the same template: reconcile's orphan
    new_version(cloud, template_id, UserData=boot_script("bundles/bbbb.zip"))
    slurm.nodes(
        show_node("train-0", "ALLOCATED+CLOUD", addr=cloud.describe(busy)["PrivateIpAddress"]),
        show_node("train-1", "IDLE+CLOUD", addr=cloud.describe(idle)["PrivateIpAddress"]),
        show_node(
            "train-2", "ALLOCATED+DRAIN+POWER_DOWN+CLOUD", addr=cloud.describe(leaving)["PrivateIpAddress"]
        ),
        show_node("train-5", "ALLOCATED+DRAIN+CLOUD", addr=cloud.describe(drained)["PrivateIpAddress"]),
        show_node("train-6", "IDLE+CLOUD+POWERING_UP", addr=cloud.describe(booting)["PrivateIpAddress"]),
    )
    settings = on_template(tmp_path, cloud, slurm, template_id)
    ec2 = harness.ec2_nodes(cloud, slurm)
    assert reconcile(settings, ec2, Slurm(slurm.scontrol), now=NOW_AFTER_LAUNCH) == EXIT_OK
    reason = (
        f"reason=gpuplat update: the pool's definition changed: launch template {template_id} version 1 -> 2"
    )
    assert updates(slurm) == [
        ["nodename=train-0", "state=power_down_asap", reason],
        ["nodename=train-1", "state=power_down_asap", reason],
    ]
    # nothing terminated nor requeued: the jobs finish where they run
    assert {cloud.state(i) for i in (busy, idle, leaving, drained, booting)} == {"running"}

    slurm.record.unlink()
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-3"]) == EXIT_OK
    launched = cloud.node_instances("running")["train-3"]
    assert tags_of(launched)["aws:ec2launchtemplate:version"] == "2"


def test_a_new_version_with_the_same_user_data_drains_nothing(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A new pool image (sealed from a node of the same bundle): what the node runs is the same."""
    template_id = pool_template(cloud, "bundles/aaaa.zip")
    busy = replace(cloud, launch_template_id=template_id).launch("train-0")
    new_version(cloud, template_id, InstanceType="p5e.48xlarge")
    slurm.nodes(show_node("train-0", "ALLOCATED+CLOUD", addr=cloud.describe(busy)["PrivateIpAddress"]))
    settings = on_template(tmp_path, cloud, slurm, template_id)
    assert (
        reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=NOW_AFTER_LAUNCH)
        == EXIT_OK
    )
    assert updates(slurm) == []


class NoVersionsEc2(RecordingEc2):
    def describe_launch_template_versions(self, **request: Any) -> Any:
        error = {"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}}
        raise harness.ClientError(error, "DescribeLaunchTemplateVersions")


def test_reconcile_fails_when_ec2_cannot_say_which_definition_runs(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: Any
) -> None:
    template_id = pool_template(cloud, "bundles/aaaa.zip")
    busy = replace(cloud, launch_template_id=template_id).launch("train-0")
    slurm.nodes(show_node("train-0", "ALLOCATED+CLOUD", addr=cloud.describe(busy)["PrivateIpAddress"]))
    settings = on_template(tmp_path, cloud, slurm, template_id)
    client = harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url)
    ec2 = harness.Ec2Nodes(NoVersionsEc2(client, slurm), cloud.stack)
    assert reconcile(settings, ec2, Slurm(slurm.scontrol), now=NOW_AFTER_LAUNCH) == EXIT_FAILED
    assert "cannot read the pools' launch template versions" in caplog.text
    assert updates(slurm) == []
