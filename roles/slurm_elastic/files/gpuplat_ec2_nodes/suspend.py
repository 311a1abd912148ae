"""suspend (Slurm's SuspendProgram): terminate the instances of the node names."""

from __future__ import annotations

from .ec2 import Ec2Nodes, terminate_named
from .exit_codes import EXIT_FAILED
from .settings import Settings, group_by_pool, report_unknown


def suspend(settings: Settings, ec2: Ec2Nodes, names: list[str]) -> int:
    """Terminate every instance of these node names; a name without one is fine."""
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, "suspend")
    if known and not terminate_named(ec2, known, "suspend"):
        return EXIT_FAILED
    return status
