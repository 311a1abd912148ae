"""`gpuplat status` on an aws Slurm stack shows each training pool's hold and boot-failure count, read
on the primary controller through SSM Run Command (infra/lifecycle/fleet_holds.py). EC2 is a stand-in
answering describe_instances; SSM a stand-in that answers what the node program would print."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from infra.cli.commands.lifecycle import render_cloud_status
from infra.lifecycle.cloud_stack import CloudStatus
from infra.lifecycle.fleet_holds import POOLS_COMMAND, FleetHolds, PoolHold, read_fleet_holds
from infra.platform.resolve import ResolvedPlatform

PROTECTED = "gpuplat protected mode: 10 boot failures in a row; gpuplat-ec2-nodes unprotect train-spot"
REPORT: dict[str, dict[str, Any]] = {
    "train": {"hold": None, "boot_failures": 2, "protected_failure_count": 10},
    "train-spot": {
        "hold": PROTECTED,
        "boot_failures": 10,
        "protected_failure_count": 10,
    },
}


class FakeEc2:
    def __init__(self, running: list[str]) -> None:
        self.running = running
        self.filters: list[Any] = []

    def describe_instances(self, Filters: list[dict[str, Any]]) -> dict[str, Any]:
        self.filters = Filters
        return {"Reservations": [{"Instances": [{"InstanceId": i} for i in self.running]}]}


class FakeSsm:
    def __init__(self, *invocations: dict[str, Any] | Exception, refuse: bool = False) -> None:
        self.invocations = list(invocations)
        self.refuse = refuse
        self.sent: list[dict[str, Any]] = []

    def send_command(self, **request: Any) -> dict[str, Any]:
        if self.refuse:
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "SendCommand")
        self.sent.append(request)
        return {"Command": {"CommandId": "c-1"}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:
        answer = self.invocations.pop(0) if len(self.invocations) > 1 else self.invocations[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def aws_prod(shipped_platforms: dict[str, ResolvedPlatform]) -> ResolvedPlatform:
    return shipped_platforms["aws-prod"]


def test_the_pools_holds_are_read_on_the_primary_controller(aws_prod: ResolvedPlatform) -> None:
    ec2 = FakeEc2(["i-0head0"])
    ssm = FakeSsm(
        {"Status": "InProgress"},
        {"Status": "Success", "StandardOutputContent": json.dumps(REPORT)},
    )
    holds = read_fleet_holds(aws_prod, ec2, ssm, sleep=lambda _: None)
    assert holds.note is None
    assert holds.pools == [
        PoolHold("train", None, 2, 10),
        PoolHold("train-spot", PROTECTED, 10, 10),
    ]
    assert ssm.sent == [{"InstanceIds": ["i-0head0"], "DocumentName": "AWS-RunShellScript",
                         "Parameters": {"commands": [POOLS_COMMAND]}}]  # fmt: skip
    assert {f["Name"]: f["Values"] for f in ec2.filters}["tag:gpuplat:node"] == ["head-0"]


def test_an_invocation_not_yet_visible_is_waited_for(aws_prod: ResolvedPlatform) -> None:
    """GetCommandInvocation answers InvocationDoesNotExist until the command SendCommand just made is
    visible (the AWS CLI's command_executed waiter retries on it)."""
    unseen = ClientError({"Error": {"Code": "InvocationDoesNotExist", "Message": ""}}, "GetCommandInvocation")
    ssm = FakeSsm(unseen, {"Status": "Success", "StandardOutputContent": json.dumps(REPORT)})
    holds = read_fleet_holds(aws_prod, FakeEc2(["i-0head0"]), ssm, sleep=lambda _: None)
    assert holds.note is None and len(holds.pools) == 2


@pytest.mark.parametrize(
    ("ec2", "ssm", "note"),
    [
        (FakeEc2([]), FakeSsm({"Status": "Success"}), "head-0 of stack aws-prod is not running"),
        (FakeEc2(["i-0"]), FakeSsm(refuse=True), "AccessDeniedException"),
        (FakeEc2(["i-0"]), FakeSsm({"Status": "Failed", "StandardErrorContent": "sudo: no user\n"}),
         "Failed sudo: no user"),
        (FakeEc2(["i-0"]), FakeSsm({"Status": "Success", "StandardOutputContent": "[]"}), "unreadable"),
    ],
)  # fmt: skip
def test_holds_that_cannot_be_read_are_a_note_not_an_error(
    aws_prod: ResolvedPlatform, ec2: FakeEc2, ssm: FakeSsm, note: str
) -> None:
    holds = read_fleet_holds(aws_prod, ec2, ssm, sleep=lambda _: None)
    assert holds.pools == [] and holds.note is not None and note in holds.note
    assert holds.note.startswith("pool holds not read")


def test_status_shows_each_pools_hold(capsys: pytest.CaptureFixture[str]) -> None:
    status = CloudStatus(
        "aws-prod", "2026-12-06", "succeeded", {}, {},
        holds=FleetHolds([PoolHold("train", None, 2, 10),
                          PoolHold("train-spot", "gpuplat protected mode: 10", 10, 10)]),
    )  # fmt: skip
    render_cloud_status(status)
    out = capsys.readouterr().out
    assert "gpuplat protected mode: 10" in out and "10 of 10" in out and "2 of 10" in out
