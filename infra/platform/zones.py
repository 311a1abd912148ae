"""Where an aws stack's pools and its parallel filesystem live: availability zones, decided once.

A training pool sits in one zone (EFA traffic and cluster placement groups stay within one): its `zone`
(required with a reservation or Capacity Block, which exist in one zone), else the stack's first zone.
Other pools spread over every zone unless pinned. FSx for Lustre lives in one zone: every Lustre
deployment type takes exactly one subnet and "the file server is launched in that subnet's
Availability Zone" (FSx API Reference, CreateFileSystem, `SubnetIds`). So it goes where the training
GPUs are, or every read and checkpoint crosses zones (added latency on every Lustre RPC, and traffic
between zones is billed, unlike traffic within one). When
training pools sit in different zones no single zone serves them all: the filesystem goes to the zone
with the most training GPUs, and the policy rule `placement-filesystem-zone` says so at plan time.

Pure functions of the resolved platform (no Pulumi): the AWS backend, the EKS node groups and the
policy rules read the same answer.
"""

from __future__ import annotations

from infra.platform.resolve import ResolvedPlatform, ResolvedPool


def pool_zones(platform: ResolvedPlatform, pool: ResolvedPool) -> list[str]:
    """A pool's zone or zones, else the first zone for training (EFA and cluster placement stay within
    one zone), else every zone."""
    zones = list(platform.spec.zones)
    if pool.spec.zone:
        return [pool.spec.zone]
    if pool.spec.zones:
        return list(dict.fromkeys(pool.spec.zones))
    return zones[:1] if pool.role == "train" else zones


def training_zones(platform: ResolvedPlatform) -> dict[str, str]:
    """Training pool -> the one zone it launches in."""
    return {pool.name: pool_zones(platform, pool)[0] for pool in platform.pools_with_role("train")}


def filesystem_zone(platform: ResolvedPlatform) -> str:
    """The zone of the parallel filesystem: that of the training pools; where they differ, the zone with
    the most training GPUs at full size (ties: the stack's zone order); without training pools, the
    stack's first zone."""
    zones = list(platform.spec.zones)
    gpus: dict[str, int] = {}
    for pool in platform.pools_with_role("train"):
        zone = pool_zones(platform, pool)[0]
        gpus[zone] = gpus.get(zone, 0) + pool.max_gpus
    if not gpus:
        return zones[0]
    return max(gpus, key=lambda zone: (gpus[zone], -zones.index(zone) if zone in zones else -len(zones)))
