"""Unhealthy nodes replaced (reconcile's part): their instances terminated and the names set
POWER_DOWN_FORCE, which requeues their jobs and takes them back to power saving (a static one is
then powered up by keep-static; the package docstring).

After ParallelCluster 3.11's clustermgtd (aws-parallelcluster-node v3.11.0, src/slurm_plugin/):
DOWN and DRAINED nodes are unhealthy (slurm_resources.py:566 is_state_healthy, terminate_down_nodes
and terminate_drain_nodes on by default, clustermgtd.py:150), so is a node whose NodeAddr has no
instance behind it (slurm_resources.py:438 is_backing_instance_valid, ec2_instance_missing_max_count 0:
at once); unhealthy dynamic nodes lose their instance and are powered down (clustermgtd.py:818
_handle_unhealthy_dynamic_nodes). An instance with an EC2 scheduled event (slurm_resources.py:30
EC2_SCHEDULED_EVENT_CODES) has its node drained (clustermgtd.py:1065
_handle_nodes_failing_health_check), so it is replaced once its jobs have ended.

A node whose slurmd registered with less than slurm.conf says (INVALID_REG: slurmctld drains it,
node_mgr.c validate_node_specs, slurm-22-05-8-1 :2969) counts as a boot failure of its pool, as
ParallelCluster counts it towards protected mode (slurm_resources.py:744 is_bootstrap_failure): its
replacement would boot the same image into the same refusal, one GPU instance after another.

A node on its way up (POWERING_UP, its NodeAddr set by resume) whose instance has ended is a boot
failure too, replaced at once rather than at ResumeTimeout, as ParallelCluster's
DynamicNode.is_bootstrap_failure (slurm_resources.py:717) counts a configuring or powering-up node
without a valid backing instance. A training node whose boot script fails powers itself off, and
its launch template terminates it on shutdown (infra/backends/aws/bootstrap.py), so a bad image or
bundle costs a boot, not ResumeTimeout (30 minutes) of a GPU instance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .ec2 import (
    FILTER_VALUES_MAX,
    LIVE_STATES,
    TAG_NODE,
    Ec2Nodes,
    ErrorTypes,
    chunks,
    launch_time,
    tag_value,
)
from .logs import LOG
from .settings import Settings, pool_of
from .slurm import GOING_UP, HELD, POWER_TRANSITIONS, POWERED_OFF, NodeInfo, Slurm

# Reasons of a DOWN+POWERED_DOWN node after a failed resume: Slurm's (power_save.c) and ours; not a
# pool's hold (holds.py), which apply_holds ends.
# "gpuplat hold over": a release (POWER_DOWN_FORCE) that reached a held name while it was still
# powering down (SuspendProgram holds names then, holds.hold_powering_down): slurmctld sets the reason
# and ignores the power-down ("already powering down": node_mgr.c update_node, slurm-21-08-8-2 :1737,
# slurm-22-05-8-1 :1807, slurm-24-11-7-1 :2110), so the name ends DOWN+POWERED_DOWN, released by
# nobody else.
FAILED_RESUME_REASONS = ("ResumeTimeout reached", "gpuplat resume", "gpuplat reconcile", "gpuplat hold over")
# spot-watch drains its node and powers it down itself after the grace: replaced earlier, its
# instance (and spot-watch with it) would go before spot-watch requeues the jobs that checkpointed.
SPOT_DRAIN_REASON = "spot interruption"
INVALID_REGISTRATION = "INVALID_REG"
REASON_PREFIX = "gpuplat reconcile: replaced"
REASON_RECOVER = "gpuplat reconcile: back to power saving after a failed resume"
REASON_SCHEDULED_EVENT = "gpuplat reconcile: EC2 scheduled event"
# An instance no longer running: shut down (the boot script powers off after a failure), terminated
# or stopped from outside, reclaimed.
ENDED_STATES = ("shutting-down", "terminated", "stopping", "stopped")
# ParallelCluster's list (slurm_resources.py:30).
SCHEDULED_EVENT_CODES = (
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
)


@dataclass(frozen=True)
class Unhealthy:
    node: str
    why: str  # also the node's reason in Slurm
    down: bool = True  # DOWN in Slurm already
    boot_failure: bool = False  # its slurmd's registration was refused (INVALID_REG)


def is_failed_resume(node: NodeInfo) -> bool:
    """DOWN+POWERED_DOWN after ResumeTimeout or our own failure, and nothing else pending on it."""
    return (
        {"DOWN", "POWERED_DOWN"} <= node.flags
        and not node.flags & (HELD | POWER_TRANSITIONS)
        and node.reason.startswith(FAILED_RESUME_REASONS)
    )


def in_service(node: NodeInfo) -> bool:
    """Neither powered down nor on its way up or down: an instance should be behind it."""
    return not node.flags & (POWERED_OFF | GOING_UP | POWER_TRANSITIONS)


def own_words(reason: str) -> str:
    """A node's reason without the [user@time] Slurm appends to it."""
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", reason) or "no reason"


def unhealthy_reason(node: NodeInfo, static: bool, live_instances: list[dict[str, Any]]) -> str | None:
    """Why the node is replaced, or None. Static DOWN nodes are keep-static's (with its back-off)."""
    if is_failed_resume(node):
        return None if static else REASON_RECOVER
    if not in_service(node):
        return None
    if not live_instances and node.addr and node.addr != node.name:
        return f"{REASON_PREFIX}: no live instance at NodeAddr {node.addr}"
    if "DOWN" in node.flags and not static:
        return f"{REASON_PREFIX}: DOWN ({own_words(node.reason)})"
    # Drained: no job left, not even one completing (its epilog still runs): slurm_resources.py:273
    # is_drained.
    drained = "DRAIN" in node.flags and bool(node.flags & {"IDLE", "DOWN"}) and "COMPLETING" not in node.flags
    if drained and not node.reason.startswith(SPOT_DRAIN_REASON):
        return f"{REASON_PREFIX}: drained ({own_words(node.reason)})"
    return None


def live_by_name(instances: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    live: dict[str, list[dict[str, Any]]] = {}
    for instance in instances:
        if instance["State"]["Name"] in LIVE_STATES:
            live.setdefault(str(tag_value(instance, TAG_NODE)), []).append(instance)
    return live


def find_unhealthy(
    settings: Settings,
    nodes: dict[str, NodeInfo],
    instances: list[dict[str, Any]],
    ended_in_boot: dict[str, str] | None = None,
) -> list[Unhealthy]:
    """The pools' nodes to replace, by rule (is_failed_resume, unhealthy_reason), and the nodes whose
    instance ended while they were going up (`ended_during_boot`: boot failures)."""
    static = set(settings.static_nodes)
    live = live_by_name(instances)
    ended_in_boot = ended_in_boot or {}
    found = []
    for name, node in sorted(nodes.items()):
        if not pool_of(name, settings.pools):
            continue
        if name in ended_in_boot:
            ended = f"{REASON_PREFIX}: its instance ended during boot ({ended_in_boot[name]})"
            found.append(Unhealthy(name, ended, "DOWN" in node.flags, boot_failure=True))
            continue
        why = unhealthy_reason(node, name in static, live.get(name, []))
        if why:
            found.append(Unhealthy(name, why, "DOWN" in node.flags, INVALID_REGISTRATION in node.flags))
    return found


def ended_during_boot(
    settings: Settings, ec2: Ec2Nodes, nodes: dict[str, NodeInfo], instances: list[dict[str, Any]]
) -> dict[str, str]:
    """The nodes going up with NodeAddr set (resume gave them an instance) and no live instance in
    `instances`, whose instances EC2 now lists all ended: name -> the newest one and its state.

    Asked after Slurm's view was taken, by name: an instance resume launched after the fleet listing
    was read, before it set the node's address, is listed here and live, so it is not taken for dead.
    EC2 unreachable: none (logged), as ParallelCluster then judges no backing instance."""
    live = live_by_name(instances)
    booting = sorted(
        name
        for name, node in nodes.items()
        if pool_of(name, settings.pools)
        and node.flags & GOING_UP
        and node.addr
        and node.addr != name
        and name not in live
    )
    if not booting:
        return {}
    try:
        found = ec2.instances_of(booting, (*LIVE_STATES, *ENDED_STATES))
    except ErrorTypes as err:
        LOG.error("reconcile: cannot look up the instances of %s, going up: %s", ",".join(booting), err)
        return {}
    ended: dict[str, str] = {}
    for name in booting:
        own = found.get(name, [])
        if own and not any(i["State"]["Name"] in LIVE_STATES for i in own):
            newest = max(own, key=launch_time)
            cause = newest.get("StateReason", {}).get("Message")
            label = f"{newest['InstanceId']} {newest['State']['Name']}"
            ended[name] = f"{label}: {cause}" if cause else label
    held = addresses_held(ec2, sorted({nodes[name].addr for name in ended}))
    if held is None:
        return {}
    return {name: why for name, why in ended.items() if nodes[name].addr not in held}


def addresses_held(ec2: Ec2Nodes, addresses: list[str]) -> set[str] | None:
    """The addresses a live instance of the stack holds; None when EC2 cannot be asked (logged).

    By address, as ParallelCluster matches a node to its instance (NodeAddr to the private address,
    slurm_resources.py:438 is_backing_instance_valid, which allows for the same lag, :457): the
    instance resume has just launched for a name, its address already set, may not be found by its
    `gpuplat:node` tag yet (EC2's tag filters are eventually consistent, and resume tags it after
    RunInstances), while the name's earlier instance, ended, still is: its node is going up, not
    failed."""
    held: set[str] = set()
    try:
        for batch in chunks(addresses, FILTER_VALUES_MAX):
            filters = [
                {"Name": "private-ip-address", "Values": batch},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
            held.update(str(i.get("PrivateIpAddress")) for i in ec2.describe(filters))
    except ErrorTypes as err:
        LOG.error("reconcile: cannot look up the instances at %s: %s", ",".join(addresses), err)
        return None
    return held


def boot_failures(settings: Settings, unhealthy: list[Unhealthy]) -> dict[str, int]:
    """The replaced nodes whose registration was refused, counted per pool (holds.record_boot_failures)."""
    counts: dict[str, int] = {}
    for entry in unhealthy:
        pool = pool_of(entry.node, settings.pools)
        if entry.boot_failure and pool:
            counts[pool] = counts.get(pool, 0) + 1
    return counts


def replace_unhealthy(
    ec2: Ec2Nodes, slurm: Slurm, unhealthy: list[Unhealthy], instances: list[dict[str, Any]]
) -> bool:
    """Terminate the nodes' instances, set DOWN those that are not, then POWER_DOWN_FORCE them all
    with the rule as reason.

    DOWN first: a job still on a node whose instance is gone would otherwise stay COMPLETING there
    (no slurmd answers the kill), and the node with it, until SlurmdTimeout and beyond (seen in the
    box: IDLE+COMPLETING+POWER_DOWN+NOT_RESPONDING). Setting a node DOWN requeues or ends its jobs
    (node_mgr.c update_node: kill_running_job_by_node_name) and counts a DOWN node's part of a
    completing job as done (job_mgr.c re_kill_job, deallocate_nodes)."""
    if not unhealthy:
        return True
    names = {u.node for u in unhealthy}
    for entry in unhealthy:
        LOG.warning("reconcile: replacing %s: %s", entry.node, entry.why)
    owned = [i["InstanceId"] for i in instances if tag_value(i, TAG_NODE) in names]
    failed = ec2.terminate(owned) if owned else []
    by_reason: dict[str, list[str]] = {}
    for entry in unhealthy:
        by_reason.setdefault(entry.why, []).append(entry.node)
    up: dict[str, list[str]] = {}
    for entry in unhealthy:
        if not entry.down:
            up.setdefault(entry.why, []).append(entry.node)
    downed = [slurm.set_down(group, why) for why, group in up.items()]
    released = downed + [slurm.power_down_force(group, why) for why, group in by_reason.items()]
    return all(released) and not failed


def scheduled_events(ec2: Ec2Nodes, instances: list[dict[str, Any]]) -> dict[str, str] | None:
    """The live instances' EC2 scheduled events (ParallelCluster's codes) by instance ID, as
    "CODE at TIME", or None (logged) when EC2 could not be asked."""
    live = [i["InstanceId"] for i in instances if i["State"]["Name"] in LIVE_STATES]
    try:
        return ec2.scheduled_events(live, SCHEDULED_EVENT_CODES) if live else {}
    except ErrorTypes as err:
        LOG.error("reconcile: cannot read the instances' scheduled events: %s", err)
        return None


def drain_for_events(
    slurm: Slurm, nodes: dict[str, NodeInfo], instances: list[dict[str, Any]], events: dict[str, str]
) -> bool:
    """Drain the in-service nodes whose instance has a scheduled event (not already drained): no new
    job starts there, and once the running ones end the node is DRAINED and replaced."""
    results = []
    for instance in instances:
        event = events.get(instance["InstanceId"])
        name = str(tag_value(instance, TAG_NODE))
        node = nodes.get(name)
        if event and node is not None and in_service(node) and "DRAIN" not in node.flags:
            LOG.warning("reconcile: %s (%s) has %s; draining it", name, instance["InstanceId"], event)
            results.append(slurm.drain(name, f"{REASON_SCHEDULED_EVENT} {event}"))
    return all(results)
