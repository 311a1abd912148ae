"""`gpuplat status` on an aws Slurm stack: each training pool's hold (capacity cool-down, protected
mode) and boot-failure count, as the controllers' node program keeps them (`gpuplat-ec2-nodes pools`,
roles/slurm_elastic/files/gpuplat_ec2_nodes/holds.py). The state lives on the primary controller, so
it is read there through SSM Run Command (AWS-RunShellScript; every node role carries
AmazonSSMManagedInstanceCore) with the operator's credentials. What cannot be read is said in a note,
never an error: the stack's own status still shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.nodes.inventory import TAG_NODE, TAG_STACK
from infra.platform.resolve import ResolvedPlatform

POOLS_COMMAND = "sudo -u slurm gpuplat-ec2-nodes pools"
COMMAND_WAIT_S = 60.0
COMMAND_POLL_S = 2.0
# SSM's command statuses that are not final (Systems Manager API Reference, GetCommandInvocation, Status).
RUNNING_STATUSES = frozenset({"Pending", "InProgress", "Delayed"})
# What GetCommandInvocation answers until the invocation SendCommand just made is visible (SSM is
# eventually consistent; the AWS CLI's command_executed waiter retries on it: botocore
# data/ssm/2014-11-06/waiters-2.json).
NOT_YET_VISIBLE = "InvocationDoesNotExist"


@dataclass(frozen=True)
class PoolHold:
    pool: str
    hold: str | None
    boot_failures: int
    protected_failure_count: int


@dataclass
class FleetHolds:
    pools: list[PoolHold] = field(default_factory=list)
    note: str | None = None  # why the holds could not be read


def parse_pools_report(text: str) -> list[PoolHold]:
    """`gpuplat-ec2-nodes pools`'s JSON; ValueError when it is not that."""
    report = json.loads(text)
    if not isinstance(report, dict):
        raise ValueError("not a JSON object of pools")
    return [
        PoolHold(
            str(pool), entry.get("hold"), int(entry["boot_failures"]), int(entry["protected_failure_count"])
        )
        for pool, entry in sorted(report.items())
    ]


def read_fleet_holds(
    platform: ResolvedPlatform,
    ec2: Any,
    ssm: Any,
    sleep: Callable[[float], None] = time.sleep,
    wait_s: float = COMMAND_WAIT_S,
) -> FleetHolds:
    """The pools' holds from the primary controller, or a note saying why there are none."""
    controller = platform.controller_pool.node_names()[0]
    where = f"`{POOLS_COMMAND}` on {controller}"
    try:
        reservations = ec2.describe_instances(Filters=[
            {"Name": f"tag:{TAG_STACK}", "Values": [platform.name]},
            {"Name": f"tag:{TAG_NODE}", "Values": [controller]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ])["Reservations"]  # fmt: skip
        instances = [i["InstanceId"] for r in reservations for i in r["Instances"]]
        if not instances:
            return FleetHolds(
                note=f"pool holds not read: {controller} of stack {platform.name} is not running"
            )
        command = ssm.send_command(
            InstanceIds=instances[:1],
            DocumentName="AWS-RunShellScript",
            Parameters={"commands": [POOLS_COMMAND]},
        )["Command"]["CommandId"]
        deadline = time.monotonic() + wait_s
        while True:
            sleep(COMMAND_POLL_S)
            try:
                invocation = ssm.get_command_invocation(CommandId=command, InstanceId=instances[0])
            except Exception as err:
                if error_code(err) != NOT_YET_VISIBLE or time.monotonic() > deadline:
                    raise
                continue
            if invocation["Status"] not in RUNNING_STATUSES or time.monotonic() > deadline:
                break
    except Exception as err:  # botocore's ClientError and BotoCoreError, credentials missing included
        return FleetHolds(note=f"pool holds not read ({where}): {err}")
    if invocation["Status"] != "Success":
        detail = str(invocation.get("StandardErrorContent") or "").strip()
        return FleetHolds(note=f"pool holds not read ({where}): {invocation['Status']} {detail}".rstrip())
    try:
        return FleetHolds(pools=parse_pools_report(str(invocation.get("StandardOutputContent", ""))))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return FleetHolds(note=f"pool holds not read ({where}): unreadable answer ({err})")


def error_code(err: Exception) -> str | None:
    """botocore's ClientError code, None for anything else."""
    response = getattr(err, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None


def fleet_holds(platform: ResolvedPlatform) -> FleetHolds:
    """read_fleet_holds with boto3's clients for the stack's region (the operator's credentials)."""
    import boto3

    region = str(platform.spec.region or "") or None
    return read_fleet_holds(
        platform, boto3.client("ec2", region_name=region), boto3.client("ssm", region_name=region)
    )
