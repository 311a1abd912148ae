"""teardown (an operator, before ``pulumi destroy``): every instance of the stack's pools terminated."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .ec2 import (
    FLEET_STOPPED,
    NOT_TERMINATED_STATES,
    TAG_FLEET,
    TERMINABLE_STATES,
    Ec2Nodes,
    ErrorTypes,
    describe_label,
)
from .exit_codes import EXIT_FAILED, EXIT_OK
from .logs import LOG
from .settings import Settings


def teardown(
    settings: Settings,
    ec2: Ec2Nodes,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Stop the fleet (its launch templates tagged, ec2.py TAG_FLEET: the controllers launch nothing
    more), then terminate every instance Slurm launched for the stack (configured pools or not) and wait
    until none is left in any state but terminated (bounded). Without the stop, a controller still
    running resumes a pending job's nodes again while they are terminated, or once they are gone."""
    try:
        stopped = ec2.stop_fleet()
    except ErrorTypes as err:
        LOG.error("teardown: cannot stop the fleet (tag its launch templates %s=%s): %s", TAG_FLEET,
                  FLEET_STOPPED, err)  # fmt: skip
        return EXIT_FAILED
    LOG.warning(
        "teardown: fleet of stack %s stopped (%s=%s on %s): the controllers launch nothing more",
        settings.stack, TAG_FLEET, FLEET_STOPPED, ", ".join(stopped) or "no launch template",
    )  # fmt: skip
    LOG.warning("teardown: terminating every instance Slurm launched for stack %s", settings.stack)
    deadline = clock() + timeout_s
    while True:
        left = teardown_round(ec2)
        if left == []:
            LOG.info("teardown: no instance of stack %s is left", settings.stack)
            return EXIT_OK
        if clock() >= deadline:
            report_left(left, timeout_s)
            return EXIT_FAILED
        sleep(poll_s)


def teardown_round(ec2: Ec2Nodes) -> list[dict[str, Any]] | None:
    """The instances not yet terminated (those not shutting down asked to terminate), or None."""
    try:
        left = ec2.fleet_instances(NOT_TERMINATED_STATES)
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
