"""A pool's holds (gpuplat_ec2_nodes/holds.py): the capacity cool-down after a capacity error and
protected mode after repeated boot failures, ParallelCluster's insufficient_capacity_timeout and
protected_failure_count (aws-parallelcluster-node v3.11.0, src/slurm_plugin/clustermgtd.py).

Same harness as test_ec2_nodes.py (moto server, recorder scontrol); resume, resume-fail and reconcile
run in-process with the clock the test gives.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from gpuplat_ec2_nodes.holds import (
    REASON_HOLD_OVER,
    pools_report,
    read_holds,
    record_boot_failures,
    record_capacity_error,
    unprotect,
)
from gpuplat_ec2_nodes.reconcile import reconcile
from gpuplat_ec2_nodes.resume import resume, resume_fail
from gpuplat_ec2_nodes.slurm import Slurm
from gpuplat_ec2_nodes.suspend import suspend

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    Cloud,
    RecordingEc2,
    SlurmRecorder,
    run_in_process,
    run_program,
    settings_for,
    show_node,
    write_config,
)

moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

T0 = 1_800_000_000.0
COOLDOWN_REASON = "gpuplat capacity cool-down: InsufficientInstanceCapacity until 2027-01-15T08:10:00Z"


class NoCapacityEc2(RecordingEc2):
    """EC2 without capacity for the pool: every RunInstances fails as EC2 says it."""

    def run_instances(self, **request: Any) -> Any:
        self.slurm.note("ec2", "run_instances", "")
        error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no g6 in us-east-1a"}}
        raise harness.ClientError(error, "RunInstances")


def client(cloud: Cloud) -> Any:
    return harness.boto3.client("ec2", region_name=harness.REGION, endpoint_url=cloud.url)


def scontrol_updates(slurm: SlurmRecorder) -> list[list[str]]:
    return [call[2:] for call in slurm.calls() if call[:2] == ["scontrol", "update"]]


# The pool after a capacity error on train-1: one name up, one idle~, one static, another pool's.
POOL_AFTER_ICE = (
    show_node("train-0", "IDLE+CLOUD+POWERED_DOWN"),  # static (settings_for below): keep-static's
    show_node("train-1", "DOWN+CLOUD+POWERED_DOWN", "gpuplat resume failed: InsufficientInstanceCapacity"),
    show_node("train-2", "IDLE+CLOUD+POWERED_DOWN"),
    show_node("train-3", "ALLOCATED+CLOUD"),
    show_node("train-4", "IDLE+CLOUD+POWER_DOWN+POWERED_DOWN"),
    show_node("train-5", "IDLE+CLOUD+PLANNED+POWERED_DOWN"),
    show_node("train-6", "IDLE+CLOUD+POWERED_DOWN+POWERING_UP"),
    show_node("train-spot-1", "IDLE+CLOUD+POWERED_DOWN"),
)


def test_a_capacity_error_holds_the_pools_idle_names_down_for_the_cool_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """ParallelCluster sets an ICE compute resource's powered-down nodes DOWN for
    insufficient_capacity_timeout (clustermgtd.py:1277): Slurm then gives a job that may run on another
    pool that pool, instead of the next name of the same pool and the same capacity error."""
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"])
    ec2 = Ec2Nodes(NoCapacityEc2(client(cloud), slurm), cloud.stack)
    slurm.nodes(*POOL_AFTER_ICE)
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-1"], now=T0) == EXIT_FAILED
    ice = "reason=gpuplat resume failed: InsufficientInstanceCapacity"
    assert scontrol_updates(slurm) == [
        ["nodename=train-1", "state=power_down_force", ice],
        ["nodename=train-2,train-4,train-5", "state=down", f"reason={COOLDOWN_REASON}"],
    ]
    report = json.loads(pools_report(settings, now=T0))
    assert report["train"]["hold"] == COOLDOWN_REASON and report["train-spot"]["hold"] is None


def test_a_held_pool_launches_nothing_until_the_cool_down_is_over(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(tmp_path, cloud, slurm)
    slurm.nodes(*POOL_AFTER_ICE)
    no_capacity = Ec2Nodes(NoCapacityEc2(client(cloud), slurm), cloud.stack)
    assert resume(settings, no_capacity, Slurm(slurm.scontrol), ["train-1"], now=T0) == EXIT_FAILED
    slurm.record.unlink()

    ec2 = harness.ec2_nodes(cloud, slurm)
    caplog.clear()
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-2", "train-5"], now=T0 + 599) == EXIT_FAILED
    assert ["ec2", "run_instances", ""] not in slurm.calls()
    # the log says which pool is held, why, and which names get no instance
    held = f"resume: pool train is held ({COOLDOWN_REASON}): no launch for train-2,train-5"
    assert held in caplog.messages
    assert scontrol_updates(slurm) == [
        ["nodename=train-2,train-5", "state=power_down_force", "reason=gpuplat resume failed: PoolHeld"]
    ]
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-spot-2"], now=T0 + 599) == EXIT_OK, (
        "other pools launch"
    )
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-5"], now=T0 + 600) == EXIT_OK
    assert sorted(cloud.node_instances("running")) == ["train-5", "train-spot-2"]


def test_suspend_holds_a_held_pools_names_once_slurmctld_powers_them_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """SuspendProgram sets a held pool's names DOWN: slurmctld made them IDLE as their suspend started
    (idle_on_node_suspend), so without it each is allocatable at SuspendTimeout and a requeued job
    takes the held pool's failed name again (PoolHeld) until reconcile's next round (box scenario k).
    Other pools' names and static names are left alone."""
    config = write_config(tmp_path, cloud, slurm, static_nodes=["train-0"])
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"])
    now = time.time()
    assert record_capacity_error(settings, "train", "InsufficientInstanceCapacity", now)
    unheld = settings_for(tmp_path, cloud, slurm, protected_failure_count=1)
    assert record_boot_failures(unheld, {"train-spot": 1}, now) == ["train-spot"]
    holds = json.loads(pools_report(settings, now=now))
    result = run_in_process(config, cloud, "suspend", "train-[0-2],train-spot-1")
    assert result.returncode == EXIT_OK, result.stderr
    assert scontrol_updates(slurm) == [
        ["nodename=train-1,train-2", "state=down", f"reason={holds['train']['hold']}"],
        ["nodename=train-spot-1", "state=down", f"reason={holds['train-spot']['hold']}"],
    ]
    slurm.record.unlink()
    slurm.nodes(show_node("train-spot-1", "IDLE+CLOUD+POWERING_DOWN"))
    assert run_in_process(config, cloud, "unprotect", "train-spot").returncode == EXIT_OK
    slurm.record.unlink()
    assert run_in_process(config, cloud, "suspend", "train-spot-1").returncode == EXIT_OK
    assert scontrol_updates(slurm) == [], "a pool no longer held: nothing held"


def test_suspend_holds_by_the_other_controllers_hold_too(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """With two controllers each keeps its own state: after a takeover the hold the other one recorded
    is only in Slurm's reasons, which SuspendProgram reads as apply_holds does."""
    settings = settings_for(tmp_path, cloud, slurm)
    slurm.nodes(
        show_node("train-2", "DOWN+CLOUD+POWERED_DOWN", COOLDOWN_REASON),
        show_node("train-1", "IDLE+CLOUD+POWERING_DOWN"),
        show_node("train-spot-1", "IDLE+CLOUD+POWERING_DOWN"),
    )
    ec2 = harness.ec2_nodes(cloud, slurm)
    assert suspend(settings, ec2, Slurm(slurm.scontrol), ["train-1", "train-spot-1"], now=T0) == EXIT_OK
    assert scontrol_updates(slurm) == [["nodename=train-1", "state=down", f"reason={COOLDOWN_REASON}"]]


def test_suspend_judges_a_hold_at_the_time_it_is_given(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A cool-down recorded now is over at a time past its end: suspend given that time holds nothing."""
    settings = settings_for(tmp_path, cloud, slurm)
    recorded = time.time()
    assert record_capacity_error(settings, "train", "InsufficientInstanceCapacity", recorded)
    over = recorded + settings.insufficient_capacity_timeout_s + 60
    ec2 = harness.ec2_nodes(cloud, slurm)
    assert suspend(settings, ec2, Slurm(slurm.scontrol), ["train-1"], now=over) == EXIT_OK
    assert scontrol_updates(slurm) == [], "the cool-down is over at the time given"


def test_suspend_fails_when_an_instance_cannot_be_terminated_though_nothing_is_held(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """SuspendProgram's failure is what Slurm and the operator see of an instance left running: a
    termination refused fails suspend even where no hold had to be set."""
    protected = cloud.launch("train-1")
    cloud.protect(protected)
    try:
        settings = settings_for(tmp_path, cloud, slurm)
        ec2 = harness.ec2_nodes(cloud, slurm)
        assert suspend(settings, ec2, Slurm(slurm.scontrol), ["train-1"], now=T0) == EXIT_FAILED
        assert cloud.state(protected) == "running" and scontrol_updates(slurm) == []
    finally:
        cloud.protect(protected, False)


def test_each_reconcile_round_says_which_pools_are_held_and_why(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(tmp_path, cloud, slurm)
    assert record_capacity_error(settings, "train-spot", "InsufficientInstanceCapacity", T0)
    held = json.loads(pools_report(settings, now=T0 + 1))["train-spot"]["hold"]
    slurm.nodes(show_node("train-1", "IDLE+CLOUD"))
    caplog.set_level("INFO", logger=harness.LOG.name)
    assert reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=T0 + 1) == EXIT_OK
    warnings = [
        r.getMessage() for r in caplog.records if r.module == "reconcile" and r.levelname == "WARNING"
    ]
    assert warnings == [f"reconcile: pool train-spot is held: {held}"]


def test_a_release_that_came_while_the_name_powered_down_is_done_again_by_reconcile(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """A hold ending (cool-down over, unprotect) while SuspendProgram's held name still powers down:
    slurmctld takes the release's reason and ignores its POWER_DOWN_FORCE ("already powering down"),
    and the name ends DOWN+POWERED_DOWN with the hold-over reason. The next round releases it again."""
    settings = settings_for(tmp_path, cloud, slurm)
    slurm.nodes(show_node("train-1", "DOWN+CLOUD+POWERED_DOWN", f"{REASON_HOLD_OVER} [slurm@2027-01-15]"))
    assert reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=T0) == EXIT_OK
    assert [u[:2] for u in scontrol_updates(slurm)] == [["nodename=train-1", "state=power_down_force"]]


def test_reconcile_keeps_holding_then_releases_the_names_when_the_cool_down_ends(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """The failed name comes back to idle~ after SuspendTimeout: the next round holds it too. A held
    name is DOWN+POWERED_DOWN with a gpuplat reason: reconcile's failed-resume recovery must leave it."""
    settings = settings_for(tmp_path, cloud, slurm)
    slurm.nodes(*POOL_AFTER_ICE)
    ec2 = Ec2Nodes(NoCapacityEc2(client(cloud), slurm), cloud.stack)
    resume(settings, ec2, Slurm(slurm.scontrol), ["train-1"], now=T0)
    held = show_node("train-2", "DOWN+CLOUD+POWERED_DOWN", COOLDOWN_REASON)
    slurm.record.unlink()
    slurm.nodes(show_node("train-1", "IDLE+CLOUD+POWERED_DOWN"), held)
    assert (
        reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=T0 + 300) == EXIT_OK
    )
    assert scontrol_updates(slurm) == [["nodename=train-1", "state=down", f"reason={COOLDOWN_REASON}"]]
    slurm.record.unlink()
    slurm.nodes(show_node("train-1", "DOWN+CLOUD+POWERED_DOWN", COOLDOWN_REASON), held)
    assert (
        reconcile(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), now=T0 + 600) == EXIT_OK
    )
    assert scontrol_updates(slurm) == [
        ["nodename=train-1,train-2", "state=power_down_force", f"reason={REASON_HOLD_OVER}"]
    ]
    assert json.loads((tmp_path / "state" / "pools.json").read_text())["cooldown"] == {}


def test_no_cool_down_when_its_timeout_is_0(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0.0)
    slurm.nodes(*POOL_AFTER_ICE)
    ec2 = Ec2Nodes(NoCapacityEc2(client(cloud), slurm), cloud.stack)
    resume(settings, ec2, Slurm(slurm.scontrol), ["train-1"], now=T0)
    assert [u for u in scontrol_updates(slurm) if "state=down" in u] == []


def fail_boots(settings: Any, cloud: Cloud, slurm: SlurmRecorder, names: list[str]) -> None:
    resume_fail(settings, harness.ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), names)


def test_ten_boot_failures_in_a_row_put_the_pool_in_protected_mode(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """ParallelCluster: protected_failure_count 10 (clustermgtd.py:165); no launch until an operator
    ends it (here `unprotect POOL`)."""
    settings = settings_for(tmp_path, cloud, slurm)
    fail_boots(settings, cloud, slurm, [f"train-{i}" for i in range(1, 6)])
    fail_boots(settings, cloud, slurm, [f"train-{i}" for i in range(1, 5)])
    assert json.loads(pools_report(settings))["train"] == {
        "hold": None, "boot_failures": 9, "protected_failure_count": 10
    }  # fmt: skip
    before = time.time()
    fail_boots(settings, cloud, slurm, ["train-7", "train-spot-1"])
    entered = read_holds(settings)["protected"]["train"]
    assert entered["failures"] == 10 and before <= entered["since"] <= time.time(), "dated when it began"
    report = json.loads(pools_report(settings))
    protected = "gpuplat protected mode: 10 boot failures in a row; gpuplat-ec2-nodes unprotect train"
    assert report["train"]["hold"] == protected
    assert report["train-spot"]["hold"] is None

    slurm.record.unlink()
    ec2 = harness.ec2_nodes(cloud, slurm)
    assert resume(settings, ec2, Slurm(slurm.scontrol), ["train-8"]) == EXIT_FAILED
    assert ["ec2", "run_instances", ""] not in slurm.calls()
    slurm.record.unlink()
    slurm.nodes(show_node("train-8", "IDLE+CLOUD+POWERED_DOWN"), show_node("train-9", "ALLOCATED+CLOUD"))
    assert reconcile(settings, ec2, Slurm(slurm.scontrol)) == EXIT_OK
    assert scontrol_updates(slurm) == [["nodename=train-8", "state=down", f"reason={protected}"]]

    slurm.record.unlink()
    slurm.nodes(show_node("train-8", "DOWN+CLOUD+POWERED_DOWN", protected))
    assert unprotect(settings, Slurm(slurm.scontrol), "train") == EXIT_OK
    assert scontrol_updates(slurm) == [
        ["nodename=train-8", "state=power_down_force", f"reason={REASON_HOLD_OVER}"]
    ]
    assert json.loads(pools_report(settings))["train"]["boot_failures"] == 0


def test_a_node_that_comes_up_starts_the_count_again(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """ParallelCluster resets a partition's count when one of its nodes is online
    (clustermgtd.py:488); here when one comes up, so a static node that stays up does not hide the
    failures of every new launch."""
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"])
    ec2 = harness.ec2_nodes(cloud, slurm)
    slurm.nodes(show_node("train-0", "IDLE+CLOUD"))
    reconcile(settings, ec2, Slurm(slurm.scontrol))
    fail_boots(settings, cloud, slurm, [f"train-{i}" for i in range(1, 10)])
    reconcile(settings, ec2, Slurm(slurm.scontrol))
    assert json.loads(pools_report(settings))["train"]["boot_failures"] == 9, "train-0 was up already"
    slurm.nodes(show_node("train-0", "IDLE+CLOUD"), show_node("train-5", "MIXED+CLOUD"))
    reconcile(settings, ec2, Slurm(slurm.scontrol))
    assert json.loads(pools_report(settings))["train"]["boot_failures"] == 0
    fail_boots(settings, cloud, slurm, ["train-6"])
    assert json.loads(pools_report(settings))["train"]["hold"] is None


def test_protected_mode_is_off_with_a_count_of_0(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    settings = settings_for(tmp_path, cloud, slurm, protected_failure_count=0)
    fail_boots(settings, cloud, slurm, [f"train-{i}" for i in range(20)])
    assert json.loads(pools_report(settings))["train"]["hold"] is None


def test_unprotect_of_an_unknown_pool_says_which_pools_there_are(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    result = run_program(write_config(tmp_path, cloud, slurm), cloud, "unprotect", "trian")
    assert result.returncode == EXIT_USAGE
    assert "unprotect: 'trian' is not a configured pool (pools: train,train-spot)" in result.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"insufficient_capacity_timeout_s": -1}, "insufficient_capacity_timeout_s must not be negative"),
        ({"protected_failure_count": "ten"}, "protected_failure_count must be a whole number, 0 or more"),
        ({"protected_failure_count": 2.5}, "protected_failure_count must be a whole number, 0 or more"),
    ],
)
def test_bad_hold_settings_are_usage_errors(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, setting: dict[str, Any], message: str
) -> None:
    result = run_program(write_config(tmp_path, cloud, slurm, setting), cloud, "pools")
    assert result.returncode == EXIT_USAGE
    assert message in result.stderr
    assert result.stdout == ""


def test_a_controller_without_the_state_keeps_the_holds_slurm_shows(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """With high_availability both controllers run reconcile, each with its own state file: the one
    that did not see the capacity error or count the boot failures must neither release the other's
    holds nor let the pool's other names be launched; it ends a cool-down when its time has come."""
    protected = "gpuplat protected mode: 10 boot failures in a row; gpuplat-ec2-nodes unprotect train-spot"
    slurm.nodes(
        show_node("train-1", "DOWN+CLOUD+POWERED_DOWN", COOLDOWN_REASON),
        show_node("train-2", "IDLE+CLOUD+POWERED_DOWN"),
        show_node("train-spot-1", "DOWN+CLOUD+POWERED_DOWN", protected),
        show_node("train-spot-2", "IDLE+CLOUD+POWERED_DOWN"),
    )
    backup = settings_for(tmp_path / "head-1", cloud, slurm)
    ec2 = harness.ec2_nodes(cloud, slurm)
    assert reconcile(backup, ec2, Slurm(slurm.scontrol), now=T0 + 599) == EXIT_OK
    assert scontrol_updates(slurm) == [
        ["nodename=train-2", "state=down", f"reason={COOLDOWN_REASON}"],
        ["nodename=train-spot-2", "state=down", f"reason={protected}"],
    ]
    slurm.record.unlink()
    assert reconcile(backup, ec2, Slurm(slurm.scontrol), now=T0 + 600) == EXIT_OK
    assert scontrol_updates(slurm) == [
        ["nodename=train-spot-2", "state=down", f"reason={protected}"],
        ["nodename=train-1", "state=power_down_force", f"reason={REASON_HOLD_OVER}"],
    ], "the cool-down is over for both controllers; protected mode is unprotect's to end"
