"""suspend (Slurm's SuspendProgram): terminate the instances of the node names; hold the names of a
held pool (holds.hold_powering_down)."""

from __future__ import annotations

import time

from .ec2 import Ec2Nodes, terminate_named
from .exit_codes import EXIT_FAILED
from .holds import hold_powering_down
from .settings import Settings, group_by_pool, report_unknown
from .slurm import Slurm


def suspend(
    settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str], now: float | None = None
) -> int:
    """Terminate every instance of these node names (a name without one is fine), then set the names of
    a held pool DOWN with the hold as reason, so that none is allocatable again at SuspendTimeout."""
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, "suspend")
    terminated = not known or terminate_named(ec2, known, "suspend")
    held = hold_powering_down(settings, slurm, known, time.time() if now is None else now)
    if not (terminated and held):
        return EXIT_FAILED
    return status
