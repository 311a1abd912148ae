"""`gpuplat down` on an aws Slurm stack: the training instances Slurm launched are no Pulumi resources,
so the fleet is stopped (the controllers launch nothing more), its instances are terminated until none
is left in any state but terminated, and only then is the stack destroyed (ParallelCluster stops and
deletes its compute fleet before the cluster's stack).

The work is the node program's own teardown (roles/slurm_elastic/files/gpuplat_ec2_nodes/teardown.py,
the instances found by the stack's tags alone), run here with the operator's AWS credentials.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from infra.errors import GpuPlatError
from infra.platform.resolve import ResolvedPlatform
from infra.spec.load import PROJECT_ROOT

NODE_PROGRAM_DIR = PROJECT_ROOT / "roles" / "slurm_elastic" / "files"
FLEET_TIMEOUT_S = 900.0
FLEET_POLL_S = 10.0

Line = Callable[[str], None]


def has_slurm_fleet(platform: ResolvedPlatform) -> bool:
    """Slurm launches the training instances (power saving) on aws stacks scheduled by Slurm."""
    return platform.spec.backend == "aws" and platform.spec.scheduler.kind == "slurm"


def configure_limit(platform: ResolvedPlatform) -> list[str] | None:
    """The hosts `gpuplat up`'s configure phase runs site.yml on: on an aws Slurm stack every running
    instance but Slurm's training nodes (the inventory's slurm_compute). Configured again under a
    running job (slurmd, drivers, the node software restarted), a job would fail; a node boots its
    pool's bundle instead, and one of an older bundle is drained out after its jobs by the controllers
    (roles/slurm_elastic/files/gpuplat_ec2_nodes/outdated.py: ParallelCluster's QueueUpdateStrategy
    DRAIN). None: every host."""
    return ["all", "!slurm_compute"] if has_slurm_fleet(platform) else None


class _ToLines(logging.Handler):
    def __init__(self, on_line: Line) -> None:
        super().__init__(logging.INFO)
        self.on_line = on_line

    def emit(self, record: logging.LogRecord) -> None:
        self.on_line(record.getMessage())


def _node_program() -> None:
    """The node program's package importable (it is shipped to the controllers, not installed here)."""
    if str(NODE_PROGRAM_DIR) not in sys.path:
        sys.path.append(str(NODE_PROGRAM_DIR))


def start_fleet(platform: ResolvedPlatform) -> str:
    """`gpuplat up` on an aws Slurm stack, once `pulumi up` is done: the fleet's stop removed from the
    stack's training launch templates. A `gpuplat down` that failed or was interrupted after it stopped
    the fleet leaves the tag, which `pulumi up` keeps (the tag is not in the program, and Pulumi diffs
    against its state), so the controllers would never launch a node again (resume.py fleet_stopped,
    and IAM's NOT_STOPPED). A GpuPlatError when EC2 refuses."""
    if not has_slurm_fleet(platform):
        return "no Slurm fleet"
    _node_program()
    from gpuplat_ec2_nodes.ec2 import FLEET_STOPPED, TAG_FLEET, ErrorTypes, ec2_nodes

    try:
        templates = ec2_nodes(platform.spec.region or "", None, platform.name).start_fleet()
    except ErrorTypes as err:
        raise GpuPlatError(
            f"stack {platform.name}: the stack is up, but the tag {TAG_FLEET}={FLEET_STOPPED} (left by a "
            f"`gpuplat down` that did not finish) could not be removed from its training launch templates "
            f"({err}), so Slurm may launch no training node. Give this shell AWS credentials that may "
            "ec2:DeleteTags on the stack's launch templates, then run `gpuplat up` again."
        ) from err
    return f"fleet started ({TAG_FLEET}={FLEET_STOPPED} removed from {len(templates)} launch template(s))"


def teardown_fleet(platform: ResolvedPlatform, on_line: Line) -> None:
    """Terminate every instance Slurm launched for the stack and wait until none is left (FLEET_TIMEOUT_S);
    a GpuPlatError naming what to do when some are still there (they are listed through on_line)."""
    timeout_s = FLEET_TIMEOUT_S
    _node_program()
    from gpuplat_ec2_nodes.ec2 import FLEET_STOPPED, NOT_TERMINATED_STATES, TAG_FLEET, ErrorTypes, ec2_nodes
    from gpuplat_ec2_nodes.logs import LOG
    from gpuplat_ec2_nodes.settings import Settings
    from gpuplat_ec2_nodes.teardown import teardown

    region = platform.spec.region or ""
    settings = Settings(stack=platform.name, region=region, scontrol="", pools={})
    handler = _ToLines(on_line)
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    try:
        ec2: Any = ec2_nodes(region, None, platform.name)
        try:
            ec2.fleet_instances(NOT_TERMINATED_STATES)
        except ErrorTypes as err:  # no credentials, no region, access denied: no use waiting
            raise GpuPlatError(
                f"stack {platform.name}: cannot list the instances Slurm launched ({err}), so nothing was "
                "destroyed. Give this shell AWS credentials that may describe and terminate the stack's "
                "instances (AWS_PROFILE or AWS_* variables) and the stack's region, then run `gpuplat down` "
                "again."
            ) from err
        status = teardown(settings, ec2, timeout_s, FLEET_POLL_S)
    finally:
        LOG.removeHandler(handler)
    if status != 0:
        raise GpuPlatError(
            f"stack {platform.name}: the fleet's teardown did not finish (the lines above: its launch "
            f"templates could not be tagged {TAG_FLEET}={FLEET_STOPPED}, so the controllers could launch "
            f"again, or instances Slurm launched are still there after {timeout_s:.0f} s), so nothing was "
            "destroyed: `pulumi destroy` would stop on the subnets and security groups they hold while "
            "they keep billing. Find why (termination protection, an IAM denial of ec2:CreateTags or "
            "ec2:TerminateInstances, an unreachable EC2 endpoint), then run `gpuplat down` again."
        )


def destroy_with_fleet(platform: ResolvedPlatform, destroy: Callable[[], str], on_line: Line) -> str:
    """The fleet's teardown, then `destroy`. slurmctld runs until the destroy takes the controllers, and
    may launch a node meanwhile, which then holds the network and fails the destroy: once the
    controllers are gone nothing launches, so the fleet's teardown and the destroy are run once more."""
    if not has_slurm_fleet(platform):
        return destroy()
    teardown_fleet(platform, on_line)
    try:
        return destroy()
    except Exception as first:  # the Automation API's CommandError, whatever failed in the destroy
        on_line(f"pulumi destroy failed ({type(first).__name__}); tearing the Slurm fleet down again")
        teardown_fleet(platform, on_line)
        return destroy()
