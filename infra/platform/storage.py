"""Parallel filesystem sizing: aggregate read throughput against what the training GPUs demand.

FSx for Lustre PERSISTENT_2 offers 125, 250, 500 or 1000 MB/s of throughput per TiB of storage and
storage of 1.2 TiB or a multiple of 2.4 TiB (source: AWS FSx for Lustre user guide, "Performance" and
"Managing storage capacity", https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html,
read 2026-11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PERSISTENT_2_MBPS_PER_TIB = (125, 250, 500, 1000)
_STEP_GIB = 2400
# AWS calls its 1200 and 2400 GiB steps "1.2 TiB" and "2.4 TiB"; a spec's capacity_tib reads the same way.
_NOMINAL_GIB_PER_TIB = 1000


@dataclass(frozen=True)
class LustreLayout:
    capacity_gib: int
    per_unit_mbps: int
    aggregate_gbps: float
    demand_gbps: float

    @property
    def meets_demand(self) -> bool:
        return self.aggregate_gbps + 1e-9 >= self.demand_gbps


def _round_capacity(gib: float) -> int:
    if gib <= 1200:
        return 1200
    return math.ceil(gib / _STEP_GIB) * _STEP_GIB


def aggregate_gbps(capacity_gib: int, per_unit_mbps: int) -> float:
    return capacity_gib / 1024 * per_unit_mbps / 1000


def fsx_lustre_layout(capacity_tib: float, demand_gbps: float) -> LustreLayout:
    """Cheapest layout: the smallest per-unit throughput that meets demand at the asked capacity;
    if even 1000 MB/s/TiB does not, the capacity grows until it does."""
    capacity = _round_capacity(capacity_tib * _NOMINAL_GIB_PER_TIB)
    for per_unit in PERSISTENT_2_MBPS_PER_TIB:
        if aggregate_gbps(capacity, per_unit) >= demand_gbps:
            return LustreLayout(capacity, per_unit, aggregate_gbps(capacity, per_unit), demand_gbps)
    top = PERSISTENT_2_MBPS_PER_TIB[-1]
    capacity = _round_capacity(demand_gbps * 1000 / top * 1024)
    return LustreLayout(capacity, top, aggregate_gbps(capacity, top), demand_gbps)
