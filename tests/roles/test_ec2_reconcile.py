"""reconcile and teardown: the pools' instances that no Slurm node owns, and all of them at the end.

Same harness as test_ec2_nodes.py: moto in server mode (each test its own stack tag), recorder
scontrol answering `show node` with the states a test gives. The command line runs in this process
(run_in_process), or a command's function where a test sets the clock (instances are as old as the test
makes `now`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.logs import LOG
from gpuplat_ec2_nodes.reconcile import find_orphans, powered_down_orphans, reconcile
from gpuplat_ec2_nodes.replacement import REASON_RECOVER
from gpuplat_ec2_nodes.slurm import NodeInfo, Slurm
from gpuplat_ec2_nodes.teardown import teardown

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    Cloud,
    SlurmRecorder,
    ec2_nodes,
    run_in_process,
    settings_for,
    show_node,
    write_config,
)

# The harness's fixtures: moto server, a stack tag per test, recorder scontrol/squeue/scancel.
moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

NO_GRACE = {"orphan_grace_s": 0}
ICE = "gpuplat resume failed: InsufficientInstanceCapacity"


def reconcile_at(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, now: float, *lines: str) -> int:
    """One in-process reconcile round at `now`, Slurm showing `lines`."""
    slurm.nodes(*lines)
    settings = settings_for(tmp_path, cloud, slurm, orphan_grace_s=300.0, static_nodes=["train-0"])
    return int(reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=now))


def launched_at(cloud: Cloud, instance_id: str) -> float:
    return float(cloud.describe(instance_id)["LaunchTime"].timestamp())


def test_reconcile_terminates_what_no_node_owns_and_logs_why(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    untagged = cloud.launch(None, "train-spot")
    unknown = cloud.launch("train-99")
    powered_down = cloud.launch("train-1")
    powering_down = cloud.launch("train-spot-1", "train-spot")
    kept, duplicate = cloud.launch("train-2"), cloud.launch("train-2")
    stopped = cloud.launch("train-3")
    cloud.ec2.stop_instances(InstanceIds=[stopped])
    busy = cloud.launch("train-3")
    booting = cloud.launch("train-4")
    other_stack = cloud.launch("train-1", stack=f"{cloud.stack}-other")
    other_pool = cloud.launch("infer-1", "infer", role="infer")
    slurm.nodes(
        show_node("train-1", "IDLE+CLOUD+POWERED_DOWN"),
        show_node("train-spot-1", "IDLE+CLOUD+POWERING_DOWN"),
        show_node("train-2", "IDLE+CLOUD", addr=cloud.describe(kept)["PrivateIpAddress"]),
        show_node("train-3", "ALLOCATED+CLOUD"),
        show_node("train-4", "ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP"),
    )
    result = run_in_process(write_config(tmp_path, cloud, slurm, NO_GRACE), cloud, "reconcile")
    assert result.returncode == 0, result.stderr
    terminated = {untagged, unknown, powered_down, powering_down, duplicate, stopped}
    for instance_id in terminated:
        assert cloud.state(instance_id) == "terminated", instance_id
    for instance_id in (kept, busy, booting, other_stack, other_pool):
        assert cloud.state(instance_id) == "running", instance_id
    log = result.stderr
    assert f"terminating {untagged} (no gpuplat:node tag): has no gpuplat:node tag, launched" in log
    assert f"terminating {unknown} (train-99): is named for a node Slurm does not know" in log
    assert f"terminating {powered_down} (train-1): node POWERED_DOWN for 0 s" in log
    assert f"terminating {powering_down} (train-spot-1): node POWERING_DOWN for 0 s" in log
    assert f"terminating {duplicate} (train-2): is a second instance of train-2 ({kept} is at NodeAddr" in log
    assert f"terminating {stopped} (train-3): is a second instance of train-3 ({busy} is the newest)" in log
    assert slurm.calls() == [["scontrol", "-o", "show", "node"]]


def reconcile_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the last reconcile rounds logged (then forgotten)."""
    messages = [r.getMessage() for r in caplog.records if r.module == "reconcile"]
    caplog.clear()
    return messages


def test_reconcile_leaves_young_instances_for_the_grace(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """The resume program tags right after RunInstances: an untagged instance may be one of its."""
    caplog.set_level("INFO", logger=LOG.name)
    untagged = cloud.launch(None)
    unknown = cloud.launch("train-99")
    launched = max(launched_at(cloud, untagged), launched_at(cloud, unknown))
    assert reconcile_at(tmp_path, cloud, slurm, launched + 10, show_node("train-1", "IDLE+CLOUD")) == 0
    assert cloud.state(untagged) == cloud.state(unknown) == "running"
    young = {i: f"{launched + 10 - launched_at(cloud, i):.0f}" for i in (untagged, unknown)}
    assert reconcile_log(caplog) == [
        f"reconcile: {untagged} (no gpuplat:node tag, running) has no gpuplat:node tag, launched "
        f"{young[untagged]} s ago: within the 300 s grace, left for now",
        f"reconcile: {unknown} (train-99, running) is named for a node Slurm does not know, launched "
        f"{young[unknown]} s ago: within the 300 s grace, left for now",
        f"reconcile: 2 instances of stack {cloud.stack}, 0 orphans, 0 nodes replaced",
    ]
    assert reconcile_at(tmp_path, cloud, slurm, launched + 301, show_node("train-1", "IDLE+CLOUD")) == 0
    assert cloud.state(untagged) == cloud.state(unknown) == "terminated"
    old = {i: f"{launched + 301 - launched_at(cloud, i):.0f}" for i in (untagged, unknown)}
    assert reconcile_log(caplog) == [
        f"reconcile: terminating {untagged} (no gpuplat:node tag): has no gpuplat:node tag, launched "
        f"{old[untagged]} s ago",
        f"reconcile: terminating {unknown} (train-99): is named for a node Slurm does not know, launched "
        f"{old[unknown]} s ago",
        f"reconcile: 2 instances of stack {cloud.stack}, 2 orphans, 0 nodes replaced",
    ]


def test_an_instance_exactly_as_old_as_the_grace_goes(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """The grace is how long an instance no node owns is left: a second short of it, left; at it, gone.
    (Launch times are whole seconds, so these sums are exact.)"""
    caplog.set_level("INFO", logger=LOG.name)
    untagged = cloud.launch(None)
    launched = launched_at(cloud, untagged)
    assert reconcile_at(tmp_path, cloud, slurm, launched + 299, show_node("train-1", "IDLE+CLOUD")) == 0
    assert cloud.state(untagged) == "running"
    assert reconcile_log(caplog)[0].endswith("launched 299 s ago: within the 300 s grace, left for now")
    assert reconcile_at(tmp_path, cloud, slurm, launched + 300, show_node("train-1", "IDLE+CLOUD")) == 0
    assert cloud.state(untagged) == "terminated"
    assert reconcile_log(caplog)[0] == (
        f"reconcile: terminating {untagged} (no gpuplat:node tag): has no gpuplat:node tag, "
        "launched 300 s ago"
    )


def test_a_node_with_one_instance_is_no_duplicate_whether_it_runs_or_not(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """Duplicates are judged only where a node has more than one instance and one of them is live: a node
    with its one running instance, and a node whose one instance is stopped, keep it, with nothing said."""
    caplog.set_level("INFO", logger=LOG.name)
    running = cloud.launch("train-1")
    stopped = cloud.launch("train-2")
    cloud.ec2.stop_instances(InstanceIds=[stopped])
    now = max(launched_at(cloud, running), launched_at(cloud, stopped)) + 3600
    lines = (
        show_node("train-1", "IDLE+CLOUD", addr=cloud.describe(running)["PrivateIpAddress"]),
        show_node("train-2", "IDLE+CLOUD"),
    )
    assert reconcile_at(tmp_path, cloud, slurm, now, *lines) == 0
    assert cloud.state(running) == "running" and cloud.state(stopped) == "stopped"
    assert reconcile_log(caplog) == [
        f"reconcile: 2 instances of stack {cloud.stack}, 0 orphans, 0 nodes replaced"
    ]


def test_a_powered_down_node_is_named_with_each_of_its_power_off_flags() -> None:
    """The reason an instance goes names the node's power-off state flags, joined as Slurm joins a state's
    flags (`+`), should it show both (slurmctld's power_save.c clears POWERING_DOWN where it sets
    POWERED_DOWN, so one is the rule; the reason holds every one it shows)."""
    node = NodeInfo("train-7", frozenset({"IDLE", "CLOUD", "POWERED_DOWN", "POWERING_DOWN"}))
    instance = {"InstanceId": "i-0123456789abcdef0"}
    [orphan] = powered_down_orphans("train-7", [instance], node, 400.0, 300.0)
    assert orphan.why == "node POWERED_DOWN+POWERING_DOWN for 400 s"


def test_a_powered_down_nodes_instance_goes_within_grace_plus_interval(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """Rounds every 60 s, grace 300 s. The node powers down at some T in (60, 120] (SuspendProgram
    failed to terminate): the instance goes at t=360, within T + grace + interval, and after the
    node has been powered down at least grace - interval."""
    instance = cloud.launch("train-5")
    t0 = launched_at(cloud, instance) + 3600  # an old instance: only the power state counts
    up = show_node("train-5", "IDLE+CLOUD", addr=cloud.describe(instance)["PrivateIpAddress"])
    down = show_node("train-5", "IDLE+CLOUD+POWERED_DOWN")
    states = {t0: up, t0 + 60: up} | {t0 + t: down for t in range(120, 480, 60)}
    gone_at = None
    caplog.set_level("INFO", logger=LOG.name)
    logs = {}
    for now, line in states.items():
        assert reconcile_at(tmp_path, cloud, slurm, now, line) == 0
        logs[now - t0] = reconcile_log(caplog)[:-1]  # less the round's summary
        if gone_at is None and cloud.state(instance) == "terminated":
            gone_at = now - t0
    assert gone_at == 360, "powered down since at most t=60 by the rounds' record: 60 + 300"
    label = f"{instance} (train-5, running)"
    assert logs[120] == [
        f"reconcile: {label}: node train-5 POWERED_DOWN for 60 s: within the 300 s grace, left for now"
    ]
    assert logs[360] == [f"reconcile: terminating {instance} (train-5): node POWERED_DOWN for 300 s"]
    since = json.loads((tmp_path / "state" / "reconcile.json").read_text())["powered_down_since"]
    assert since == {"train-5": t0 + 60}


def test_a_node_on_its_way_up_keeps_its_instance(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    instance = cloud.launch("train-6")
    t0 = launched_at(cloud, instance) + 3600
    for t in range(0, 900, 60):
        line = show_node("train-6", "IDLE+CLOUD+POWER_UP+POWERED_DOWN" if t < 600 else "IDLE+CLOUD")
        assert reconcile_at(tmp_path, cloud, slurm, t0 + t, line) == 0
    assert cloud.state(instance) == "running"


def test_reconcile_terminates_nothing_without_slurms_node_list(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    instance = cloud.launch("train-1")
    slurm.fail("scontrol")
    result = run_in_process(write_config(tmp_path, cloud, slurm, NO_GRACE), cloud, "reconcile")
    assert result.returncode == EXIT_FAILED
    assert " ERROR reconcile: without Slurm's node list nothing is terminated\n" in result.stderr
    assert cloud.state(instance) == "running"


def test_a_failed_termination_is_tried_again_next_round(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    protected, plain = cloud.launch("train-98"), cloud.launch("train-99")
    cloud.protect(protected)
    config = write_config(tmp_path, cloud, slurm, NO_GRACE)
    slurm.nodes(show_node("train-1", "IDLE+CLOUD"))
    first = run_in_process(config, cloud, "reconcile")
    assert first.returncode == EXIT_FAILED
    assert f" ERROR reconcile: {protected} is still there; trying again next round\n" in first.stderr
    assert cloud.state(plain) == "terminated", "one instance that cannot go does not hold back the others"
    cloud.protect(protected, False)
    second = run_in_process(config, cloud, "reconcile")
    assert second.returncode == 0, second.stderr
    assert cloud.state(protected) == "terminated"


def test_reconcile_returns_failed_resumes_to_power_saving(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """DOWN+POWERED_DOWN (ResumeTimeout, or a resume-fail that did not finish) is never allocated
    again by Slurm itself; POWER_DOWN_FORCE brings it back to idle~ (module docstring)."""
    leftover = cloud.launch("train-spot-2", "train-spot")
    slurm.nodes(
        show_node("train-0", "DOWN+CLOUD+POWERED_DOWN", "ResumeTimeout reached"),  # static: keep-static's
        show_node("train-spot-2", "DOWN+CLOUD+POWERED_DOWN", "ResumeTimeout reached"),
        show_node("train-spot-3", "DOWN+CLOUD+POWERED_DOWN", ICE),
        show_node("train-spot-4", "DOWN+CLOUD+POWERED_DOWN", "bad DIMM, do not use"),  # an operator's
        show_node("train-spot-5", "DOWN+CLOUD+DRAIN+POWERED_DOWN", "ResumeTimeout reached"),
        show_node("train-spot-6", "IDLE+CLOUD+POWERING_DOWN", "ResumeTimeout reached"),
        show_node("train-spot-7", "IDLE+CLOUD+POWERED_DOWN", ICE),
    )  # fmt: skip
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"], orphan_grace_s=3600.0)
    status = reconcile(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol))
    assert status == EXIT_OK
    assert slurm.calls()[1:] == [
        ["ec2", "terminate_instances", leftover],
        [
            "scontrol",
            "update",
            "nodename=train-spot-2,train-spot-3",
            "state=power_down_force",
            f"reason={REASON_RECOVER}",
        ],
    ]


def test_teardown_terminates_every_instance_of_the_stacks_pools(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    ours = [
        cloud.launch("train-0"),
        cloud.launch(None, "train-spot"),
        cloud.launch("train-spot-1", "train-spot"),
    ]
    cloud.ec2.stop_instances(InstanceIds=[ours[2]])
    theirs = [
        cloud.launch("train-0", stack=f"{cloud.stack}-other"),
        cloud.launch("infer-0", "infer", role="infer"),
    ]
    result = run_in_process(write_config(tmp_path, cloud, slurm), cloud, "teardown", "--poll-seconds=0.1")
    assert result.returncode == 0, result.stderr
    assert [cloud.state(i) for i in ours] == ["terminated"] * 3
    assert [cloud.state(i) for i in theirs] == ["running"] * 2
    assert "no instance of stack" in result.stderr
    assert slurm.calls() == [], "teardown needs no Slurm"


def test_teardown_lists_what_is_left_and_fails(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    stuck, gone = cloud.launch("train-0"), cloud.launch("train-1")
    cloud.protect(stuck)
    config = write_config(tmp_path, cloud, slurm)
    result = run_in_process(config, cloud, "teardown", "--timeout-seconds=0.3", "--poll-seconds=0.1")
    assert result.returncode == EXIT_FAILED
    assert f"teardown: left: {stuck} (train-0, running)" in result.stderr
    assert cloud.state(gone) == "terminated"


def test_teardown_waits_for_instances_still_shutting_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Shutting-down instances still hold their network interfaces: teardown waits them out."""
    instance = cloud.launch("train-0")

    class ShuttingDownAWhile(Ec2Nodes):  # moto terminates at once; EC2 takes a while
        listings = 0

        def fleet_instances(self, states: Any) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = super().fleet_instances(states)
            self.listings += 1
            if not found and self.listings <= 3:
                return [{"InstanceId": instance, "State": {"Name": "shutting-down"}, "Tags": []}]
            return found

    client = harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url)
    ec2 = ShuttingDownAWhile(harness.RecordingEc2(client, slurm), cloud.stack)
    sleeps: list[float] = []
    status = teardown(settings_for(tmp_path, cloud, slurm), ec2, 60.0, 5.0, sleep=sleeps.append)
    assert status == EXIT_OK
    assert sleeps == [5.0, 5.0, 5.0] and ec2.listings == 4
    assert slurm.calls() == [["ec2", "terminate_instances", instance]], "shutting-down is not asked again"


def test_a_node_keeps_its_instance_at_node_addr_over_a_newer_one_else_the_newest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Instances a second apart at least (moto's launch times are to the second: its instances of one
    test are launched together), so which one is newest is told apart."""
    launched = datetime(2026, 12, 1, 9, tzinfo=UTC)

    def instance(instance_id: str, after_s: int, address: str) -> dict[str, Any]:
        return {
            "InstanceId": instance_id,
            "LaunchTime": launched + timedelta(seconds=after_s),
            "PrivateIpAddress": address,
            "State": {"Name": "running"},
            "Tags": [{"Key": "gpuplat:node", "Value": "train-2"}],
        }

    at_addr, newer, newest = (
        instance("i-at", 0, "10.0.0.1"),
        instance("i-new", 60, "10.0.0.2"),
        instance("i-newest", 120, "10.0.0.3"),
    )
    node = NodeInfo("train-2", frozenset({"IDLE", "CLOUD"}), addr="10.0.0.1")
    now = launched.timestamp() + 3600
    caplog.set_level("INFO", logger=LOG.name)
    kept_at_addr = find_orphans([newer, at_addr, newest], {"train-2": node}, {}, now, 300.0)
    assert [o.instance_id for o in kept_at_addr] == ["i-new", "i-newest"]
    assert reconcile_log(caplog) == [
        "reconcile: train-2 has 3 instances; keeping i-at is at NodeAddr 10.0.0.1"
    ]
    moved = replace(node, addr="10.0.0.9")
    kept_newest = find_orphans([newer, newest, at_addr], {"train-2": moved}, {}, now, 300.0)
    assert [o.instance_id for o in kept_newest] == ["i-new", "i-at"]
    assert reconcile_log(caplog) == ["reconcile: train-2 has 3 instances; keeping i-newest is the newest"]


def test_reconcile_without_ec2s_instance_list_fails_and_says_for_which_stack(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """EC2 is read first: without its list nothing is judged, Slurm is not asked, and the error names the
    stack and EC2's answer."""

    class Unlisted(Ec2Nodes):
        def fleet_instances(self, states: Any) -> list[dict[str, Any]]:
            error = {"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}}
            raise harness.ClientError(error, "DescribeInstances")

    client = harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url)
    ec2 = Unlisted(harness.RecordingEc2(client, slurm), cloud.stack)
    status = reconcile(settings_for(tmp_path, cloud, slurm), ec2, Slurm(slurm.scontrol))
    assert status == EXIT_FAILED and slurm.calls() == []
    assert [r.getMessage() for r in caplog.records if r.module == "reconcile"] == [
        f"reconcile: cannot list the instances of stack {cloud.stack}: An error occurred "
        "(RequestLimitExceeded) when calling the DescribeInstances operation: Request limit exceeded."
    ]
