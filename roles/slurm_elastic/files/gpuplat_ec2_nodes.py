#!/usr/bin/env python3
"""Elastic Slurm training pools on EC2: the programs of Slurm power saving.

Every node name of a pool (``<pool>-<i>``) is defined in slurm.conf (State=CLOUD). Slurm runs:

  resume HOSTLIST       (ResumeProgram) reuse or launch one instance per node name from the pool's
                        launch template, tag it, and tell Slurm its address. Names that got no usable
                        instance (an EC2 error such as InsufficientInstanceCapacity, or no private
                        address) lose the instance they may have got and are set POWER_DOWN_FORCE with
                        the error code in the reason: their jobs requeue and the names return to power
                        saving (idle~), to be launched again on the next attempt.
  suspend HOSTLIST      (SuspendProgram) terminate the instances of those node names.
  resume-fail HOSTLIST  (ResumeFailProgram) nodes that did not register within ResumeTimeout, which
                        Slurm has set DOWN+POWERED_DOWN: terminate their instances, then
                        POWER_DOWN_FORCE them so they return to power saving (idle~).

on the controller, from systemd timers:

  keep-static           keep the pools' static nodes up: power up those Slurm has powered down;
                        replace a DOWN one (terminate its instance, POWER_DOWN_FORCE; a later round
                        powers it up). DRAIN/FAIL nodes are left to the administrator. A static node
                        that keeps needing this is retried with exponential back-off (base doubling up
                        to a bound), kept in <state_dir>/keep-static.json.
  reconcile             terminate the pools' instances (tags gpuplat:stack and gpuplat:pool) that no
                        node owns: (a) without a gpuplat:node tag and older than the grace, (b) named
                        for a node Slurm does not know (older than the grace), or for a node powered
                        down or powering down for at least the grace less one round (first seen in
                        <state_dir>/reconcile.json), (c) the other instances of a node that has a
                        live one (kept: the one at the node's NodeAddr, else the newest live one),
                        older than the grace. Dynamic nodes a failed resume left DOWN+POWERED_DOWN
                        (reason "ResumeTimeout reached" or "gpuplat ...") lose their instances and
                        are set POWER_DOWN_FORCE. Every decision is logged; a failed termination is
                        tried again next round. An orphan is gone within grace + timer interval.

by an operator (before ``pulumi destroy``: Slurm-launched instances are not Pulumi resources):

  teardown              terminate every instance of the stack's pools (every state but terminated)
                        and wait (--timeout-seconds) until none is left; the ones left are listed.

and on a spot node, from systemd:

  spot-watch            on an interruption notice: drain this node, list its jobs, send SIGTERM to
                        their job steps only (not the batch shell, so the job survives to be
                        requeued), wait the grace period for them to checkpoint, POWER_DOWN_FORCE
                        the node (Slurm requeues the requeueable batch jobs still running and ends
                        the rest; the name gets a new instance), then requeue the requeueable batch
                        jobs that ended in the grace period.

Slurm behaviour relied on (21.08 Ubuntu 22.04, 22.05 Debian 12, 23.11 Ubuntu 24.04, 24.11 Debian 13;
tags slurm-21-08-5-1, slurm-22-05-8-1, slurm-23-11-4-1, slurm-24-11-5-1 of SchedMD/slurm):

- ResumeTimeout: a node still POWERING_UP is set DOWN+POWERED_DOWN ("ResumeTimeout reached") and
  ResumeFailProgram runs (src/slurmctld/power_save.c _do_power_work, all four). Nothing brings it
  back by itself: the suspend branch there needs a POWER_DOWN request or a last_busy (0 here).
- POWER_DOWN_FORCE (state=power_down_force) is accepted in any state while power saving is on
  (src/slurmctld/node_mgr.c _valid_node_state_change; 21.08 refuses any change to a node with
  INVALID_REG). update_node() kills the node's jobs, requeueing the batch jobs that allow it
  (kill_running_job_by_node_name), clears POWERING_UP and sets POWER_DOWN; 21.08 also sets the base
  state IDLE there. 22.05 (and 23.11 before 23.11.4) clears POWERED_DOWN so the power thread
  suspends the node again; 23.11.4+ keeps it and the power thread suspends POWERED_DOWN nodes too
  (_node_state_suspendable, commit e2dd4418d4). The suspend runs SuspendProgram (terminate:
  idempotent), sets POWERING_DOWN and, with SlurmctldParameters=idle_on_node_suspend (slurm.conf),
  the base state IDLE without DRAIN/FAIL; after SuspendTimeout the node is IDLE+POWERED_DOWN and
  allocatable (make_node_avail). So POWER_DOWN_FORCE takes DOWN+POWERED_DOWN back to idle~ on every
  release; state=resume or state=idle would skip SuspendProgram, the NodeAddr reset and nodes with
  INVALID_REG, and state=resume sets NOT_RESPONDING (_require_node_reg). It is how ParallelCluster
  resets a failed dynamic node (aws-parallelcluster-node v3.11.0,
  src/common/schedulers/slurm_commands.py set_nodes_power_down, from src/slurm_plugin/clustermgtd.py).
- Static nodes are in SuspendExcNodes; a POWER_DOWN request overrides the exclusion (power_save.c:
  IS_NODE_POWER_DOWN comes before the avoid_node_bitmap test).
- `scancel --signal=SIG` without --full/--batch signals the job steps only, never the batch shell
  (src/slurmctld/job_mgr.c _signal_job: KILL_STEPS_ONLY; src/slurmd/slurmd/req.c
  _kill_all_active_steps skips SLURM_BATCH_SCRIPT), all four releases.
- `scontrol requeue` takes running, suspended *and finished* batch jobs back to PENDING
  (job_mgr.c _job_requeue_op: "we support requeue of done/exit/exiting jobs"); it refuses jobs
  without Requeue (ESLURM_DISABLED) and non-batch jobs (ESLURM_BATCH_ONLY), so only those with
  BatchFlag and Requeue (squeue --Format=JobID,BatchFlag,Requeue) are asked for. spot-watch asks
  only for jobs that already ended: a running job it requeued would still be COMPLETING on the node
  when POWER_DOWN_FORCE releases the node a second time (kill_running_job_by_node_name's COMPLETING
  branch), and on 22.05 the GPU of the job's next allocation then stays allocated for good (the box,
  scenario d: "gres/gpu: job N dealloc of node X bad node_offset 0 count is 0", gres_ctld.c). So the
  jobs still running are left to POWER_DOWN_FORCE, whose requeue is the node-failure one (the
  attempt is NODE_FAIL in accounting, the job PENDING with Restarts+1).
- Before 23.02, powered-down CLOUD nodes are listed only with PrivateData=cloud (node_mgr.c
  _is_cloud_hidden); slurm.conf sets it there. Were it missing, an instance of such a node would
  still only go after the grace, as an instance of a powered-down node does.

Instances carry the tags gpuplat:stack, gpuplat:pool, gpuplat:node and Name. The configuration
is a JSON file (``--config``, default /etc/gpuplat/ec2-nodes.json)::

  {"stack": "prod", "region": "us-east-1", "scontrol": "/usr/bin/scontrol",
   "state_dir": "/var/lib/gpuplat", "orphan_grace_s": 300,
   "static_backoff_base_s": 60, "static_backoff_max_s": 3600,
   "pools": {"train": {"launch_template_id": "lt-...", "subnet_id": "subnet-..." | null,
                       "static_nodes": ["train-0"]}}}

(state_dir, orphan_grace_s and static_backoff_* are optional, with these defaults). squeue and
scancel are looked up beside scontrol. spot-watch reads no configuration file. The EC2 endpoint is
boto3's (AWS_ENDPOINT_URL is honoured) unless ``--endpoint-url`` is given.

Exit codes:
  0  done (suspend of names without instances included)
  1  partly failed: a node got no instance, an EC2 call or a Slurm command failed, a state file
     could not be written, Slurm's node list could not be read (reconcile then terminates nothing),
     or instances are left after the teardown wait (they are listed)
  2  usage error: bad arguments, unreadable or malformed configuration, malformed hostlist
  3  a node name belongs to no configured pool (the other names were handled)
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNKNOWN_NODE = 3

DEFAULT_CONFIG = "/etc/gpuplat/ec2-nodes.json"
DEFAULT_STATE_DIR = "/var/lib/gpuplat"
DEFAULT_IMDS_URL = "http://169.254.169.254"
TAG_STACK = "gpuplat:stack"
TAG_POOL = "gpuplat:pool"
TAG_NODE = "gpuplat:node"
LIVE_STATES = ("pending", "running")
TERMINABLE_STATES = ("pending", "running", "stopping", "stopped")
NOT_TERMINATED_STATES = (*TERMINABLE_STATES, "shutting-down")
# EC2 accepts at most 200 values per describe filter, and 1000 instance IDs per TerminateInstances.
FILTER_VALUES_MAX = 200
TERMINATE_MAX = 1000
COMMAND_TIMEOUT_S = 60
ADDRESS_WAIT_S = 60.0
ADDRESS_POLL_S = 2.0
IMDS_TIMEOUT_S = 2
IMDS_TOKEN_TTL_S = 60
ErrorTypes = (ClientError, BotoCoreError)

# Slurm node state flags (`scontrol -o show node`, State=BASE+FLAG+...).
POWER_TRANSITIONS = frozenset({"POWER_UP", "POWERING_UP", "POWER_DOWN", "POWERING_DOWN"})
GOING_UP = frozenset({"POWER_UP", "POWERING_UP"})
POWERED_OFF = frozenset({"POWERED_DOWN", "POWERING_DOWN"})
# Drained or failed by an administrator or a health check: left to them.
HELD = frozenset({"DRAIN", "FAIL"})
# Reasons of a DOWN+POWERED_DOWN node after a failed resume: Slurm's (power_save.c) and ours.
FAILED_RESUME_REASONS = ("ResumeTimeout reached", "gpuplat")
REASON_RESUME_FAIL = "gpuplat resume-fail: no registration within ResumeTimeout"
REASON_REPLACE = "gpuplat keep-static: replacing a DOWN static node"
REASON_RECOVER = "gpuplat reconcile: back to power saving after a failed resume"

LOG = logging.getLogger("gpuplat-ec2-nodes")


class UsageError(Exception):
    """Bad arguments, configuration or hostlist (exit 2)."""


@dataclass(frozen=True)
class Pool:
    name: str
    launch_template_id: str
    subnet_id: str | None
    static_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Settings:
    stack: str
    region: str
    scontrol: str
    pools: dict[str, Pool]
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    orphan_grace_s: float = 300.0
    static_backoff_base_s: float = 60.0
    static_backoff_max_s: float = 3600.0

    @property
    def static_nodes(self) -> list[str]:
        return [name for pool in self.pools.values() for name in pool.static_nodes]


def load_settings(path: Path) -> Settings:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read configuration {path}: {err}") from err
    try:
        pools = {name: parse_pool(name, entry) for name, entry in raw["pools"].items()}
        return Settings(
            stack=str(raw["stack"]),
            region=str(raw["region"]),
            scontrol=str(raw.get("scontrol") or "/usr/bin/scontrol"),
            pools=pools,
            state_dir=Path(raw.get("state_dir") or DEFAULT_STATE_DIR),
            orphan_grace_s=seconds(raw, "orphan_grace_s", 300.0),
            static_backoff_base_s=seconds(raw, "static_backoff_base_s", 60.0),
            static_backoff_max_s=seconds(raw, "static_backoff_max_s", 3600.0),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise UsageError(f"configuration {path}: missing or malformed entry {err}") from err


def parse_pool(name: str, entry: dict[str, Any]) -> Pool:
    return Pool(
        name=name,
        launch_template_id=str(entry["launch_template_id"]),
        subnet_id=entry.get("subnet_id") or None,
        static_nodes=tuple(str(node) for node in entry.get("static_nodes") or ()),
    )


def seconds(raw: dict[str, Any], key: str, default: float) -> float:
    value = float(raw.get(key, default))
    if value < 0:
        raise ValueError(f"{key} must not be negative")
    return value


# --- Slurm hostlists ------------------------------------------------------------------------------

_BRACKET_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``a-[0-3,5],b-1`` -> a-0 a-1 a-2 a-3 a-5 b-1 (zero padding and several groups kept)."""
    names: dict[str, None] = {}
    for pattern in split_outside_brackets(hostlist):
        names.update(dict.fromkeys(expand_pattern(pattern)))
    if not names:
        raise UsageError(f"empty hostlist {hostlist!r}")
    return list(names)


def split_outside_brackets(hostlist: str) -> list[str]:
    patterns: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise UsageError(f"malformed hostlist {hostlist!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            patterns.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"malformed hostlist {hostlist!r}: unclosed bracket")
    patterns.append("".join(current))
    return [pattern.strip() for pattern in patterns if pattern.strip()]


def expand_pattern(pattern: str) -> list[str]:
    pieces = _BRACKET_GROUP.split(pattern)
    literals, ranges = pieces[0::2], pieces[1::2]
    if any("[" in literal or "]" in literal for literal in literals):
        raise UsageError(f"malformed host pattern {pattern!r}")
    choices = [expand_ranges(spec, pattern) for spec in ranges]
    return [
        literals[0] + "".join(value + literal for value, literal in zip(combo, literals[1:], strict=True))
        for combo in product(*choices)
    ]


def expand_ranges(spec: str, pattern: str) -> list[str]:
    values: list[str] = []
    for item in spec.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"malformed range {item!r} in {pattern!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise UsageError(f"descending range {item!r} in {pattern!r}")
        values.extend(str(index).zfill(len(low)) for index in range(int(low), int(high) + 1))
    return values


def pool_of(name: str, pools: dict[str, Pool]) -> str | None:
    """The pool of ``<pool>-<int>``; the index has no dash, so this is the longest-prefix match."""
    prefix, dash, index = name.rpartition("-")
    return prefix if dash and index.isdigit() and prefix in pools else None


def group_by_pool(names: Iterable[str], pools: dict[str, Pool]) -> tuple[dict[str, list[str]], list[str]]:
    groups: dict[str, list[str]] = {}
    unknown: list[str] = []
    for name in names:
        pool = pool_of(name, pools)
        if pool is None:
            unknown.append(name)
        else:
            groups.setdefault(pool, []).append(name)
    return groups, unknown


def report_unknown(names: list[str], pools: dict[str, Pool], action: str) -> int:
    if not names:
        return EXIT_OK
    LOG.error(
        "%s: %s belong to no configured pool (pools: %s); names are <pool>-<index>",
        action,
        ",".join(names),
        ",".join(sorted(pools)) or "none",
    )
    return EXIT_UNKNOWN_NODE


# --- Slurm commands -------------------------------------------------------------------------------


def run_command(argv: Sequence[str]) -> str | None:
    """stdout of the command, or None (logged) when it could not run or failed."""
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        LOG.error("%s: %s", " ".join(argv), err)
        return None
    if result.returncode != 0:
        LOG.error("%s failed (exit %d): %s", " ".join(argv), result.returncode, result.stderr.strip())
        return None
    return result.stdout


@dataclass(frozen=True)
class NodeInfo:
    """One node of ``scontrol -o show node``: its state flags (base state included), NodeAddr, Reason."""

    name: str
    flags: frozenset[str]
    addr: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Job:
    """A job of ``squeue --Format=JobID,BatchFlag,Requeue``."""

    job_id: str
    batch: bool
    requeue: bool


_NODE_FIELDS = {key: re.compile(rf"(?:^|\s){key}=(\S*)") for key in ("NodeName", "State", "NodeAddr")}
# Reason (free text) is followed only by these fields (src/api/node_info.c, 21.08 to 24.11).
_NODE_REASON = re.compile(
    r"(?:^|\s)Reason=(.*?)(?=\s(?:Comment|Extra|InstanceId|InstanceType|ReservationName)=|$)"
)


def parse_nodes(text: str) -> dict[str, NodeInfo]:
    """Nodes by name from ``scontrol -o show node`` (one node per line)."""
    nodes: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        fields = {key: pattern.search(line) for key, pattern in _NODE_FIELDS.items()}
        name, state, addr = fields["NodeName"], fields["State"], fields["NodeAddr"]
        if name and state:
            reason = _NODE_REASON.search(line)
            nodes[name.group(1)] = NodeInfo(
                name=name.group(1),
                flags=frozenset(state.group(1).split("+")),
                addr=addr.group(1) if addr else "",
                reason=reason.group(1).strip() if reason else "",
            )
    return nodes


def parse_jobs(text: str) -> list[Job]:
    jobs = []
    for line in text.splitlines():
        columns = line.split()
        if len(columns) == 3 and columns[0].isdigit():
            jobs.append(Job(columns[0], batch=columns[1] != "0", requeue=columns[2] == "1"))
    return jobs


class Slurm:
    def __init__(self, scontrol: str) -> None:
        self.scontrol = scontrol

    def tool(self, name: str) -> str:
        """squeue, scancel: beside scontrol."""
        return str(Path(self.scontrol).with_name(name))

    def update(self, names: Sequence[str], *settings: str) -> bool:
        argv = [self.scontrol, "update", f"nodename={','.join(names)}", *settings]
        ok = run_command(argv) is not None
        if ok:
            LOG.info("scontrol update nodename=%s %s", ",".join(names), " ".join(settings))
        return ok

    def set_address(self, name: str, address: str) -> bool:
        return self.update([name], f"nodeaddr={address}", f"nodehostname={name}")

    def power_down_force(self, names: Sequence[str], reason: str) -> bool:
        return self.update(names, "state=power_down_force", f"reason={reason}")

    def power_up(self, names: Sequence[str]) -> bool:
        return self.update(names, "state=power_up")

    def drain(self, name: str, reason: str) -> bool:
        return self.update([name], "state=drain", f"reason={reason}")

    def nodes(self) -> dict[str, NodeInfo] | None:
        """Every node, or None (logged) when scontrol failed or listed none."""
        output = run_command([self.scontrol, "-o", "show", "node"])
        nodes = parse_nodes(output) if output is not None else {}
        if not nodes:
            LOG.error("cannot read the nodes from `%s -o show node`", self.scontrol)
            return None
        return nodes

    def jobs_on(self, name: str) -> list[Job] | None:
        """Running and suspended jobs with a share of the node, or None (logged) when squeue failed."""
        argv = [
            self.tool("squeue"),
            "--noheader",
            f"--nodelist={name}",
            "--states=RUNNING,SUSPENDED",
            "--Format=JobID,BatchFlag,Requeue",
        ]
        output = run_command(argv)
        return None if output is None else parse_jobs(output)

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """The state of each job slurmctld still holds, finished ones included (until MinJobAge), or
        None (logged) when squeue failed."""
        argv = [
            self.tool("squeue"),
            "--noheader",
            f"--jobs={','.join(job_ids)}",
            "--states=all",
            "--Format=JobID,State",
        ]
        output = run_command(argv)
        if output is None:
            return None
        rows = (line.split() for line in output.splitlines())
        return {row[0]: row[1] for row in rows if len(row) == 2 and row[0].isdigit()}

    def signal_steps(self, name: str, signal: str) -> bool:
        """Signal the job steps of the node's jobs; not the batch shells (no --full)."""
        ok = run_command([self.tool("scancel"), f"--signal={signal}", f"--nodelist={name}"]) is not None
        if ok:
            LOG.info("signalled the job steps on %s with %s", name, signal)
        return ok

    def requeue(self, job_ids: Sequence[str]) -> bool:
        ok = run_command([self.scontrol, "requeue", ",".join(job_ids)]) is not None
        if ok:
            LOG.info("requeued jobs %s", ",".join(job_ids))
        return ok


# --- EC2 ------------------------------------------------------------------------------------------


def error_code(err: Exception) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code", "ClientError"))
    return type(err).__name__


def chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def tag_value(instance: dict[str, Any], key: str) -> str | None:
    return next((tag["Value"] for tag in instance.get("Tags", []) if tag["Key"] == key), None)


def launch_time(instance: dict[str, Any]) -> float:
    return float(instance["LaunchTime"].timestamp())


def describe_label(instance: dict[str, Any]) -> str:
    node = tag_value(instance, TAG_NODE) or "no gpuplat:node tag"
    return f"{instance['InstanceId']} ({node}, {instance['State']['Name']})"


class Ec2Nodes:
    """The stack's instances. `launch_client` asks RunInstances once (ec2_nodes); `client` the rest."""

    def __init__(self, client: Any, stack: str, launch_client: Any = None) -> None:
        self.client = client
        self.launch_client = launch_client if launch_client is not None else client
        self.stack = stack

    def describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        paginator = self.client.get_paginator("describe_instances")
        found: list[dict[str, Any]] = []
        for page in paginator.paginate(
            Filters=[{"Name": f"tag:{TAG_STACK}", "Values": [self.stack]}, *filters]
        ):
            for reservation in page["Reservations"]:
                found.extend(reservation["Instances"])
        return found

    def instances_of(self, names: Sequence[str], states: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Instances of this stack tagged with the node names, by name."""
        found: dict[str, list[dict[str, Any]]] = {}
        for batch in chunks(names, FILTER_VALUES_MAX):
            filters = [
                {"Name": f"tag:{TAG_NODE}", "Values": batch},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
            for instance in self.describe(filters):
                found.setdefault(str(tag_value(instance, TAG_NODE)), []).append(instance)
        return found

    def pool_instances(self, pools: Sequence[str], states: Sequence[str]) -> list[dict[str, Any]]:
        """Instances of this stack and these pools, tagged with a node name or not."""
        found: list[dict[str, Any]] = []
        for batch in chunks(sorted(pools), FILTER_VALUES_MAX):
            filters = [
                {"Name": f"tag:{TAG_POOL}", "Values": batch},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
            found.extend(self.describe(filters))
        return found

    def launch(self, pool: Pool, names: Sequence[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Launch one instance per name; the instances by name and the error code of those missing.

        After a partial launch (EC2 may start fewer than MaxCount) the rest is asked for again, which
        either starts more (each round at least one, so this ends) or fails with EC2's error code.
        """
        launched: dict[str, dict[str, Any]] = {}
        remaining = list(names)
        while remaining:
            try:
                response = self.launch_client.run_instances(**self.launch_request(pool, len(remaining)))
            except ErrorTypes as err:
                LOG.error(
                    "resume: pool %s: run_instances for %s failed: %s", pool.name, ",".join(remaining), err
                )
                return launched, error_code(err)
            instances = response["Instances"]
            if not instances:
                return launched, "NoInstanceStarted"
            if len(instances) < len(remaining):
                LOG.warning(
                    "resume: pool %s: EC2 started %d of %d instances",
                    pool.name,
                    len(instances),
                    len(remaining),
                )
            batch, remaining = remaining[: len(instances)], remaining[len(instances) :]
            for name, instance in zip(batch, instances, strict=True):
                if self.tag_node(name, instance):
                    launched[name] = instance
        return launched, None if len(launched) == len(names) else "TaggingFailed"

    def launch_request(self, pool: Pool, count: int) -> dict[str, Any]:
        tags = [{"Key": TAG_STACK, "Value": self.stack}, {"Key": TAG_POOL, "Value": pool.name}]
        request: dict[str, Any] = {
            "LaunchTemplate": {"LaunchTemplateId": pool.launch_template_id, "Version": "$Latest"},
            "MinCount": 1,
            "MaxCount": count,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        if pool.subnet_id:
            request["SubnetId"] = pool.subnet_id
        return request

    def tag_node(self, name: str, instance: dict[str, Any]) -> bool:
        """Tag a new instance with its node name; an instance that cannot be tagged is terminated."""
        instance_id = instance["InstanceId"]
        tags = [{"Key": TAG_NODE, "Value": name}, {"Key": "Name", "Value": f"{self.stack}-{name}"}]
        try:
            self.client.create_tags(Resources=[instance_id], Tags=tags)
        except ErrorTypes as err:
            LOG.error("resume: cannot tag %s as %s (%s); terminating it", instance_id, name, err)
            self.terminate([instance_id])
            return False
        LOG.info("resume: launched %s for %s", instance_id, name)
        return True

    def private_addresses(self, instances: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Private IPv4 address by node name, polling (bounded) for instances that have none yet."""
        addresses = {
            name: i["PrivateIpAddress"] for name, i in instances.items() if i.get("PrivateIpAddress")
        }
        deadline = time.monotonic() + ADDRESS_WAIT_S
        while len(addresses) < len(instances) and time.monotonic() < deadline:
            time.sleep(ADDRESS_POLL_S)
            waiting = {instances[name]["InstanceId"]: name for name in instances if name not in addresses}
            response = self.client.describe_instances(InstanceIds=list(waiting))
            for reservation in response["Reservations"]:
                for instance in reservation["Instances"]:
                    if instance.get("PrivateIpAddress"):
                        addresses[waiting[instance["InstanceId"]]] = instance["PrivateIpAddress"]
        return addresses

    def terminate(self, instance_ids: Sequence[str]) -> list[str]:
        """Terminate the instances; the IDs that could not be terminated (logged).

        One call per batch; when a batch fails (one protected or vanished instance fails the whole
        call), each of its instances is tried on its own so the others still go.
        """
        failed: list[str] = []
        for batch in chunks(instance_ids, TERMINATE_MAX):
            try:
                self.client.terminate_instances(InstanceIds=batch)
            except ErrorTypes as err:
                LOG.warning("terminate_instances of %d instances failed (%s); one by one", len(batch), err)
                failed.extend(instance_id for instance_id in batch if not self.terminate_one(instance_id))
        return failed

    def terminate_one(self, instance_id: str) -> bool:
        try:
            self.client.terminate_instances(InstanceIds=[instance_id])
        except ErrorTypes as err:
            LOG.error("cannot terminate %s: %s", instance_id, err)
            return False
        return True


def aws_session() -> boto3.session.Session:
    """Instance-profile credentials come from the instance metadata, which botocore asks once with a
    one-second timeout (botocore/configprovider.py: metadata_service_num_attempts 1,
    metadata_service_timeout 1): one slow answer and the whole program run fails "Unable to locate
    credentials" (seen in the box while its machines were busy). Asked up to 3 times, 2 s each."""
    core = botocore.session.get_session()
    core.set_config_variable("metadata_service_num_attempts", 3)
    core.set_config_variable("metadata_service_timeout", IMDS_TIMEOUT_S)
    return boto3.session.Session(botocore_session=core)


def ec2_client(region: str, endpoint_url: str | None, total_attempts: int = 6) -> Any:
    # botocore's `max_attempts` counts the retries; `total_max_attempts` counts the first call too.
    retries = {"total_max_attempts": total_attempts, "mode": "standard"}
    config = Config(connect_timeout=5, read_timeout=30, retries=retries)
    return aws_session().client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)


def ec2_nodes(region: str, endpoint_url: str | None, stack: str) -> Ec2Nodes:
    """EC2 answers InsufficientInstanceCapacity with HTTP 500 (a server error code, EC2 API Reference,
    "Error codes"), which botocore's standard retry mode takes for a transient fault and asks again,
    with back-off: the names of a pool out of capacity would be held through the retries instead of
    returning to power saving at once, and the capacity error would never be seen. RunInstances is
    asked once (the retry is Slurm's: the names come back through power saving and are resumed again
    for their jobs); the other calls are retried. (ParallelCluster's resume retries once:
    aws-parallelcluster-node v3.11.0, src/slurm_plugin/resume.py, DEFAULTS max_retry 1 as botocore
    max_attempts.)"""
    return Ec2Nodes(
        ec2_client(region, endpoint_url),
        stack,
        launch_client=ec2_client(region, endpoint_url, total_attempts=1),
    )


def terminate_named(ec2: Ec2Nodes, names: Sequence[str], action: str) -> bool:
    """Terminate every instance tagged with these node names (logged per name)."""
    try:
        found = ec2.instances_of(names, TERMINABLE_STATES)
    except ErrorTypes as err:
        LOG.error("%s: cannot look up the instances of %s: %s", action, ",".join(names), err)
        return False
    instance_ids = [instance["InstanceId"] for instances in found.values() for instance in instances]
    failed = ec2.terminate(instance_ids) if instance_ids else []
    for name in names:
        ids = ",".join(i["InstanceId"] for i in found.get(name, []) if i["InstanceId"] not in failed)
        LOG.info("%s: %s: terminated %s", action, name, ids or "no instance")
    return not failed


# --- state files (/var/lib/gpuplat) ---------------------------------------------------------------


def read_state(path: Path) -> dict[str, Any]:
    """The JSON object in the file; empty when it is missing or unreadable (logged)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        LOG.warning("cannot read the state file %s (%s); starting afresh", path, err)
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path: Path, data: dict[str, Any]) -> bool:
    """Replace the file atomically; False (logged) when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + ".new")
        scratch.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        scratch.replace(path)
    except OSError as err:
        LOG.error("cannot write the state file %s: %s", path, err)
        return False
    return True


def number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


# --- resume, suspend, resume-fail -----------------------------------------------------------------


def resume(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> int:
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    if not known:
        return report_unknown(unknown, settings.pools, "resume")
    try:
        existing = {name: found[0] for name, found in ec2.instances_of(known, LIVE_STATES).items()}
    except ErrorTypes as err:
        LOG.error("resume: cannot look up the instances of %s: %s", ",".join(known), err)
        slurm.power_down_force(known, f"gpuplat resume failed: {error_code(err)}")
        return EXIT_FAILED
    for name, instance in existing.items():
        LOG.info("resume: %s already has instance %s, reusing it", name, instance["InstanceId"])
    started, failed = dict(existing), {}
    for pool_name, pool_names in groups.items():
        missing = [name for name in pool_names if name not in existing]
        if missing:
            launched, code = ec2.launch(settings.pools[pool_name], missing)
            started.update(launched)
            failed.update({name: code or "Unknown" for name in missing if name not in launched})
    ok, unaddressed = announce_addresses(ec2, slurm, started)
    failed.update({name: "NoPrivateAddress" for name in unaddressed})
    ok = release_failed(ec2, slurm, failed) and ok
    return report_unknown(unknown, settings.pools, "resume") or (
        EXIT_OK if ok and not failed else EXIT_FAILED
    )


def announce_addresses(
    ec2: Ec2Nodes, slurm: Slurm, instances: dict[str, dict[str, Any]]
) -> tuple[bool, list[str]]:
    """Tell Slurm each node's address; whether that worked, and the names whose instance has none."""
    try:
        addresses = ec2.private_addresses(instances)
    except ErrorTypes as err:
        LOG.error("resume: cannot read the addresses of %s: %s", ",".join(instances), err)
        return False, []
    unaddressed = sorted(set(instances) - set(addresses))
    for name in unaddressed:
        LOG.error(
            "resume: %s (%s) has no private address after %.0f s",
            name,
            instances[name]["InstanceId"],
            ADDRESS_WAIT_S,
        )
    results = [slurm.set_address(name, address) for name, address in sorted(addresses.items())]
    return all(results), unaddressed


def release_failed(ec2: Ec2Nodes, slurm: Slurm, failed: dict[str, str]) -> bool:
    """Names without a usable instance: terminate what they got, POWER_DOWN_FORCE them (per error code).

    POWER_DOWN_FORCE requeues their jobs and returns them to power saving (idle~) after
    SuspendTimeout, so the next job that needs them launches them again (module docstring).
    """
    if not failed:
        return True
    terminated = terminate_named(ec2, sorted(failed), "resume")
    by_code: dict[str, list[str]] = {}
    for name, code in failed.items():
        by_code.setdefault(code, []).append(name)
    results = [terminated]
    for code, names in by_code.items():
        LOG.error(
            "resume: no instance for %s (%s); powering them down so their jobs requeue", ",".join(names), code
        )
        results.append(slurm.power_down_force(names, f"gpuplat resume failed: {code}"))
    return all(results)


def terminate_nodes(settings: Settings, ec2: Ec2Nodes, names: list[str], action: str) -> int:
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, action)
    if known and not terminate_named(ec2, known, action):
        return EXIT_FAILED
    return status


def resume_fail(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> int:
    """Slurm set these DOWN+POWERED_DOWN: terminate their instances, then POWER_DOWN_FORCE them.

    DOWN+POWERED_DOWN is never allocated again by itself; POWER_DOWN_FORCE brings it back to
    IDLE+POWERED_DOWN (module docstring). The suspend it starts runs SuspendProgram again, which
    finds nothing left to terminate.
    """
    LOG.warning("resume-fail: %s did not register in time; terminating their instances", ",".join(names))
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, "resume-fail")
    if not known:
        return status
    terminated = terminate_named(ec2, known, "resume-fail")
    LOG.info("resume-fail: returning %s to power saving (POWER_DOWN_FORCE)", ",".join(known))
    released = slurm.power_down_force(known, REASON_RESUME_FAIL)
    return status or (EXIT_OK if terminated and released else EXIT_FAILED)


# --- keep-static ----------------------------------------------------------------------------------


def static_action(node: NodeInfo | None) -> str:
    """What a static node needs: undefined, held, wait, replace, power-up or nothing (up)."""
    if node is None:
        return "undefined"
    if node.flags & HELD:
        return "held"
    if node.flags & POWER_TRANSITIONS:
        return "wait"
    if "DOWN" in node.flags:
        return "replace"
    if "POWERED_DOWN" in node.flags:
        return "power-up"
    return "up"


@dataclass
class Backoff:
    """Consecutive keep-static actions per static node and when the last one was.

    After n actions the next one waits min(base * 2**(n-1), max) seconds. The count is forgotten
    once the node has been seen up at least max seconds after the last action, so a node that fails
    again soon after coming up keeps backing off.
    """

    base_s: float
    max_s: float
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_state(cls, data: dict[str, Any], base_s: float, max_s: float) -> Backoff:
        raw = data.get("nodes")
        nodes = {
            str(name): {"attempts": number(entry.get("attempts"), 0), "last": number(entry.get("last"), 0)}
            for name, entry in (raw.items() if isinstance(raw, dict) else [])
            if isinstance(entry, dict)
        }
        return cls(base_s, max_s, nodes)

    def delay(self, name: str) -> float:
        attempts = self.nodes.get(name, {}).get("attempts", 0)
        return 0.0 if attempts < 1 else min(self.base_s * 2 ** (attempts - 1), self.max_s)

    def next_time(self, name: str) -> float:
        return self.nodes.get(name, {}).get("last", 0.0) + self.delay(name)

    def record(self, name: str, now: float) -> None:
        attempts = self.nodes.get(name, {}).get("attempts", 0) + 1
        self.nodes[name] = {"attempts": attempts, "last": now}

    def settle(self, name: str, now: float) -> None:
        if name in self.nodes and now - self.nodes[name]["last"] >= self.max_s:
            LOG.info("keep-static: %s has stayed up; forgetting its %d attempts", name, self.attempts(name))
            del self.nodes[name]

    def attempts(self, name: str) -> int:
        return int(self.nodes.get(name, {}).get("attempts", 0))

    def state(self) -> dict[str, Any]:
        return {"nodes": self.nodes}


def keep_static(settings: Settings, slurm: Slurm, ec2: Ec2Nodes, now: float | None = None) -> int:
    static = settings.static_nodes
    if not static:
        return EXIT_OK
    nodes = slurm.nodes()
    if nodes is None:
        return EXIT_FAILED
    now = time.time() if now is None else now
    plan: dict[str, list[str]] = {}
    for name in static:
        plan.setdefault(static_action(nodes.get(name)), []).append(name)
    report_static(plan)
    path = settings.state_dir / "keep-static.json"
    backoff = Backoff.from_state(
        read_state(path), settings.static_backoff_base_s, settings.static_backoff_max_s
    )
    for name in plan.get("up", []):
        backoff.settle(name, now)
    replace = due(backoff, plan.get("replace", []), now)
    power_up = due(backoff, plan.get("power-up", []), now)
    for name in replace + power_up:
        backoff.record(name, now)
    saved = write_state(path, backoff.state())
    replaced = replace_static(ec2, slurm, replace) if replace else True
    if power_up:
        LOG.info("keep-static: powering up %s", ",".join(power_up))
    powered = slurm.power_up(power_up) if power_up else True
    return EXIT_OK if saved and replaced and powered and not plan.get("undefined") else EXIT_FAILED


def report_static(plan: dict[str, list[str]]) -> None:
    for name in plan.get("undefined", []):
        LOG.error("keep-static: static node %s is not defined in Slurm", name)
    for name in plan.get("held", []):
        LOG.warning("keep-static: static node %s is drained or failed; leaving it as it is", name)


def due(backoff: Backoff, names: list[str], now: float) -> list[str]:
    """The names whose back-off has passed; the others are logged."""
    ready = []
    for name in names:
        if now >= backoff.next_time(name):
            ready.append(name)
        else:
            LOG.warning(
                "keep-static: %s needed %d attempts already; next one in %.0f s (back-off)",
                name,
                backoff.attempts(name),
                backoff.next_time(name) - now,
            )
    return ready


def replace_static(ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> bool:
    """A DOWN static node: terminate its instance, POWER_DOWN_FORCE it; a later round powers it up."""
    LOG.warning("keep-static: static nodes %s are DOWN; replacing their instances", ",".join(names))
    terminated = terminate_named(ec2, names, "keep-static")
    return slurm.power_down_force(names, REASON_REPLACE) and terminated


# --- reconcile ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Orphan:
    instance_id: str
    node: str
    why: str


def reconcile(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, now: float | None = None) -> int:
    """Terminate the pools' instances no node owns; return failed-resume nodes to power saving.

    EC2 is read before Slurm: every instance listed existed when Slurm's view was taken.
    """
    try:
        instances = ec2.pool_instances(list(settings.pools), TERMINABLE_STATES)
    except ErrorTypes as err:
        LOG.error("reconcile: cannot list the instances of pools %s: %s", ",".join(settings.pools), err)
        return EXIT_FAILED
    nodes = slurm.nodes()
    if nodes is None:
        LOG.error("reconcile: without Slurm's node list nothing is terminated")
        return EXIT_FAILED
    now = time.time() if now is None else now
    since, saved = track_powered_down(settings.state_dir / "reconcile.json", nodes, now)
    recovered, recover_ok = recover_failed_resumes(settings, ec2, slurm, nodes, instances)
    rest = [i for i in instances if tag_value(i, TAG_NODE) not in recovered]
    orphans = find_orphans(rest, nodes, since, now, settings.orphan_grace_s)
    terminated = terminate_orphans(ec2, orphans)
    LOG.info(
        "reconcile: %d instances of pools %s, %d orphans, %d nodes returned to power saving",
        len(instances),
        ",".join(sorted(settings.pools)),
        len(orphans),
        len(recovered),
    )
    return EXIT_OK if saved and recover_ok and terminated else EXIT_FAILED


def track_powered_down(path: Path, nodes: dict[str, NodeInfo], now: float) -> tuple[dict[str, float], bool]:
    """Since when each node has been powered down or powering down (and not on its way up).

    A node first seen so is dated to the previous round (it was not so then, or was not seen), so
    it counts as powered down for at most one interval more than it was.
    """
    state = read_state(path)
    start = number(state.get("round"), now)
    known = state.get("powered_down_since")
    known = known if isinstance(known, dict) else {}
    since = {
        name: number(known.get(name), start)
        for name, node in nodes.items()
        if node.flags & POWERED_OFF and not node.flags & GOING_UP
    }
    return since, write_state(path, {"round": now, "powered_down_since": since})


def is_failed_resume(node: NodeInfo) -> bool:
    """DOWN+POWERED_DOWN after ResumeTimeout or our own failure, and nothing else pending on it."""
    return (
        {"DOWN", "POWERED_DOWN"} <= node.flags
        and not node.flags & (HELD | POWER_TRANSITIONS)
        and node.reason.startswith(FAILED_RESUME_REASONS)
    )


def recover_failed_resumes(
    settings: Settings,
    ec2: Ec2Nodes,
    slurm: Slurm,
    nodes: dict[str, NodeInfo],
    instances: list[dict[str, Any]],
) -> tuple[set[str], bool]:
    """Dynamic nodes a failed resume left DOWN+POWERED_DOWN: terminate their instances, POWER_DOWN_FORCE.

    resume-fail does this; this catches what it missed (it failed, or ran before this version).
    Static nodes are keep-static's.
    """
    static = set(settings.static_nodes)
    names = sorted(
        name
        for name, node in nodes.items()
        if pool_of(name, settings.pools) and name not in static and is_failed_resume(node)
    )
    if not names:
        return set(), True
    LOG.warning(
        "reconcile: %s are DOWN+POWERED_DOWN after a failed resume (%s); terminating their instances "
        "and returning them to power saving",
        ",".join(names),
        "; ".join(sorted({nodes[name].reason for name in names})),
    )
    owned = [i["InstanceId"] for i in instances if tag_value(i, TAG_NODE) in names]
    failed = ec2.terminate(owned) if owned else []
    released = slurm.power_down_force(names, REASON_RECOVER)
    return set(names), released and not failed


def find_orphans(
    instances: list[dict[str, Any]],
    nodes: dict[str, NodeInfo],
    since: dict[str, float],
    now: float,
    grace: float,
) -> list[Orphan]:
    by_node: dict[str, list[dict[str, Any]]] = {}
    orphans: list[Orphan] = []
    for instance in instances:
        name = tag_value(instance, TAG_NODE)
        if name is None:
            orphans.extend(aged(instance, "", "has no gpuplat:node tag", now, grace))
        else:
            by_node.setdefault(name, []).append(instance)
    for name, owned in sorted(by_node.items()):
        orphans.extend(node_orphans(name, owned, nodes.get(name), since.get(name), now, grace))
    return orphans


def aged(instance: dict[str, Any], node: str, why: str, now: float, grace: float) -> list[Orphan]:
    """The instance as an orphan once it is older than the grace (logged either way)."""
    age = now - launch_time(instance)
    if age < grace:
        LOG.info(
            "reconcile: %s %s, launched %.0f s ago: within the %.0f s grace, left for now",
            describe_label(instance),
            why,
            age,
            grace,
        )
        return []
    return [Orphan(instance["InstanceId"], node, f"{why}, launched {age:.0f} s ago")]


def node_orphans(
    name: str,
    owned: list[dict[str, Any]],
    node: NodeInfo | None,
    since: float | None,
    now: float,
    grace: float,
) -> list[Orphan]:
    if node is None:
        return [
            o for i in owned for o in aged(i, name, "is named for a node Slurm does not know", now, grace)
        ]
    if since is not None:
        return powered_down_orphans(name, owned, node, now - since, grace)
    live = [i for i in owned if i["State"]["Name"] in LIVE_STATES]
    return duplicate_orphans(name, owned, live, node.addr, now, grace) if live and len(owned) > 1 else []


def powered_down_orphans(
    name: str, owned: list[dict[str, Any]], node: NodeInfo, down_s: float, grace: float
) -> list[Orphan]:
    state = "+".join(sorted(node.flags & POWERED_OFF))
    if down_s < grace:
        for instance in owned:
            LOG.info(
                "reconcile: %s: node %s %s for %.0f s: within the %.0f s grace, left for now",
                describe_label(instance),
                name,
                state,
                down_s,
                grace,
            )
        return []
    return [Orphan(i["InstanceId"], name, f"node {state} for {down_s:.0f} s") for i in owned]


def duplicate_orphans(
    name: str, owned: list[dict[str, Any]], live: list[dict[str, Any]], addr: str, now: float, grace: float
) -> list[Orphan]:
    """Keep the live instance at the node's NodeAddr (else the newest live one); the others (a
    second live one, a stopped one) once past the grace."""
    at_addr = [i for i in live if i.get("PrivateIpAddress") == addr]
    keeper = at_addr[0] if at_addr else max(live, key=launch_time)
    kept = f"{keeper['InstanceId']} {'is at NodeAddr ' + addr if at_addr else 'is the newest'}"
    LOG.info("reconcile: %s has %d instances; keeping %s", name, len(owned), kept)
    others = [i for i in owned if i is not keeper]
    return [o for i in others for o in aged(i, name, f"is a second instance of {name} ({kept})", now, grace)]


def terminate_orphans(ec2: Ec2Nodes, orphans: list[Orphan]) -> bool:
    for orphan in orphans:
        LOG.warning(
            "reconcile: terminating %s (%s): %s",
            orphan.instance_id,
            orphan.node or "no gpuplat:node tag",
            orphan.why,
        )
    failed = ec2.terminate([orphan.instance_id for orphan in orphans]) if orphans else []
    for instance_id in failed:
        LOG.error("reconcile: %s is still there; trying again next round", instance_id)
    return not failed


# --- teardown -------------------------------------------------------------------------------------


def teardown(
    settings: Settings,
    ec2: Ec2Nodes,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Terminate every instance of the stack's pools; wait until none is left (bounded)."""
    pools = sorted(settings.pools)
    LOG.warning("teardown: terminating every instance of stack %s, pools %s", settings.stack, ",".join(pools))
    deadline = clock() + timeout_s
    while True:
        left = teardown_round(ec2, pools)
        if left == []:
            LOG.info("teardown: no instance of stack %s is left", settings.stack)
            return EXIT_OK
        if clock() >= deadline:
            report_left(left, timeout_s)
            return EXIT_FAILED
        sleep(poll_s)


def teardown_round(ec2: Ec2Nodes, pools: list[str]) -> list[dict[str, Any]] | None:
    """The instances not yet terminated (those not shutting down asked to terminate), or None."""
    try:
        left = ec2.pool_instances(pools, NOT_TERMINATED_STATES)
    except ErrorTypes as err:
        LOG.error("teardown: cannot list the instances: %s", err)
        return None
    to_terminate = [i["InstanceId"] for i in left if i["State"]["Name"] in TERMINABLE_STATES]
    if to_terminate:
        LOG.info("teardown: terminating %s", ", ".join(describe_label(i) for i in left))
        ec2.terminate(to_terminate)
    return left


def report_left(left: list[dict[str, Any]] | None, timeout_s: float) -> None:
    if left is None:
        LOG.error("teardown: could not list the instances; some may be left")
        return
    LOG.error("teardown: %d instances are left after %.0f s:", len(left), timeout_s)
    for instance in left:
        LOG.error("teardown: left: %s", describe_label(instance))


# --- spot-watch -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotWatch:
    node: str
    imds_url: str
    grace_s: float
    interval_s: float


def imds_get(base_url: str, path: str) -> str:
    """GET an IMDSv2 path (token first); urllib errors propagate, HTTPError 404 included."""
    token_request = urllib.request.Request(
        f"{base_url.rstrip('/')}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)},
    )
    with urllib.request.urlopen(token_request, timeout=IMDS_TIMEOUT_S) as response:
        token = response.read().decode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}{path}", headers={"X-aws-ec2-metadata-token": token}
    )
    with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
        return str(response.read().decode())


def spot_notice(base_url: str) -> dict[str, Any] | None:
    """The instance-action notice, or None when there is none (404)."""
    try:
        body = imds_get(base_url, "/latest/meta-data/spot/instance-action")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    try:
        notice = json.loads(body)
    except ValueError:
        LOG.warning("spot-watch: unreadable instance-action %r; treating it as a notice", body)
        return {"action": "unknown", "time": "unknown"}
    return notice if isinstance(notice, dict) else {"action": "unknown", "time": "unknown"}


def handle_spot_notice(
    watch: SpotWatch, slurm: Slurm, notice: dict[str, Any], sleep: Callable[[float], None]
) -> int:
    """Drain, TERM the job steps, wait, POWER_DOWN_FORCE, then requeue the requeueable batch jobs that
    ended in the grace period.

    The batch shell is not signalled: bash dies on SIGTERM, which would end the job FAILED before it
    could be requeued. POWER_DOWN_FORCE requeues the requeueable batch jobs still running; a job
    whose steps ended (checkpointed) in the grace period is requeued here, as `scontrol requeue`
    takes finished jobs back (module docstring).
    """
    reason = f"spot interruption {notice.get('time', 'unknown')}"
    LOG.warning("spot-watch: %s: %s (%s)", watch.node, reason, notice.get("action", "unknown"))
    drained = slurm.drain(watch.node, reason)
    jobs = slurm.jobs_on(watch.node)
    signalled = slurm.signal_steps(watch.node, "TERM")
    LOG.info("spot-watch: %s: waiting %.0f s for the jobs to checkpoint", watch.node, watch.grace_s)
    sleep(watch.grace_s)
    powered_down = slurm.power_down_force([watch.node], reason)
    requeued = requeue_ended_jobs(slurm, watch.node, jobs or [])
    ok = drained and jobs is not None and signalled and powered_down and requeued
    return EXIT_OK if ok else EXIT_FAILED


# The states a job reaches when its steps end on SIGTERM: exit 0 after a checkpoint, or not.
ENDED_BY_THE_NOTICE = frozenset({"COMPLETED", "FAILED"})


def requeue_ended_jobs(slurm: Slurm, node: str, jobs: list[Job]) -> bool:
    requeueable = [job.job_id for job in jobs if job.batch and job.requeue]
    others = [job.job_id for job in jobs if not (job.batch and job.requeue)]
    if others:
        LOG.warning(
            "spot-watch: %s: jobs %s are not requeueable batch jobs; POWER_DOWN_FORCE ended them",
            node,
            ",".join(others),
        )
    if not requeueable:
        return True
    states = slurm.job_states(requeueable)
    if states is None:
        return False
    ended = [job_id for job_id in requeueable if states.get(job_id) in ENDED_BY_THE_NOTICE]
    return slurm.requeue(ended) if ended else True


def spot_watch(watch: SpotWatch, slurm: Slurm, sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll until an interruption notice arrives, handle it, and return."""
    LOG.info("spot-watch: watching %s for node %s every %.0f s", watch.imds_url, watch.node, watch.interval_s)
    while True:
        try:
            notice = spot_notice(watch.imds_url)
        except (urllib.error.URLError, OSError) as err:
            LOG.warning("spot-watch: instance metadata unreachable: %s", err)
            notice = None
        if notice is not None:
            return handle_spot_notice(watch, slurm, notice, sleep)
        sleep(watch.interval_s)


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuplat-ec2-nodes", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--endpoint-url", help="EC2 endpoint (default: boto3's, AWS_ENDPOINT_URL honoured)")
    parser.add_argument("--log-file", help="also append the log to this file")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("resume", "suspend", "resume-fail"):
        sub = commands.add_parser(name)
        sub.add_argument("hostlist", nargs="+", help="Slurm hostlist, e.g. train-[0-3,5]")
    commands.add_parser("keep-static")
    commands.add_parser("reconcile")
    teardown_parser = commands.add_parser("teardown")
    teardown_parser.add_argument("--timeout-seconds", type=float, default=600.0)
    teardown_parser.add_argument("--poll-seconds", type=float, default=10.0)
    spot = commands.add_parser("spot-watch")
    spot.add_argument("--node-name", default=socket.gethostname().split(".")[0])
    spot.add_argument("--imds-url", default=DEFAULT_IMDS_URL)
    spot.add_argument("--grace-seconds", type=float, default=90.0)
    spot.add_argument("--interval-seconds", type=float, default=5.0)
    spot.add_argument("--scontrol", default="/usr/bin/scontrol")
    return parser.parse_args(argv)


def configure_logging(log_file: str | None) -> None:
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(asctime)s gpuplat-ec2-nodes %(levelname)s %(message)s"))
    LOG.addHandler(stderr)
    if Path("/dev/log").exists():
        try:
            syslog = logging.handlers.SysLogHandler(address="/dev/log")
        except OSError:
            pass
        else:
            syslog.setFormatter(logging.Formatter("gpuplat-ec2-nodes: %(levelname)s %(message)s"))
            LOG.addHandler(syslog)
    if log_file:
        try:
            file_handler = logging.FileHandler(log_file)
        except OSError as err:
            LOG.warning("cannot write the log file %s: %s", log_file, err)
        else:
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            LOG.addHandler(file_handler)


def run(args: argparse.Namespace) -> int:
    if args.command == "spot-watch":
        watch = SpotWatch(args.node_name, args.imds_url, args.grace_seconds, args.interval_seconds)
        return spot_watch(watch, Slurm(args.scontrol))
    settings = load_settings(args.config)
    slurm = Slurm(settings.scontrol)
    ec2 = ec2_nodes(settings.region, args.endpoint_url, settings.stack)
    if args.command == "keep-static":
        return keep_static(settings, slurm, ec2)
    if args.command == "reconcile":
        return reconcile(settings, ec2, slurm)
    if args.command == "teardown":
        return teardown(settings, ec2, args.timeout_seconds, args.poll_seconds)
    names = expand_hostlist(",".join(args.hostlist))
    if args.command == "resume":
        return resume(settings, ec2, slurm, names)
    if args.command == "resume-fail":
        return resume_fail(settings, ec2, slurm, names)
    return terminate_nodes(settings, ec2, names, args.command)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    try:
        return run(args)
    except UsageError as err:
        LOG.error("%s", err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
