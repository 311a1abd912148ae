"""reconcile (a systemd timer on the controller): the pools' instances that no node owns terminated,
unhealthy nodes replaced and nodes with an EC2 scheduled event drained (replacement.py), nodes of an
older definition of their pool drained out after their jobs (outdated.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ec2 import (
    LIVE_STATES,
    TAG_NODE,
    TAG_POOL,
    TERMINABLE_STATES,
    Ec2Nodes,
    ErrorTypes,
    describe_label,
    launch_time,
    tag_value,
)
from .exit_codes import EXIT_FAILED, EXIT_OK
from .holds import apply_holds, hold_reason, note_nodes_up, read_holds, record_boot_failures
from .logs import LOG
from .outdated import drain_outdated, outdated_instances
from .replacement import (
    boot_failures,
    drain_for_events,
    ended_during_boot,
    find_unhealthy,
    replace_unhealthy,
    scheduled_events,
)
from .settings import Settings
from .slurm import GOING_UP, POWERED_OFF, NodeInfo, Slurm
from .state import number, read_state, write_state


@dataclass(frozen=True)
class Orphan:
    instance_id: str
    node: str
    why: str


def reconcile(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, now: float | None = None) -> int:
    """Terminate the pools' instances no node owns; replace unhealthy nodes (replacement.py).

    EC2 is read before Slurm: every instance listed existed when Slurm's view was taken.
    """
    try:
        instances = ec2.fleet_instances(TERMINABLE_STATES)
    except ErrorTypes as err:
        LOG.error("reconcile: cannot list the instances of stack %s: %s", settings.stack, err)
        return EXIT_FAILED
    nodes = slurm.nodes()
    if nodes is None:
        LOG.error("reconcile: without Slurm's node list nothing is terminated")
        return EXIT_FAILED
    now = time.time() if now is None else now
    since, saved = track_powered_down(settings.state_dir / "reconcile.json", nodes, now)
    events = scheduled_events(ec2, instances)
    unhealthy = find_unhealthy(settings, nodes, instances, ended_during_boot(settings, ec2, nodes, instances))
    replaced = {entry.node for entry in unhealthy}
    replace_ok = replace_unhealthy(ec2, slurm, unhealthy, instances)
    refused = boot_failures(settings, unhealthy)
    if refused:
        record_boot_failures(settings, refused, now)
    rest = [i for i in instances if tag_value(i, TAG_NODE) not in replaced]
    drained = events is not None and drain_for_events(slurm, nodes, rest, events)
    outdated = outdated_instances(settings, ec2, rest)
    updated = outdated is not None and drain_outdated(slurm, nodes, rest, outdated)
    noted = note_nodes_up(settings, nodes, now)
    held = apply_holds(settings, slurm, nodes, now)
    report_unconfigured(settings, instances)
    orphans = find_orphans(rest, nodes, since, now, settings.orphan_grace_s)
    terminated = terminate_orphans(ec2, orphans)
    LOG.info(
        "reconcile: %d instances of stack %s, %d orphans, %d nodes replaced",
        len(instances),
        settings.stack,
        len(orphans),
        len(replaced),
    )
    holds = read_holds(settings)
    for pool in sorted(settings.pools):
        reason = hold_reason(holds, pool, now)
        if reason:
            LOG.warning("reconcile: pool %s is held: %s", pool, reason)
    ok = saved and replace_ok and drained and updated and noted and held and terminated
    return EXIT_OK if ok else EXIT_FAILED


def report_unconfigured(settings: Settings, instances: list[dict[str, Any]]) -> None:
    """Instances of a pool the configuration does not have (removed or renamed) are judged as the
    others: they go once Slurm no longer knows their node (slurm.conf without the pool), after the
    grace. Not at once: with two controllers, one may still run an older configuration than the
    slurm.conf of the active slurmctld, and a new pool's nodes are not its orphans."""
    unconfigured = sorted({str(tag_value(i, TAG_POOL)) for i in instances} - set(settings.pools))
    if unconfigured:
        LOG.warning(
            "reconcile: instances of pools %s, which are not configured (pools: %s): terminated once Slurm "
            "no longer knows their nodes",
            ",".join(unconfigured),
            ",".join(sorted(settings.pools)),
        )


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
