"""The stack's Slurm-launched fleet found by its tags alone (gpuplat:stack, gpuplat:role train): a pool
removed or renamed on day 2 leaves instances no configuration names, which reconcile and teardown
terminate once Slurm no longer has their nodes (ParallelCluster: an inactive partition's instances,
aws-parallelcluster-node v3.11.0, src/slurm_plugin/clustermgtd.py:595 _clean_up_inactive_partition).

Same harness as test_ec2_nodes.py (moto server, recorder scontrol).
"""

from __future__ import annotations

from pathlib import Path

from gpuplat_ec2_nodes.exit_codes import EXIT_OK
from gpuplat_ec2_nodes.reconcile import reconcile
from gpuplat_ec2_nodes.slurm import Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    Cloud,
    SlurmRecorder,
    run_in_process,
    settings_for,
    show_node,
    tags_of,
    write_config,
)

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm


def test_reconcile_terminates_the_instances_of_a_pool_no_longer_configured(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Before, reconcile listed the configured pools' instances only: a removed pool's kept billing."""
    removed = cloud.launch("gpu-old-0", "gpu-old")
    renamed = cloud.launch(None, "train-h100")
    kept = cloud.launch("train-1")
    inference = cloud.launch("infer-0", "infer", role="infer")
    controller = cloud.launch("head-0", "head", role="controller")
    other_stack = cloud.launch("gpu-old-1", "gpu-old", stack=f"{cloud.stack}-other")
    slurm.nodes(show_node("train-1", "IDLE+CLOUD", addr=cloud.describe(kept)["PrivateIpAddress"]))
    settings = settings_for(tmp_path, cloud, slurm, orphan_grace_s=300.0)
    now = launched_at(cloud, renamed) + 301
    assert reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=now) == EXIT_OK
    assert {i: cloud.state(i) for i in (removed, renamed)} == {removed: "terminated", renamed: "terminated"}
    for instance_id in (kept, inference, controller, other_stack):
        assert cloud.state(instance_id) == "running", instance_id


def test_a_pool_slurm_still_has_keeps_its_nodes_until_slurm_drops_them(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """With two controllers, one may run an older configuration than the active slurmctld's slurm.conf:
    a node Slurm has and runs is no orphan, whatever this controller's pools."""
    added = cloud.launch("train-h100-0", "train-h100")
    slurm.nodes(show_node("train-h100-0", "ALLOCATED+CLOUD", addr=cloud.describe(added)["PrivateIpAddress"]))
    settings = settings_for(tmp_path, cloud, slurm, orphan_grace_s=300.0)
    now = launched_at(cloud, added) + 3600
    assert reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=now) == EXIT_OK
    assert cloud.state(added) == "running"


def test_reconcile_logs_why_an_unconfigured_pools_instance_goes(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    removed = cloud.launch("gpu-old-0", "gpu-old")
    renamed = cloud.launch("cpu-old-0", "cpu-old")
    slurm.nodes(show_node("train-1", "IDLE+CLOUD"))
    result = run_in_process(write_config(tmp_path, cloud, slurm, {"orphan_grace_s": 0}), cloud, "reconcile")
    assert result.returncode == 0, result.stderr
    assert (
        " WARNING reconcile: instances of pools cpu-old,gpu-old, which are not configured "
        "(pools: train,train-spot): terminated once Slurm no longer knows their nodes\n"
    ) in result.stderr
    assert f"terminating {removed} (gpu-old-0): is named for a node Slurm does not know" in result.stderr
    assert f"terminating {renamed} (cpu-old-0): is named for a node Slurm does not know" in result.stderr


def launched_at(cloud: Cloud, instance_id: str) -> float:
    return float(cloud.describe(instance_id)["LaunchTime"].timestamp())


def test_teardown_leaves_no_instance_of_any_pool_configured_or_not(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    ours = [cloud.launch("train-0"), cloud.launch("gpu-old-3", "gpu-old"), cloud.launch(None, "renamed")]
    cloud.ec2.stop_instances(InstanceIds=[ours[1]])
    theirs = [
        cloud.launch("infer-0", "infer", role="infer"),
        cloud.launch("train-0", stack=f"{cloud.stack}-x"),
    ]
    result = run_in_process(write_config(tmp_path, cloud, slurm), cloud, "teardown", "--poll-seconds=0.1")
    assert result.returncode == 0, result.stderr
    assert [cloud.state(i) for i in ours] == ["terminated"] * 3
    assert [cloud.state(i) for i in theirs] == ["running"] * 2


def test_resume_asks_for_the_fleet_role_tag_at_launch(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """What reconcile and teardown find the fleet by, whatever the launch template carries."""
    result = run_in_process(write_config(tmp_path, cloud, slurm), cloud, "resume", "train-2")
    assert result.returncode == 0, result.stderr
    [instance] = cloud.instances(gpuplat_node="train-2")
    assert tags_of(instance)["gpuplat:role"] == "train"
