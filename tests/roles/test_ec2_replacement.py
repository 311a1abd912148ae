"""reconcile's replacement of unhealthy nodes (replacement.py): DOWN, drained and instance-less nodes
lose their instance and are powered down; a node whose instance has an EC2 scheduled event is drained.

Same harness as test_ec2_reconcile.py: moto in server mode, recorder scontrol answering `show node`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_OK
from gpuplat_ec2_nodes.holds import pools_report, read_holds
from gpuplat_ec2_nodes.reconcile import reconcile
from gpuplat_ec2_nodes.slurm import Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import Cloud, RecordingEc2, SlurmRecorder, ec2_nodes, settings_for, show_node

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

SPOT = "spot interruption"
REPLACED = "reason=gpuplat reconcile: replaced"


def reconcile_once(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, *lines: str, ec2: Any = None) -> int:
    slurm.nodes(*lines)
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"], orphan_grace_s=3600.0)
    return int(reconcile(settings, ec2 or ec2_nodes(cloud, slurm), Slurm(slurm.scontrol)))


def address(cloud: Cloud, instance_id: str) -> str:
    return str(cloud.describe(instance_id)["PrivateIpAddress"])


def power_downs(slurm: SlurmRecorder) -> dict[str, str]:
    """Each POWER_DOWN_FORCE'd node and its reason."""
    found: dict[str, str] = {}
    for call in slurm.calls():
        if call[:2] == ["scontrol", "update"] and call[3] == "state=power_down_force":
            found.update(dict.fromkeys(call[2].removeprefix("nodename=").split(","), call[4]))
    return found


def test_down_and_drained_nodes_are_replaced_and_their_jobs_requeued(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """ParallelCluster's terminate_down_nodes and terminate_drain_nodes (replacement.py): a DOWN node
    (slurmd died, not responding) and a DRAINED one (an operator's or a health check's drain, its jobs
    ended) are replaced, static ones too when drained; a DRAINING node keeps running its jobs, a static
    DOWN one is keep-static's (its back-off), spot-watch's drain is spot-watch's."""
    ids = {name: cloud.launch(name, pool) for name, pool in [
        ("train-spot-1", "train-spot"), ("train-spot-2", "train-spot"), ("train-0", "train"),
        ("train-spot-3", "train-spot"), ("train-1", "train"), ("train-spot-4", "train-spot")]}  # fmt: skip
    at = {name: address(cloud, instance_id) for name, instance_id in ids.items()}
    status = reconcile_once(
        tmp_path, cloud, slurm,
        show_node("train-spot-1", "DOWN+CLOUD+NOT_RESPONDING", "Not responding", at["train-spot-1"]),
        show_node("train-spot-2", "IDLE+CLOUD+DRAIN", "gpuplat health: /fsx missing", at["train-spot-2"]),
        show_node("train-0", "IDLE+CLOUD+DRAIN", "maintenance", at["train-0"]),
        show_node("train-spot-3", "MIXED+CLOUD+DRAIN", "maintenance", at["train-spot-3"]),
        show_node("train-1", "DOWN+CLOUD", "Not responding", at["train-1"]),
        show_node("train-spot-4", "IDLE+CLOUD+DRAIN", f"{SPOT} 2026-12-01T10:02:00Z", at["train-spot-4"]),
    )  # fmt: skip
    assert status == EXIT_OK
    assert power_downs(slurm) == {
        "train-spot-1": f"{REPLACED}: DOWN (Not responding)",
        "train-spot-2": f"{REPLACED}: drained (gpuplat health: /fsx missing)",
        "train-0": f"{REPLACED}: drained (maintenance)",
        "train-1": f"{REPLACED}: DOWN (Not responding)",  # not static in this stack
    }
    for name in ("train-spot-1", "train-spot-2", "train-0", "train-1"):
        assert cloud.state(ids[name]) == "terminated", name
    for name in ("train-spot-3", "train-spot-4"):
        assert cloud.state(ids[name]) == "running", name


def test_a_static_down_node_is_left_to_keep_static(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    instance = cloud.launch("train-0")
    status = reconcile_once(
        tmp_path, cloud, slurm, show_node("train-0", "DOWN+CLOUD", "Not responding", address(cloud, instance))
    )
    assert status == EXIT_OK
    assert power_downs(slurm) == {}
    assert cloud.state(instance) == "running"


def test_a_node_whose_instance_is_gone_is_powered_down_at_once(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """An instance terminated or stopped from outside: Slurm would wait SlurmdTimeout and more before
    the node is DOWN, its job stuck; ParallelCluster's is_backing_instance_valid (missing count 0)
    replaces it in the round that sees it. Nodes powered down or on their way up have no instance yet."""
    gone, stopped = cloud.launch("train-spot-1", "train-spot"), cloud.launch("train-spot-2", "train-spot")
    addresses = [address(cloud, gone), address(cloud, stopped)]
    cloud.ec2.terminate_instances(InstanceIds=[gone])
    cloud.ec2.stop_instances(InstanceIds=[stopped])
    status = reconcile_once(
        tmp_path, cloud, slurm,
        show_node("train-spot-1", "ALLOCATED+CLOUD", addr=addresses[0]),
        show_node("train-spot-2", "IDLE+CLOUD", addr=addresses[1]),
        show_node("train-spot-3", "IDLE+CLOUD+POWERED_DOWN"),
        show_node("train-spot-4", "ALLOCATED+CLOUD+POWERING_UP", addr="10.0.0.99"),
        show_node("train-spot-5", "IDLE+CLOUD"),  # NodeAddr never set: nothing to look for
    )  # fmt: skip
    assert status == EXIT_OK
    assert power_downs(slurm) == {
        "train-spot-1": f"{REPLACED}: no live instance at NodeAddr {addresses[0]}",
        "train-spot-2": f"{REPLACED}: no live instance at NodeAddr {addresses[1]}",
    }
    assert cloud.state(stopped) == "terminated"
    updates = [call[2:4] for call in slurm.calls() if call[:2] == ["scontrol", "update"]]
    # DOWN first: the job leaves the dead node (else COMPLETING there until SlurmdTimeout), then back
    # to power saving
    assert updates == [
        ["nodename=train-spot-1", "state=down"],
        ["nodename=train-spot-2", "state=down"],
        ["nodename=train-spot-1", "state=power_down_force"],
        ["nodename=train-spot-2", "state=power_down_force"],
    ]


class EventfulEc2(RecordingEc2):
    """moto's client, with scheduled events on some instances (moto has none)."""

    def __init__(self, client: Any, slurm: SlurmRecorder, events: dict[str, list[dict[str, str]]]) -> None:
        super().__init__(client, slurm)
        self.events = events

    def describe_instance_status(self, **request: Any) -> Any:
        response = self.client.describe_instance_status(**request)
        for status in response["InstanceStatuses"]:
            status["Events"] = self.events.get(status["InstanceId"], [])
        return response


def test_a_node_with_a_scheduled_event_is_drained_then_replaced_once_idle(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    retiring, done, rebooting = (cloud.launch(f"train-spot-{i}", "train-spot") for i in (1, 2, 3))
    events = {
        retiring: [{"Code": "instance-retirement", "Description": "retiring", "NotBefore": "2026-12-07"}],
        done: [{"Code": "system-reboot", "Description": "[Completed] reboot", "NotBefore": "2026-12-01"}],
        rebooting: [{"Code": "system-reboot", "Description": "reboot", "NotBefore": "2026-12-08"}],
    }
    client = EventfulEc2(ec2_nodes(cloud, slurm).client.client, slurm, events)
    lines = [
        show_node("train-spot-1", "ALLOCATED+CLOUD", addr=address(cloud, retiring)),
        show_node("train-spot-2", "IDLE+CLOUD", addr=address(cloud, done)),
        show_node("train-spot-3", "IDLE+CLOUD+DRAIN", "maintenance", address(cloud, rebooting)),
    ]
    assert reconcile_once(tmp_path, cloud, slurm, *lines, ec2=Ec2Nodes(client, cloud.stack)) == EXIT_OK
    drains = [
        call for call in slurm.calls() if call[:2] == ["scontrol", "update"] and call[3] == "state=drain"
    ]
    assert drains == [
        ["scontrol", "update", "nodename=train-spot-1", "state=drain",
         "reason=gpuplat reconcile: EC2 scheduled event instance-retirement at 2026-12-07"],
    ]  # fmt: skip
    assert set(power_downs(slurm)) == {"train-spot-3"}, "already drained and idle: replaced at once"
    assert cloud.state(retiring) == "running" and cloud.state(done) == "running"


@pytest.mark.parametrize("state", ["IDLE+CLOUD+DRAIN", "DOWN+CLOUD+DRAIN"])
def test_a_node_drained_for_its_scheduled_event_is_replaced_once_drained(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, state: str
) -> None:
    instance = cloud.launch("train-spot-1", "train-spot")
    reason = "gpuplat reconcile: EC2 scheduled event instance-stop at 2026-12-07"
    status = reconcile_once(
        tmp_path, cloud, slurm, show_node("train-spot-1", state, reason, address(cloud, instance))
    )
    assert status == EXIT_OK
    assert list(power_downs(slurm)) == ["train-spot-1"]
    assert cloud.state(instance) == "terminated"


def test_a_refused_registration_is_a_boot_failure_of_its_pool(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """slurmctld drains a node whose slurmd registers with less than slurm.conf says (INVALID_REG);
    replacing it boots the same image into the same refusal, so each replacement counts towards the
    pool's protected mode, as ParallelCluster's is_bootstrap_failure counts it. An operator's drain
    does not count."""
    refused, drained = cloud.launch("train-spot-1", "train-spot"), cloud.launch("train-spot-2", "train-spot")
    slurm.nodes(
        show_node("train-spot-1", "IDLE+CLOUD+DRAIN+INVALID_REG", "Low RealMemory", address(cloud, refused)),
        show_node("train-spot-2", "IDLE+CLOUD+DRAIN", "maintenance", address(cloud, drained)),
    )
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=1)
    assert reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol)) == EXIT_OK
    assert set(power_downs(slurm)) == {"train-spot-1", "train-spot-2"}
    report = json.loads(pools_report(settings))
    assert report["train-spot"]["boot_failures"] == 1
    assert str(report["train-spot"]["hold"]).startswith("gpuplat protected mode")
    assert report["train"]["boot_failures"] == 0


def test_a_drained_node_still_completing_a_job_is_left_until_its_epilog_ends(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """ParallelCluster's is_drained excludes COMPLETING (slurm_resources.py:273): the epilog still runs."""
    instance = cloud.launch("train-spot-1", "train-spot")
    status = reconcile_once(
        tmp_path, cloud, slurm,
        show_node("train-spot-1", "IDLE+COMPLETING+CLOUD+DRAIN", "maintenance", address(cloud, instance)),
    )  # fmt: skip
    assert status == EXIT_OK
    assert power_downs(slurm) == {}
    assert cloud.state(instance) == "running"


def test_an_event_drains_only_a_node_in_service_and_not_drained_yet(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A node draining for another reason keeps that reason; a node on its way up or down has no job
    to let end (it is powered down, or replaced once up and drained)."""
    ids = [cloud.launch(f"train-spot-{i}", "train-spot") for i in (1, 2, 3)]
    event = [{"Code": "instance-stop", "Description": "stop", "NotBefore": "2026-12-07"}]
    client = EventfulEc2(ec2_nodes(cloud, slurm).client.client, slurm, dict.fromkeys(ids, event))
    lines = [
        show_node("train-spot-1", "MIXED+CLOUD+DRAIN", "maintenance", address(cloud, ids[0])),
        show_node("train-spot-2", "IDLE+CLOUD+POWERING_UP", addr=address(cloud, ids[1])),
        show_node("train-spot-3", "IDLE+CLOUD+POWERING_DOWN", addr=address(cloud, ids[2])),
    ]
    assert reconcile_once(tmp_path, cloud, slurm, *lines, ec2=Ec2Nodes(client, cloud.stack)) == EXIT_OK
    assert [call for call in slurm.calls() if call[:2] == ["scontrol", "update"]] == []


def test_nodes_of_no_pool_are_not_replaced(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    """slurm.conf may define nodes that are no pool's (a login or on-premises node): not reconcile's."""
    status = reconcile_once(
        tmp_path, cloud, slurm,
        show_node("login-1", "DOWN+NOT_RESPONDING", "Not responding", "10.0.9.9"),
        show_node("cpu-1", "IDLE+DRAIN", "maintenance", "10.0.9.10"),
    )  # fmt: skip
    assert status == EXIT_OK
    assert [call for call in slurm.calls() if call[:2] == ["scontrol", "update"]] == []


def test_a_replaced_node_is_not_also_drained_for_its_event(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A DOWN node whose instance also has a scheduled event is replaced, and its reason stays the
    replacement's (its instance is no longer there to drain for)."""
    instance = cloud.launch("train-spot-1", "train-spot")
    event = [{"Code": "instance-retirement", "Description": "retiring", "NotBefore": "2026-12-07"}]
    client = EventfulEc2(ec2_nodes(cloud, slurm).client.client, slurm, {instance: event})
    line = show_node("train-spot-1", "DOWN+CLOUD+NOT_RESPONDING", "Not responding", address(cloud, instance))
    assert reconcile_once(tmp_path, cloud, slurm, line, ec2=Ec2Nodes(client, cloud.stack)) == EXIT_OK
    updates = [call[3] for call in slurm.calls() if call[:2] == ["scontrol", "update"]]
    assert updates == ["state=power_down_force"]


def test_a_node_whose_instance_ended_during_boot_is_a_boot_failure_replaced_at_once(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A training node whose boot fails powers itself off and its launch template terminates it; its
    node, still POWERING_UP, is replaced in the next round (not at ResumeTimeout) and counts towards
    protected mode, as ParallelCluster's DynamicNode.is_bootstrap_failure counts a powering-up node
    without a backing instance (slurm_resources.py:717). A node going up whose instance is pending is
    left alone, and so is one whose address resume has not set yet."""
    failed = cloud.launch("train-spot-1", "train-spot")
    at = address(cloud, failed)
    cloud.ec2.terminate_instances(InstanceIds=[failed])
    booting = cloud.launch("train-spot-2", "train-spot")
    earlier = cloud.launch("train-spot-3", "train-spot")
    cloud.ec2.terminate_instances(InstanceIds=[earlier])  # before resume launched this name again
    slurm.nodes(
        show_node("train-spot-1", "IDLE+CLOUD+POWERING_UP", addr=at),
        show_node("train-spot-2", "IDLE+CLOUD+POWERING_UP", addr=address(cloud, booting)),
        show_node("train-spot-3", "IDLE+CLOUD+POWERING_UP"),
    )
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=1, orphan_grace_s=3600.0)
    now = time.time()
    assert reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=now) == EXIT_OK
    downs = power_downs(slurm)
    assert list(downs) == ["train-spot-1"]
    assert downs["train-spot-1"].startswith(
        f"{REPLACED}: its instance ended during boot ({failed} terminated"
    )
    assert cloud.state(booting) == "running"
    report = json.loads(pools_report(settings))
    assert report["train-spot"]["boot_failures"] == 1
    assert str(report["train-spot"]["hold"]).startswith("gpuplat protected mode")
    assert read_holds(settings)["protected"] == {"train-spot": {"since": now, "failures": 1}}, "dated"


def test_a_node_whose_new_instance_is_not_found_by_its_name_yet_is_not_a_boot_failure(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Resume launched train-spot-1 again and set its address, but EC2's tag filter does not show the
    new instance's gpuplat:node tag yet (eventually consistent) while the name's earlier instance,
    terminated, is still listed: the live instance at the node's address says it is going up."""
    earlier = cloud.launch("train-spot-1", "train-spot")
    cloud.ec2.terminate_instances(InstanceIds=[earlier])
    relaunched = cloud.launch(None, "train-spot")  # its name tag not visible to the filter yet
    slurm.nodes(show_node("train-spot-1", "IDLE+CLOUD+POWERING_UP", addr=address(cloud, relaunched)))
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=1, orphan_grace_s=3600.0)
    assert reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol)) == EXIT_OK
    assert power_downs(slurm) == {}
    assert cloud.state(relaunched) == "running"
    assert json.loads(pools_report(settings))["train-spot"]["boot_failures"] == 0


def test_a_node_whose_instance_was_stopped_during_boot_is_a_boot_failure(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Stopped, not terminated (a template without the shutdown behaviour, a stop from outside): it
    will not register either, and a stopped instance is not a live one."""
    stopped = cloud.launch("train-spot-1", "train-spot")
    cloud.ec2.stop_instances(InstanceIds=[stopped])
    slurm.nodes(show_node("train-spot-1", "IDLE+CLOUD+POWERING_UP", addr=address(cloud, stopped)))
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=1, orphan_grace_s=3600.0)
    assert reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol)) == EXIT_OK
    assert list(power_downs(slurm)) == ["train-spot-1"]
    assert json.loads(pools_report(settings))["train-spot"]["boot_failures"] == 1


class EndedLookupRefusedEc2(RecordingEc2):
    """EC2 that answers the fleet listing but throttles the lookup of ended instances or addresses."""

    def get_paginator(self, name: str) -> Any:
        paginator = self.client.get_paginator(name)

        class Refusing:
            def paginate(self, **request: Any) -> Any:
                names = {f["Name"] for f in request.get("Filters", [])}
                states = next(
                    (f["Values"] for f in request["Filters"] if f["Name"] == "instance-state-name"), []
                )
                if "terminated" in states or "private-ip-address" in names:
                    error = {"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}
                    raise harness.ClientError(error, "DescribeInstances")
                return paginator.paginate(**request)

        return Refusing()


def test_a_failed_lookup_of_ended_instances_replaces_nothing_and_the_round_goes_on(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """EC2 throttled while reconcile asks what ended during boot: no boot failure counted, no error out
    of the round (ParallelCluster judges no backing instance without EC2's answer)."""
    failed = cloud.launch("train-spot-1", "train-spot")
    at = address(cloud, failed)
    cloud.ec2.terminate_instances(InstanceIds=[failed])
    slurm.nodes(show_node("train-spot-1", "IDLE+CLOUD+POWERING_UP", addr=at))
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=1, orphan_grace_s=3600.0)
    ec2 = Ec2Nodes(
        EndedLookupRefusedEc2(
            harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url), slurm
        ),
        cloud.stack,
    )
    assert reconcile(settings, ec2, Slurm(slurm.scontrol)) == EXIT_OK
    assert power_downs(slurm) == {}
    assert json.loads(pools_report(settings))["train-spot"]["boot_failures"] == 0
    assert "cannot look up the instances of train-spot-1, going up" in caplog.text
