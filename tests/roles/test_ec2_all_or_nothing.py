"""Launches per job from SLURM_RESUME_FILE, all or nothing (resume.py, resume_file.py).

EC2 with limited capacity stands in front of moto (which never runs out and starts exactly MinCount):
a RunInstances whose MinCount exceeds what is left fails InsufficientInstanceCapacity with nothing
started, as EC2 does; otherwise it starts as many as it can up to MaxCount.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.holds import record_capacity_error
from gpuplat_ec2_nodes.logs import LOG
from gpuplat_ec2_nodes.resume import resume
from gpuplat_ec2_nodes.resume_file import ResumeJob, read_resume_file
from gpuplat_ec2_nodes.settings import parse_pool
from gpuplat_ec2_nodes.slurm import Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    Cloud,
    RecordingEc2,
    SlurmRecorder,
    run_in_process,
    settings_for,
    write_config,
)

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

ICE = "InsufficientInstanceCapacity"


class LimitedEc2(RecordingEc2):
    """EC2 with `capacity` instances left; every RunInstances request is kept."""

    def __init__(self, client: Any, slurm: SlurmRecorder, capacity: int) -> None:
        super().__init__(client, slurm)
        self.capacity = capacity
        self.requests: list[dict[str, Any]] = []

    def run_instances(self, **request: Any) -> Any:
        self.requests.append(request)
        if request["MinCount"] > self.capacity:
            raise ClientError({"Error": {"Code": ICE, "Message": "box"}}, "RunInstances")
        count = min(request["MaxCount"], self.capacity)
        self.capacity -= count
        return self.client.run_instances(**{**request, "MinCount": count, "MaxCount": count})


def limited(cloud: Cloud, slurm: SlurmRecorder, capacity: int) -> tuple[Ec2Nodes, LimitedEc2]:
    import boto3

    client = LimitedEc2(boto3.client("ec2", region_name="us-east-1", endpoint_url=cloud.url), slurm, capacity)
    return Ec2Nodes(client, cloud.stack), client


def power_downs(slurm: SlurmRecorder) -> dict[str, str]:
    found: dict[str, str] = {}
    for call in slurm.calls():
        if call[:2] == ["scontrol", "update"] and call[3] == "state=power_down_force":
            found.update(dict.fromkeys(call[2].removeprefix("nodename=").split(","), call[4]))
    return found


def live(cloud: Cloud) -> list[str]:
    return [i["InstanceId"] for i in cloud.instances() if i["State"]["Name"] in ("pending", "running")]


def test_a_job_on_partial_capacity_gets_no_node_rather_than_some(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Before, MinCount 1: one of the job's two nodes booted and idled until SuspendTime while the
    other was retried (the job cannot start on one); now EC2 starts none."""
    nodes, client = limited(cloud, slurm, capacity=1)
    settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0)
    job = ResumeJob("140814", ("train-spot-1", "train-spot-2"))
    status = resume(settings, nodes, Slurm(slurm.scontrol), ["train-spot-1", "train-spot-2"], jobs=[job])
    assert status == EXIT_FAILED
    assert [(r["MinCount"], r["MaxCount"]) for r in client.requests] == [(2, 2)]
    assert live(cloud) == []
    reason = f"reason=gpuplat resume failed: {ICE}"
    assert power_downs(slurm) == {"train-spot-1": reason, "train-spot-2": reason}


def test_jobs_are_launched_each_on_their_own_and_names_of_no_job_best_effort(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """Capacity for three: the first job's two start, the second job's two do not (none of them), the
    name no job lists (an operator's power_up) gets the last one."""
    nodes, client = limited(cloud, slurm, capacity=3)
    settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0)
    jobs = [
        ResumeJob("1", ("train-spot-1", "train-spot-2")),
        ResumeJob("2", ("train-spot-3", "train-spot-4")),
    ]
    names = [f"train-spot-{i}" for i in range(1, 6)]
    caplog.set_level("INFO", logger=LOG.name)
    assert resume(settings, nodes, Slurm(slurm.scontrol), names, jobs=jobs) == EXIT_FAILED
    assert [(r["MinCount"], r["MaxCount"]) for r in client.requests] == [(2, 2), (2, 2), (1, 1)]
    named = {
        i["InstanceId"]: t["Value"]
        for i in cloud.instances()
        for t in i["Tags"]
        if t["Key"] == "gpuplat:node"
    }
    assert sorted(named[i] for i in live(cloud)) == ["train-spot-1", "train-spot-2", "train-spot-5"]
    assert set(power_downs(slurm)) == {"train-spot-3", "train-spot-4"}


def test_a_job_across_pools_keeps_nothing_when_one_pool_fails(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """One job with a node in two pools: the second pool has no capacity left, so the first pool's
    node, already launched, is terminated and both names go back."""
    nodes, _ = limited(cloud, slurm, capacity=1)
    settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0)
    job = ResumeJob("7", ("train-1", "train-spot-1"))
    assert (
        resume(settings, nodes, Slurm(slurm.scontrol), ["train-1", "train-spot-1"], jobs=[job]) == EXIT_FAILED
    )
    assert live(cloud) == []
    # the launched node goes back with the error that failed its job
    assert power_downs(slurm) == dict.fromkeys(
        ("train-1", "train-spot-1"), f"reason=gpuplat resume failed: {ICE}"
    )
    assert (
        "resume: job 7 got 1 of its 2 nodes (InsufficientInstanceCapacity); all or nothing: train-1 go too"
        in caplog.text
    )


def test_a_job_across_pools_launches_nothing_when_one_of_them_is_held(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A held pool (capacity cool-down, protected mode) fails the job's names there before any other
    pool is asked: no instance started only to be terminated, whichever pool comes first; every name of
    the job, the held pool's and the others', is powered down, so that the job requeues."""
    order = ("train-1", "train-spot-1", "train-big-1")  # the job's pools in this order
    for held in ("train-spot", "train"):
        nodes, client = limited(cloud, slurm, capacity=5)
        settings = settings_for(tmp_path / held, cloud, slurm, insufficient_capacity_timeout_s=600)
        big = parse_pool("train-big", {"launch_template_id": cloud.launch_template_id, "subnet_id": None})
        settings = replace(settings, pools={**settings.pools, "train-big": big})
        assert record_capacity_error(settings, held, ICE, time.time())
        if slurm.record.exists():
            slurm.record.unlink()
        job = ResumeJob("7", order)
        assert resume(settings, nodes, Slurm(slurm.scontrol), list(order), jobs=[job]) == EXIT_FAILED
        assert client.requests == [], held
        assert live(cloud) == []
        assert power_downs(slurm) == dict.fromkeys(order, "reason=gpuplat resume failed: PoolHeld"), held


def test_the_resume_file_as_slurm_writes_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """slurm.conf(5), ResumeProgram: SLURM_RESUME_FILE's JSON; a name in two jobs stays with the first;
    a file that cannot be read is no grouping, said in the log."""
    path = tmp_path / "resume.json"
    path.write_text(json.dumps({
        "all_nodes_resume": "train-spot-[1-3],train-0",
        "jobs": [
            {"job_id": 140814, "nodes_alloc": "train-spot-[1-4]", "nodes_resume": "train-spot-[1-2]",
             "partition": "spot", "oversubscribe": "OK", "features": None, "reservation": None},
            {"job_id": 140815, "nodes_alloc": "train-spot-2,train-0", "nodes_resume": "train-spot-2,train-0"},
        ],
    }))  # fmt: skip
    assert read_resume_file(str(path)) == [
        ResumeJob("140814", ("train-spot-1", "train-spot-2")),
        ResumeJob("140815", ("train-0",)),
    ]
    assert read_resume_file(None) == []
    # Slurm 21.08 and 22.05 write "nodes" (the box's Debian 12 has 22.05: seen there)
    path.write_text(
        json.dumps({"all_nodes": "train-spot-[1-2]", "jobs": [{"job_id": 4, "nodes": "train-spot-[1-2]"}]})
    )
    assert read_resume_file(str(path)) == [ResumeJob("4", ("train-spot-1", "train-spot-2"))]
    for text in ("{not json", json.dumps({"jobs": [{"job_id": 1}]}), json.dumps([1])):
        path.write_text(text)
        assert read_resume_file(str(path)) == []
    assert read_resume_file(str(tmp_path / "missing.json")) == []
    assert caplog.text.count("launching each name on its own") == 4


def test_the_resume_command_reads_slurm_resume_file(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    resume_file = tmp_path / "resume.json"
    resume_file.write_text(json.dumps({"jobs": [{"job_id": 9, "nodes_resume": "train-spot-[1-2]"}]}))
    monkeypatch.setenv("SLURM_RESUME_FILE", str(resume_file))
    requests: list[dict[str, Any]] = []
    real = harness.program_ec2.Ec2Nodes.launch_request

    def recorded(self: Ec2Nodes, *args: Any) -> dict[str, Any]:
        request = real(self, *args)
        requests.append(request)
        return request

    monkeypatch.setattr(harness.program_ec2.Ec2Nodes, "launch_request", recorded)
    result = run_in_process(write_config(tmp_path, cloud, slurm), cloud, "resume", "train-spot-[1-2]")
    assert result.returncode == EXIT_OK, result.stderr
    assert [(r["MinCount"], r["MaxCount"]) for r in requests] == [(2, 2)]
