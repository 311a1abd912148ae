"""Placement rules: the parallel filesystem sits in the zone of the training nodes that read it.

FSx for Lustre serves from the one zone of its subnet (infra/platform/zones.py): a training pool in another
zone sends every read and every checkpoint across zones. The rule reads the declared resources (the file
system's subnet, the training node groups' subnets, each subnet's availabilityZone), so it judges what
the program declared, whoever declared it.
"""

from __future__ import annotations

from collections.abc import Iterator

from infra.policy.rules.base import Finding, PolicyContext
from infra.policy.rules.nodes import NodeGroup, node_groups
from infra.policy.rules.resource_types import LUSTRE, SUBNET
from infra.policy.view import UNKNOWN, ResourceIndex, ResourceView


def _zones(subnets: list[ResourceView]) -> set[str]:
    zones = {str(s.props.get("availabilityZone") or "") for s in subnets}
    return {z for z in zones if z and z != UNKNOWN}


def _listing(groups: dict[str, set[str]]) -> str:
    return ", ".join(f"{pool} in {'/'.join(sorted(zones))}" for pool, zones in sorted(groups.items()))


def check_filesystem_zone(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    """Every training node group launches in the zone of the FSx for Lustre file system."""
    training: dict[str, tuple[NodeGroup, set[str]]] = {}
    for group in node_groups(index, ctx):
        if group.role == "train":
            zones = _zones(group.subnets)
            if zones:
                training[group.pool or group.anchor.name] = (group, zones)
    if not training:
        return
    spread = len({zone for _, zones in training.values() for zone in zones}) > 1
    for filesystem in index.of_type(LUSTRE):
        fs_zones = _zones(index.referenced(filesystem, "subnetIds", type_=SUBNET))
        if len(fs_zones) != 1:
            continue
        (fs_zone,) = fs_zones
        for pool, (group, zones) in sorted(training.items()):
            if zones == {fs_zone}:
                continue
            message = (
                f"training pool {pool} launches in {'/'.join(sorted(zones))} but the file system "
                f"{filesystem.name} serves from {fs_zone}: every read and checkpoint of its jobs crosses "
                "zones (latency on each Lustre RPC, inter-zone transfer billed)"
            )
            if spread:
                others = {p: z for p, (_, z) in training.items()}
                message += (
                    f"; the training pools sit in different zones ({_listing(others)}) and one "
                    "file system serves one zone"
                )
            yield Finding(group.anchor.name, message, group.anchor.urn or None)
